#!/usr/bin/env bash
# The GPU figures on one GPU with random weights of Llama-3.1-8B's shape (speed and memory only, never accuracy),
# in parts, run in the order given (default: every part, in the order of PARTS below), so that a short device lease
# runs the parts it has time for; each part's start is printed with the time, so a run says what each took, and
# with the processes then computing on the GPU:
#   selfcheck   the self-check's verdicts on the 8B shape (fp32, bf16, fp16)
#   speed       the per-question speed tables in bf16 and fp16, each beside transformers' generate(
#               cache_implementation="static") on the same tokens (the anchor)
#   decode      at N_max for none, vanilla and Top-2 (issue 56: per token <= 1.5x the floor and <= the anchor),
#               each way of decoding in DECODES (default: captured compiled eager; one that fails is a line, the
#               others stand), each with its kernels ranked
#   peers       the peers' time to first token at N_max (tab:peers)
#   runtime     the paper's tab:runtime (a 50-update group, vanilla, Top-1 and Top-2, informativeness forgetting,
#               asked at 10..50) through the harness on a saved random checkpoint
#   gpu_memory  tab:gpu-memory (step 50, memory full at N_max: none, vanilla and Top-2)
#   variants    Top-2 in each table the other way: tab:runtime with solo formation, tab:gpu-memory on the paper's
#               own formulation (backend=hidden_prefix) and with batched formation
#   memoryllm   MemoryLLM and M+ of the same size (random checkpoints of memoryllm-8b's and mplus-8b's shapes) over
#               a 50-update group each, for their columns of tab:runtime
#   report      memdefrag report results
# Usage (docs/gpu.md): MEMDEFRAG_DATA=<folder with nqa/ and squad/> CKPT=<folder on a disk with 20 GB free>
# results/run_gpu.sh [PART...]; an unknown part is refused before anything runs. Env: OUT (default results/gpu);
# CKPT, where the random checkpoints are written (default /tmp/memdefrag-checkpoints), each right before its runs
# and removed after them unless KEEP_CHECKPOINTS=1 (one on the disk at a time, 16-20 GB; a folder that already
# holds one is used and kept); METHODS, the methods runtime and gpu_memory run (default: each table's rows; a
# short lease gives memdefrag_top2, the one issue 56 measures); DATASETS, those runtime runs on (default: the
# experiment's, NaturalQA and SQuAD; a short lease gives nqa); RUNTIME_DECODE, runtime's way of decoding (default
# CUDA's, captured; `decode`'s tables, whose ways are DECODES, say which is faster); TOKENIZER (default
# $GPU_TOKENIZER, which .gpu/enter.sh sets), a tokenizer folder for the random shapes where the embedded SmolLM2 is
# not installed; PYTHON (default python3).
set -euo pipefail
PARTS=(selfcheck speed decode peers runtime gpu_memory variants memoryllm report)
parts=("$@"); [ $# -gt 0 ] || parts=("${PARTS[@]}")
for part in "${parts[@]}"; do
  known=0; for name in "${PARTS[@]}"; do [ "$part" = "$name" ] && known=1; done
  [ "$known" = 1 ] || { echo "run_gpu.sh: no part '$part'; the parts: ${PARTS[*]}" >&2; exit 2; }
done
out=${OUT:-results/gpu}; ckpt=${CKPT:-/tmp/memdefrag-checkpoints}; py=${PYTHON:-python3}
export MEMDEFRAG_DATA=${MEMDEFRAG_DATA:-../shared/data}
data=$MEMDEFRAG_DATA
tokenizer=${TOKENIZER:-${GPU_TOKENIZER:-}}
tok=(); [ -z "$tokenizer" ] || tok=(--tokenizer "$tokenizer")
mkdir -p "$out" "$ckpt"
"$py" - "$ckpt" <<'PY'
import shutil, sys
from harness.measurement.benchmark import checkpoint_bytes
sizes = {shape: checkpoint_bytes(shape, "bfloat16") / 1e9 for shape in ("llama31_8b", "memoryllm_8b", "mplus_8b")}
print(f"random checkpoints under {sys.argv[1]}, one at a time: " + ", ".join(f"{s} {gb:.3g} GB" for s, gb in
      sizes.items()) + f"; {shutil.disk_usage(sys.argv[1]).free / 1e9:.3g} GB free there", flush=True)
PY
checkpoint() {   # shape folder: a random checkpoint of the shape saved there, unless the folder holds one already
  [ -d "$2" ] && return
  memdefrag-bench --device cuda --dtype bfloat16 --shape "$1" --save-random "$2" "${tok[@]}"
  written+=("$2")
}
release() {      # the checkpoints this script wrote, removed unless KEEP_CHECKPOINTS=1
  [ "${KEEP_CHECKPOINTS:-0}" = 1 ] || rm -rf "${written[@]}"
  written=()
}
written=()
selfcheck() {    # the self-check's verdicts on the 8B shape
  local dtype
  for dtype in float32 bfloat16 float16; do
    "$py" -m harness.models.selfcheck --shape llama31_8b --device cuda --dtype "$dtype" "${tok[@]}" \
      --out "$out/selfcheck_$dtype.md"
  done
}
speed() {        # the per-question speed tables, each beside the anchor
  local dtype
  for dtype in bfloat16 float16; do
    memdefrag-bench --device cuda --dtype "$dtype" --shape llama31_8b --sizes 10 26 --repeats 3 "${tok[@]}" \
      --data-dir "$data" --out "$out/speed_gpu_$dtype.md"
  done
}
decode() {       # none, vanilla and Top-2 at N_max, each way of decoding in DECODES, its kernels ranked beside
  local variant
  for variant in ${DECODES:-captured compiled eager}; do
    memdefrag-bench --device cuda --dtype bfloat16 --shape llama31_8b --sizes 26 --repeats 3 --methods none \
      vanilla memdefrag --k 2 --decode "$variant" "${tok[@]}" --data-dir "$data" \
      --out "$out/decode_${variant}_bfloat16.md" --profile "$out/kernels_${variant}_bfloat16.md" ||
      echo "run_gpu.sh: decode=$variant failed; the other tables stand" >&2
  done
}
peers() {        # tab:peers at the paper's N_max (26 NaturalQA fragments): full prefill, vanilla, MemDefrag, the peers
  memdefrag-bench --device cuda --dtype bfloat16 --shape llama31_8b --sizes 26 --repeats 3 --data-dir "$data" \
    "${tok[@]}" --methods none text vanilla memdefrag ape epic cacheblend --out "$out/peers_speed_gpu_bfloat16.md"
}
model="model=hf model.source=$ckpt/llama31_8b model.name=llama31_8b_random model.dtype=bfloat16
       model.tracer_layer=13 model.query_mode=last model.memory_capacity=12800"
runtime() {      # tab:runtime
  checkpoint llama31_8b "$ckpt/llama31_8b"
  # experiment=runtime sets reuse_formed=false, so each group forms (and is charged) every fragment it reads,
  # whatever job ran before it; decode=captured (CUDA's default); one process per job (hydra/launcher=local), so
  # that each pays its own warm-up (in one process the first job paid the process's: results/gpu/README.md), one
  # job at a time on the GPU this script sees (the launcher's defaults: docs/slurm.md)
  # shellcheck disable=SC2086
  memdefrag experiment=runtime $model task.groups=2 method="${METHODS:-vanilla,memdefrag_top1,memdefrag_top2}" \
    ${DATASETS:+task.dataset=$DATASETS} ${RUNTIME_DECODE:+decode=$RUNTIME_DECODE} hydra/launcher=local \
    task.data_dir="$data" logger=none hydra.sweep.dir="$out/runtime"
}
gpu_memory() {   # tab:gpu-memory
  checkpoint llama31_8b "$ckpt/llama31_8b"
  # shellcheck disable=SC2086
  memdefrag experiment=gpu_memory $model ${METHODS:+method=$METHODS} task.data_dir="$data" logger=none \
    hydra.sweep.dir="$out/gpu_memory"
}
variants() {     # Top-2 the other way in each table
  checkpoint llama31_8b "$ckpt/llama31_8b"
  # the other formation (runtime batched, CUDA's default; solo here): Top-2's group time each way
  # shellcheck disable=SC2086
  memdefrag experiment=runtime $model task.groups=2 method=memdefrag_top2 formation_batch=solo \
    task.data_dir="$data" logger=none hydra.sweep.dir="$out/runtime_solo"
  # shellcheck disable=SC2086
  memdefrag experiment=gpu_memory $model task.data_dir="$data" logger=none backend=hidden_prefix \
    method=memdefrag_top2 hydra.sweep.dir="$out/gpu_memory_hidden_prefix"
  # gpu_memory forms solo (its own); batched beside it (docs/gpu.md: at N_max the formula gives 20.3 GB batched,
  # 18.6 GB solo)
  # shellcheck disable=SC2086
  memdefrag experiment=gpu_memory $model task.data_dir="$data" logger=none method=memdefrag_top2 \
    formation_batch=batched hydra.sweep.dir="$out/gpu_memory_batched"
}
memoryllm() {    # MemoryLLM's and M+'s columns of tab:runtime, each on a random checkpoint of its own shape
  release
  # allow_beyond_window=true as experiment=memoryllm_comparison: MemoryLLM-8B reads its pool of 12,800 slots past
  # the 8,192 positions of its shape (M+'s 131,072 hold its 12,800)
  local kind
  for kind in memoryllm mplus; do
    checkpoint "${kind}_8b" "$ckpt/${kind}_8b"
    memdefrag experiment=runtime model=hf model.source="$ckpt/${kind}_8b" model.name="${kind}_8b_random" \
      model.dtype=bfloat16 model.tracer_layer=13 model.query_mode=last backend=hidden_prefix forgetting=none \
      task.shuffle=false task.groups=2 method="$kind" allow_beyond_window=true task.data_dir="$data" logger=none \
      hydra.sweep.dir="$out/runtime_$kind"
    release
  done
}
report() {
  memdefrag report results
}
on_the_gpu() {   # what computes on the GPU (a job an earlier part left would share it): its processes where the
                 # driver lists them (a container may hide them) and the memory in use, or why unknown
  command -v nvidia-smi > /dev/null || { echo "unknown (no nvidia-smi)"; return; }
  local apps used
  apps=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader) &&
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader) || { echo "unknown (nvidia-smi failed)"; return; }
  echo "${apps:+$(paste -sd ';' <<< "$apps"), }memory used $(paste -sd ';' <<< "${used:-unknown}")"
}
trap release EXIT          # the checkpoints this script wrote, whatever part ends it
for part in "${parts[@]}"; do
  echo "run_gpu.sh: $part ($(date +%T); computing on the GPU: $(on_the_gpu))"
  "$part"
done
