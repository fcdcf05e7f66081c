"""Speed and memory: `memdefrag-bench` (benchmark.py) and the peak-memory formula (peak.py). Imports models and
results."""
