#!/usr/bin/env bash
# Regenerates the accuracy tables in results/ (CPU).
# Usage: results/run_accuracy.sh DATASET GROUPS [METHOD...]   (default: all five methods; env THREADS, default 1,
# and MODEL, default smollm2)
# Step 1 is asked of vanilla and none only: with one stored fragment, Top-K and text memory are the
# same computation as vanilla (tests/test_methods.py::test_single_fragment_methods_agree), and none
# does not depend on the step.
set -euo pipefail
dataset=$1; groups=$2; shift 2
methods=${*:-vanilla memdefrag_top1 memdefrag_top2 text none}
model=${MODEL:-smollm2}
common="model=$model task.dataset=$dataset task.groups=$groups task.updates=20 threads=${THREADS:-1} logger=none"
for method in $methods; do
  case $method in
    vanilla) steps='[1,5,10,20]' ;;
    none) steps='[1]' ;;
    *) steps='[5,10,20]' ;;
  esac
  memdefrag $common method=$method "task.eval_steps=$steps" hydra.run.dir=outputs/accuracy/$model/$dataset/$method
done
