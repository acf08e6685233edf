"""One rank of tests/test_multiworker_mx_rec_demo.py: runs mx_rec's little_demo structure
(examples/mx_rec_style/little_demo.py: a plain tf.compat.v1.Session, only
global_variables_initializer(), dense gradients through hccl_ops.allreduce) and writes
what its main() returns (the evaluation losses) to <prefix>-<rank>.json."""

import json
import os
import pathlib
import runpy
import sys

import numpy as np

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
SCRIPT = EXAMPLES / "mx_rec_style" / "little_demo.py"

if __name__ == "__main__":
    result = runpy.run_path(str(SCRIPT))["main"]()
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("MXREC_RANK", "0"))
    with open(f"{sys.argv[1]}-{rank}.json", "w") as f:
        json.dump(np.asarray(result, np.float64).tolist(), f)
