#!/usr/bin/env bash
# The forgetting study on the default model (CPU): App. E.1 ablation and the Table-2 comparison,
# 20 groups, 50 updates, asked at steps 10..50. Usage: results/run_forgetting.sh DATASET
# (run nqa and squad in two shells to use two cores; THREADS env, default 1).
set -euo pipefail
dataset=$1
common="task.dataset=$dataset threads=${THREADS:-1} logger=none"
memdefrag experiment=forgetting_ablation $common hydra.sweep.dir=outputs/forgetting/$dataset/ablation
memdefrag experiment=retention_comparison $common hydra.sweep.dir=outputs/forgetting/$dataset/comparison
# Runtime per step of one 50-update group, asked after every update.
memdefrag method=memdefrag_top2 forgetting=informativeness task.groups=1 task.updates=50 $common \
  hydra.run.dir=outputs/forgetting/$dataset/runtime
