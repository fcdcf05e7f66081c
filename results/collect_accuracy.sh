#!/usr/bin/env bash
# Copies the runs of results/run_accuracy.sh into results/retention/<dataset>/<method>/ and rebuilds
# results/README.md (tables, figures) from them. Usage: results/collect_accuracy.sh [RUNS_DIR (default outputs/accuracy)]
set -euo pipefail
runs=${1:-outputs/accuracy}
find "$runs" -name predictions.jsonl | while read -r predictions; do
  run=$(dirname "$predictions")
  where=$(python -c "from omegaconf import OmegaConf as O; c = O.load('$run/config.yaml'); print(c.task.dataset + '/' + c.method.label)")
  mkdir -p "results/retention/$where"
  cp "$run"/{config.yaml,predictions.jsonl,groups.jsonl,metrics.csv,run.json} "results/retention/$where/" 2>/dev/null || \
    cp "$run"/{config.yaml,predictions.jsonl} "results/retention/$where/"      # an unfinished run
done
memdefrag report results
