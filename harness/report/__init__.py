"""The report and the tools that read, mend and compare result folders: results/README.md and the paper tables
(document.py, sections.py, comparisons.py, claims.py, analysis.py), `memdefrag collect`, `compare` and `migrate`.
Imports results, models (a migrated record's tokens) and plugins; nothing imports it but the command line."""
