"""The Saver's finiteness check on two ranks: a non-finite row in one rank's shard, or a
non-finite dense value (rank 0's file), makes every rank refuse the save together, nothing
is written, and the next delta holds every ID the refused one would have held."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "multirank_finite.py")


def _env():
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("engine", ["mpi", "grpc"])
def test_every_rank_refuses_a_save_that_one_rank_finds_non_finite(tmp_path, engine):
    """The ranks agree through the Saver's barrier, an all-reduce of each engine."""
    out, reports = tmp_path / "ckpt", tmp_path / "reports"
    reports.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "mxrec.launch", "-n", "2", "--engine", engine, SCRIPT,
         "--out", str(out),
         "--report", str(reports)], env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rank0, rank1 = (json.loads((reports / f"rank-{r}.json").read_text()) for r in (0, 1))
    poisoned = rank1["poisoned"]
    assert f"table 'emb' embedding: 1 non-finite value(s), e.g. ID {poisoned}" in \
        rank1["table_message"]
    assert "step 3 (delta)" in rank1["table_message"]
    assert "2 of 2 ranks" not in rank0["table_message"]
    assert "1 of 2 ranks found faults" in rank0["table_message"]
    assert "another rank found non-finite values" in rank0["table_message"]
    assert "variable 'w': 1 non-finite value(s), e.g. index (3,)" in rank0["dense_message"]
    assert "another rank found non-finite values" in rank1["dense_message"]
    # The refused delta did not move the baseline: the next holds every ID step 3 trained.
    for report in (rank0, rank1):
        assert report["delta_ids"] == report["trained"]
        assert report["versions"] == [["full", 2], ["delta", 3], ["delta", 4]]
    assert rank0["listing"] == ["delta-000000000003", "delta-000000000004",
                                "full-000000000002"]
