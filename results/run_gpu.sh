#!/usr/bin/env bash
# The GPU figures on one GPU with random weights of Llama-3.1-8B's shape (speed and memory only, never accuracy):
# the per-question speed table in bf16 and fp16, the peers' time to first token at N_max (tab:peers), then the
# paper's tab:runtime (a 50-update group, Top-1 and vanilla, informativeness forgetting, asked at 10..50) and
# tab:gpu-memory (step 50, memory full at N_max)
# through the harness on a saved random checkpoint; then MemoryLLM and M+ of the same size (random checkpoints of
# memoryllm-8b's and mplus-8b's shapes) over a 50-update group each, for their columns of tab:runtime.
# The self-check's verdicts on the 8B shape come first (fp32, bf16, fp16), and tab:gpu-memory also runs Top-2 on the
# paper's own formulation (backend=hidden_prefix) at N_max.
# Usage: MEMDEFRAG_DATA=<folder with nqa/ and squad/> results/run_gpu.sh   (env OUT, default results/gpu;
# CKPT, default /tmp/llama31_8b_random; TOKENIZER, a tokenizer folder for the random shapes where the embedded
# SmolLM2 is not installed). On an offline GPU node: see the README's "On a GPU node without network".
set -euo pipefail
out=${OUT:-results/gpu}; ckpt=${CKPT:-/tmp/llama31_8b_random}; data=${MEMDEFRAG_DATA:-../shared/data}
tok=(); [ -z "${TOKENIZER:-}" ] || tok=(--tokenizer "$TOKENIZER")
mkdir -p "$out"
for dtype in float32 bfloat16 float16; do
  python -m harness.selfcheck --shape llama31_8b --device cuda --dtype "$dtype" "${tok[@]}" \
    --out "$out/selfcheck_$dtype.md"
done
for dtype in bfloat16 float16; do
  memdefrag-bench --device cuda --dtype "$dtype" --shape llama31_8b --sizes 10 26 --repeats 3 "${tok[@]}" \
    --data-dir "$data" --out "$out/speed_gpu_$dtype.md"
done
# tab:peers at the paper's N_max (26 NaturalQA fragments): full prefill, vanilla, MemDefrag and the peers, bf16
memdefrag-bench --device cuda --dtype bfloat16 --shape llama31_8b --sizes 26 --repeats 3 --data-dir "$data" \
  "${tok[@]}" --methods none text vanilla memdefrag ape epic cacheblend --out "$out/peers_speed_gpu_bfloat16.md"
[ -d "$ckpt" ] || memdefrag-bench --device cuda --dtype bfloat16 --shape llama31_8b --save-random "$ckpt" "${tok[@]}"
model="model=hf model.source=$ckpt model.name=llama31_8b_random model.dtype=bfloat16 model.tracer_layer=13
       model.query_mode=last model.memory_capacity=12800"
# shellcheck disable=SC2086
memdefrag experiment=runtime $model task.groups=2 method=vanilla,memdefrag_top1,memdefrag_top2 \
  task.data_dir="$data" logger=none hydra.sweep.dir="$out/runtime"
# shellcheck disable=SC2086
memdefrag experiment=gpu_memory $model task.data_dir="$data" logger=none hydra.sweep.dir="$out/gpu_memory"
# shellcheck disable=SC2086
memdefrag experiment=gpu_memory $model task.data_dir="$data" logger=none backend=hidden_prefix \
  method=memdefrag_top2 hydra.sweep.dir="$out/gpu_memory_hidden_prefix"
for kind in memoryllm mplus; do
  [ -d "${ckpt}_$kind" ] || memdefrag-bench --device cuda --dtype bfloat16 --shape "${kind}_8b" \
    --save-random "${ckpt}_$kind" "${tok[@]}"
  memdefrag experiment=runtime model=hf model.source="${ckpt}_$kind" model.name="${kind}_8b_random" model.dtype=bfloat16 \
    model.tracer_layer=13 model.query_mode=last backend=hidden_prefix forgetting=none task.shuffle=false \
    task.groups=2 method="$kind" task.data_dir="$data" logger=none hydra.sweep.dir="$out/runtime_$kind"
done
memdefrag report results
