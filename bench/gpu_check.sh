#!/usr/bin/env bash
# One-shot GPU check (about 10 minutes on a 16-core machine with one GPU): builds mxrec
# against the GPU TensorFlow wheel, runs the tests that place tables on the GPU (on a GPU
# machine, accelerator_device() puts every table, its optimizer slots and the dense model
# there; the host tier's swaps take the gather/scatter path), then the training and tier
# benchmarks, and prints the figures.
#
#   bash bench/gpu_check.sh              # refuses to run without a visible GPU
#   # rehearsal on a CPU machine, with the CPU wheel already in .venv:
#   MXREC_GPU_CHECK_WHEEL=tensorflow-cpu MXREC_GPU_CHECK_ALLOW_CPU=1 bash bench/gpu_check.sh
#
# The build needs the `tensorflow` wheel (pip reaches an index, or PIP_FIND_LINKS names a
# folder holding it) and replaces the wheel in .venv, so rebuild with
# `bash scripts/setup.sh` before going back to the CPU wheel. TFRA's column needs TFRA on
# PYTHONPATH (see bench/bench_train.py). Output: the tests' summary
# and the figures in $OUT (default /tmp/mxrec-gpu-check): results.md, one JSON per
# benchmark, nvidia-smi's view.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/mxrec-gpu-check}"
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=2
started=$(date +%s)
step() { echo "== [$(( $(date +%s) - started )) s] $*"; }

wheel="${MXREC_GPU_CHECK_WHEEL:-tensorflow}"
step "build against the $wheel wheel (MXREC_TF_PACKAGE=$wheel bash scripts/setup.sh)"
MXREC_TF_PACKAGE="$wheel" bash scripts/setup.sh
py=.venv/bin/python

step "devices"
gpus=$(PYTHONPATH=. "$py" -c \
  'import tensorflow as tf; print(len(tf.config.list_physical_devices("GPU")))' 2>/dev/null)
PYTHONPATH=. "$py" -c 'import tensorflow as tf
print("TensorFlow", tf.__version__, "built with CUDA:", tf.test.is_built_with_cuda())
print("GPUs:", tf.config.list_physical_devices("GPU"))
from mxrec.util.device import accelerator_device
print("mxrec accelerator_device():", accelerator_device())'
if command -v nvidia-smi >/dev/null; then nvidia-smi | tee "$out/nvidia-smi.txt"; fi
if [ "${gpus:-0}" = "0" ]; then
  if [ "${MXREC_GPU_CHECK_ALLOW_CPU:-0}" != "1" ]; then
    echo "no GPU visible to TensorFlow: stopping (MXREC_GPU_CHECK_ALLOW_CPU=1 rehearses on" \
         "the CPU)" >&2
    exit 3
  fi
  echo "!! no GPU: a rehearsal on the CPU; none of the figures below is a GPU figure"
fi

step "tests that create tables (on the GPU where one is visible)"
# Tables, lookups and optimizers; the host tier (the gather/scatter swap path of GPU
# tables), its checkpoints and hooks; the step boundary; the graph modifier.
PYTHONPATH=. "$py" -m pytest -q -x -p no:cacheprovider --timeout 600 \
  tests/test_embedding.py tests/test_optimizers.py tests/test_tiers.py \
  tests/test_tier_checkpoint.py tests/test_hooks_tiers.py tests/test_step_boundary.py \
  tests/test_graph_modifier.py 2>&1 | tail -15

step "training benchmark (batch 4096: plain TF, mxrec direct, mxrec rewritten, TFRA if importable)"
PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$py" bench/bench_train.py --steps 100 --rounds 4 \
  --prefetch_depths 2 --json "$out/train.json" | tee "$out/train.md"

step "tier benchmark (device cache over host and SSD tiers; GPU tables swap by gather/scatter)"
PYTHONPATH=. "$py" bench/bench_tiers.py --quick --json "$out/tiers.json" | tee "$out/tiers.md"

step "figures"
"$py" - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
lines = []
for name in ("train", "tiers"):
    figures = json.loads((out / f"{name}.json").read_text())
    for goal in figures.pop("goals"):
        lines.append(f"{name}: {goal['goal']}: {goal['value']} (target {goal['target']}, "
                     f"{'met' if goal['met'] else 'NOT met'})")
    lines += [f"{name}: {key}: {value}" for key, value in figures.items()]
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
step "done; figures in $out"
