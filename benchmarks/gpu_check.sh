#!/usr/bin/env bash
# The GPU checks of one short lease, in one call (about 6 minutes on an H200):
#   1. benchmarks/gpu.py on a Qwen2.5-0.5B shape in bf16-mixed with --profile and its update timed also with
#      4096-position log-prob blocks over 1 GiB chunks of logits (the default: 16 over 64 MiB), and on
#      SmolLM2-135M's shape;
#   2. every family (magrpo, mappo, madpo), decentralized and centralized, 3 steps of the tiny default on the GPU
#      (--cpu: magrpo only);
#   3. determinism: two uninterrupted 6-step runs, and one stopped by SIGTERM after its step-2 checkpoint and
#      resumed, compared weight for weight.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]          # on a CUDA machine; figures as JSON and logs in OUT_DIR
#   bash benchmarks/gpu_check.sh --cpu [OUT_DIR]    # the same steps with tiny models on CPU (checks the script)
#
# Run it from the repository root with textzoo and its dependencies importable by $PYTHON (default python3):
# installed (`pip install -e .`), or on a machine whose image has torch and transformers, the rest as
# wheels and `PYTHONPATH=.:<wheels' folder>` (tyro, pettingzoo, gymnasium and their small dependencies).
#
# Each step has a time limit and the whole run a budget (GPU_CHECK_BUDGET seconds, default 420): a step
# that would start with less than 15 s left is skipped, so a lease ends with the figures of the steps before.
# Exits 1 when a step failed or ran out of time, 0 otherwise.
set -uo pipefail
cpu=0
if [[ "${1:-}" == "--cpu" ]]; then cpu=1; shift; fi
out="${1:-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
python="${PYTHON:-python3}"
work="$(mktemp -d "${TMPDIR:-/tmp}/textzoo-gpu-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
deadline=$(( $(date +%s) + ${GPU_CHECK_BUDGET:-420} ))
failed=0
# on CPU (a check of the script) one family in both collaborations: every process spends ~8 s importing torch
# and transformers, and the families themselves are tested by the test suite
if (( cpu )); then bench=(--tiny --max-new-tokens 8 --batch-prompts 2); steps=2; algos="magrpo"
else bench=(); steps=3; algos="magrpo mappo madpo"; fi

step() {  # step NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    local left=$(( deadline - $(date +%s) ))
    (( left < limit )) && limit=$left
    if (( limit < 15 )); then echo "=== $name: skipped, the budget is spent"; failed=1; return; fi
    echo "=== $name (limit ${limit} s)"
    local start=$(date +%s)
    timeout "$limit" "$@" 2>&1 | grep -vE "Loading weights|Writing model shards|it/s\]$|USDT" | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc in $(( $(date +%s) - start )) s"
    (( rc )) && failed=1
}

train() {  # train RUN_DIR ARGS...: the tiny default on the GPU (on CPU with --cpu)
    local dir=$1; shift
    "$python" -m textzoo.runners.cli train --devices auto --eval-every 0 --eval-prompts 4 --no-progress --no-plot \
        --run-dir "$dir" "$@"
}

families() {
    local runs=() pids=() run i failed=0
    for run in $(for algo in $algos; do echo "$algo-decentralized $algo-centralized"; done); do
        train "$work/$run" --algo "${run%-*}" --collaboration "${run#*-}" --steps "$steps" >"$work/$run.log" 2>&1 &
        runs+=("$run"); pids+=($!)
    done
    for i in "${!runs[@]}"; do
        wait "${pids[$i]}"; local rc=$?; (( rc )) && failed=1
        echo "--- ${runs[$i]/-/ }: exit $rc"
        grep -E "placement|held-out reward, sampled|Error" "$work/${runs[$i]}.log" | tail -3
    done
    return $failed
}

determinism() {
    train "$work/a" --steps 6 --save-every 2 >"$work/a.log" 2>&1 || { tail -20 "$work/a.log"; return 1; }
    train "$work/a2" --steps 6 --save-every 2 >"$work/a2.log" 2>&1 || { tail -20 "$work/a2.log"; return 1; }
    train "$work/b" --steps 6 --save-every 2 >"$work/b.log" 2>&1 &
    local pid=$!
    while [[ ! -d "$work/b/checkpoints/step-00000002" ]] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    kill -TERM "$pid" 2>/dev/null; wait "$pid"
    echo "stopped by SIGTERM with checkpoints: $(ls "$work/b/checkpoints" | tr '\n' ' ')"
    "$python" -m textzoo.runners.cli train --resume "$work/b" --no-progress --no-plot >"$work/b2.log" 2>&1 \
        || { tail -20 "$work/b2.log"; return 1; }
    "$python" - "$work" <<'PY'
import sys
from pathlib import Path

from safetensors.torch import load_file

work = Path(sys.argv[1])
for other, what in (("a2", "a second uninterrupted run"), ("b", "the run stopped and resumed")):
    for path in sorted((work / "a/checkpoints/step-00000006").glob("weights-*.safetensors")):
        a, b = load_file(path), load_file(work / other / path.relative_to(work / "a"))
        gap = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
        same = all(a[k].equal(b[k]) for k in a)
        print(f"{what}: {path.name} {'bit-identical' if same else f'differs, max |diff| {gap:.3g}'}")
PY
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv 2>/dev/null
"$python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
step gpu_qwen "$(( cpu ? 150 : 170 ))" "$python" benchmarks/gpu.py --precision bf16-mixed --agents 1 --profile \
    --logp-blocks 4096:268435456 --out "$out/gpu_qwen.json" "${bench[@]}"
(( cpu )) || step gpu_smollm2 120 "$python" benchmarks/gpu.py --shape smollm2-135m --precision bf16-mixed \
    --agents 1 --out "$out/gpu_smollm2.json"
export -f train families determinism
export python work steps algos
step families 150 bash -c families
step determinism 150 bash -c determinism
exit $failed
