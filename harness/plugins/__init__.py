"""What the harness asks of a plugin: its contracts (contracts.py: a config built into a checked method, task,
forgetting or compressor) and the table of every shipped config (catalog.py). The lowest layer: methods/ and evals/
below it, nothing of the harness above it."""
