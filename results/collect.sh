#!/usr/bin/env bash
# Copies finished or partial runs into results/<STUDY>/<dataset>/<method>[+<forgetting>][+<compressor>@<rate>][+plain][+reference]/
# (+plain, +reference: the prompt and formation where they are not the defaults chat and shared_sink)
# and rebuilds results/README.md (tables, figures) from everything under results/.
# Usage: results/collect.sh RUNS_DIR STUDY   e.g. results/collect.sh outputs/accuracy retention
set -euo pipefail
runs=$1; study=$2
find "$runs" -name predictions.jsonl -not -path "*/merged/*" | while read -r predictions; do
  run=$(dirname "$predictions")
  where=$(python -c "
from omegaconf import OmegaConf as O
c = O.load('$run/config.yaml'); f = c.forgetting.label; z = c.get('compression', {'label': 'none'})
print(c.task.dataset + '/' + c.method.label + ('' if f == 'unbounded' else '+' + f)
      + ('' if z.label == 'none' else f'+{z.label}@{z.rate:g}')
      + ('' if c.prompt == 'chat' else '+' + c.prompt) + ('' if c.formation == 'shared_sink' else '+' + c.formation))")
  mkdir -p "results/$study/$where"
  for file in config.yaml predictions.jsonl groups.jsonl metrics.csv run.json; do
    if [ -f "$run/$file" ]; then cp "$run/$file" "results/$study/$where/"; fi
  done
done
memdefrag report results
