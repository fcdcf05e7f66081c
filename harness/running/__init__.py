"""Running a study: one job (runner.py), a sweep's jobs checked before any runs (jobs.py), shards and their merge
(shards.py), SLURM (slurm.py), fragments formed once per process (formed.py), the loggers (loggers.py) and the
model families a run supports (families.py). Imports models, results and plugins."""
