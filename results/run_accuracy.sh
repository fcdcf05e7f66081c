#!/usr/bin/env bash
# Regenerates the accuracy tables in results/ (default model, CPU). Usage: results/run_accuracy.sh DATASET GROUPS [THREADS]
# Step 1 is asked of vanilla and none only: with one stored fragment, Top-K and text memory are the
# same computation as vanilla (tests/test_methods.py::test_single_fragment_methods_agree), and none
# does not depend on the step.
set -euo pipefail
dataset=$1; groups=$2; threads=${3:-1}
out=outputs/accuracy/$dataset
common="task.dataset=$dataset task.groups=$groups task.updates=20 threads=$threads logger=none"
memdefrag -m $common method=vanilla 'task.eval_steps=[1,5,10,20]' hydra.sweep.dir=$out/vanilla
memdefrag -m $common method=memdefrag_top1,memdefrag_top2,text 'task.eval_steps=[5,10,20]' hydra.sweep.dir=$out/others
memdefrag -m $common method=none 'task.eval_steps=[1]' hydra.sweep.dir=$out/none
