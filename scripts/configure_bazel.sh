#!/usr/bin/env bash
# Points the Bazel build at a Python with TensorFlow and pybind11: writes .bazelrc.user
# (git-ignored) with --repo_env=MXREC_PYTHON, which //third_party/bazel:mxrec_configure.bzl
# queries for TensorFlow's headers and flags, the Python headers and pybind11.
#   MXREC_TF=2.15 (default) -> .venv, MXREC_TF=2.21 -> .venv-tf221 (made by scripts/setup.sh),
#   or MXREC_PYTHON=/path/to/python for any other.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${MXREC_TF:-2.15}" in
  2.15) venv=.venv ;;
  2.21) venv=.venv-tf221 ;;
  *) echo "MXREC_TF must be 2.15 or 2.21, got '$MXREC_TF'" >&2; exit 2 ;;
esac
python=${MXREC_PYTHON:-$PWD/$venv/bin/python}
if ! version=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" -c \
    "import pybind11, tensorflow as tf; print(tf.__version__)" 2>/dev/null); then
  echo "configure_bazel: $python cannot import tensorflow and pybind11;" \
       "run scripts/setup.sh (MXREC_TF=${MXREC_TF:-2.15}) or set MXREC_PYTHON" >&2
  exit 1
fi
echo "build --repo_env=MXREC_PYTHON=$python" > .bazelrc.user
echo "configure_bazel: Bazel builds against TensorFlow $version ($python)"
