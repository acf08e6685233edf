"""The non-finite guard on 2 ranks: every rank refuses the save of a partition that turned
the model NaN, rank 0 records it as skipped, every rank goes back to the last good checkpoint
in a new graph and session, and the run ends with the serving versions of one process that
skipped the same partition."""

import os
import subprocess
import sys

import numpy as np
from nan_model_trainer import NAN_BELOW, config, nan_model_fn
from test_streaming_trainer import _export_state, write_stream

from mxrec.streaming import donefile
from mxrec.streaming.trainer import StreamingTrainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAY = ["20240101/00", "20240101/01", "20240101/02", "20240101/03"]


def test_skip_on_two_ranks_equals_one_process(tmp_path):
    data = tmp_path / "data"
    write_stream(str(data), DAY, rows=64)
    with open(data / DAY[2] / "part-00000", "a") as f:
        f.write(f"1\t{NAN_BELOW * 10:g}\t3\tv1\tv2\tv3\n")
    one = StreamingTrainer(config(data, tmp_path / "one", tmp_path / "one_export",
                                  on_nonfinite="skip"), nan_model_fn()).run()
    result = subprocess.run(
        [sys.executable, "-m", "mxrec.launch", "-n", "2", os.path.join(REPO, "tests",
                                                                       "nan_model_trainer.py"),
         "--data", str(data), "--model-dir", str(tmp_path / "two"), "--export-base",
         str(tmp_path / "two_export"), "--on-nonfinite", "skip"],
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
        text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    two = donefile.read(str(tmp_path / "two" / "donefile.jsonl"))
    assert [e["partition"] for e in two] == [e["partition"] for e in one] == DAY
    assert [bool(e.get("skipped")) for e in two] == [False, False, True, False]
    assert [e["step"] for e in two] == [e["step"] for e in one] == [1, 2, 2, 3]
    assert "of 2 ranks found faults" in two[2]["skipped"]
    for got, want in zip(two, one):
        assert got["rows"] == want["rows"] and got["table_rows"] == want["table_rows"]
    version, state = _export_state(tmp_path / "two_export")
    ref_version, ref_state = _export_state(tmp_path / "one_export")
    assert version == ref_version == 3 and sorted(state) == sorted(ref_state)
    for name in ref_state:
        np.testing.assert_allclose(state[name], ref_state[name], atol=1e-5, err_msg=name)
