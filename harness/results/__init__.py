"""A run's result folder and what is read straight off it: the folder (folder.py: written crash-safe,
resumable), where a command may write (paths.py), a sweep's table (summary.py) and its plots (figures.py).
Imports nothing of the harness but its errors, and no model: a report and a cache need no torch."""
