"""examples/multiworker/train.py with each evaluation (`_evaluate` call) timed: its start and
end on the system-wide monotonic clock go to $MXREC_TEST_EVAL_LOG/rank-<rank>.jsonl, so a test
can check that a lagging rank's peer really left the evaluation (and started its next step)
while the lagging rank was still in it: the race `--lag` is meant to provoke."""

import importlib.util
import json
import os
import pathlib
import sys
import time

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "multiworker" / "train.py"
_spec = importlib.util.spec_from_file_location("multiworker_train", SCRIPT)
train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train)
_original = train._evaluate  # noqa: SLF001
# The gRPC engine's launcher sets MXREC_RANK, mpirun (the MPI engine) OMPI_COMM_WORLD_RANK.
_RANK = os.environ.get("MXREC_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
_LOG = os.path.join(os.environ["MXREC_TEST_EVAL_LOG"], f"rank-{_RANK}.jsonl")


def _timed_evaluate(*args, **kwargs):
    start = time.monotonic()
    result = _original(*args, **kwargs)
    with open(_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps({"start": start, "end": time.monotonic()}) + "\n")
    return result


train._evaluate = _timed_evaluate  # noqa: SLF001

if __name__ == "__main__":
    train.main(sys.argv[1:])
