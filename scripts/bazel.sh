#!/usr/bin/env bash
# Builds mxrec with Bazel (//:all, offline), runs the engine stress test from that build, and
# checks the shared objects it made: the op library loads in TensorFlow and shares its tables
# with the pybind11 module. The Python (TensorFlow, pybind11) is $MXREC_PYTHON, else .venv's.
#   MXREC_JOBS  Bazel's --jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${MXREC_PYTHON:-$PWD/.venv/bin/python}
flags=(--jobs="${MXREC_JOBS:-2}" --repo_env=MXREC_PYTHON="$python")
start=$(date +%s)
bazel build "${flags[@]}" //:all
echo "bazel: built //:all in $(($(date +%s) - start)) s"
bazel test "${flags[@]}" --test_output=errors //:engine_stress
grep '^engine_stress:' bazel-testlogs/engine_stress/test.log || true

# The package as setup.py lays it out, with Bazel's shared objects in mxrec/_lib.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r mxrec "$stage/"
rm -f "$stage"/mxrec/_lib/*.so "$stage"/mxrec/_lib/*.json
cp bazel-bin/libmxrec_engine.so bazel-bin/_mxrec_ops.so bazel-bin/_mxrec_engine.*.so \
   bazel-bin/build_info.json "$stage/mxrec/_lib/"
cd "$stage"
PYTHONPATH="$stage" TF_CPP_MIN_LOG_LEVEL=2 "$python" - "$stage" <<'PY'
import sys

import numpy as np
import tensorflow as tf

import mxrec._lib
from mxrec._lib import loader

assert mxrec._lib.__file__.startswith(sys.argv[1]), mxrec._lib.__file__
engine = loader.engine()
ops = loader.op_library()  # tf.load_op_library of Bazel's _mxrec_ops.so
key = "bazel_check/t"
engine.create_table(key=key, name="t", dim=4, capacity=16)
unique_rows, restore, _, _ = ops.mxrec_key_stage(
    ids=[tf.constant([7, -3, 7], tf.int64)], timestamp=tf.constant(0, tf.int64), weights=[],
    table_keys=[key])
np.testing.assert_array_equal(unique_rows[0].numpy(), [0, 1])
np.testing.assert_array_equal(restore[0].numpy(), [0, 1, 0])
# The kernel planned into the table that pybind created: one engine library under both.
ids, rows = engine.export_rows(key)
np.testing.assert_array_equal(ids, [7, -3])
np.testing.assert_array_equal(rows, [0, 1])
engine.drop_prefix("bazel_check/")
print(f"bazel: the op library loads in TensorFlow {tf.__version__} and shares the engine "
      "with the pybind11 module")
PY
