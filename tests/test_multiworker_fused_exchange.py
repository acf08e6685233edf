"""The fused exchange of the graph modifier on several ranks (mxrec.distributed.id_exchange's
exchange_all, mxrec.distributed.send_back's send_back_all): one step of 6 sharded lookups
(5 tables of different dims, one of them looked up twice) runs the same collectives as a
step of 1 lookup, and 2 ranks train what one process trains (examples/multiworker/tables.py)."""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from mxrec.distributed.routing import owner_of_numpy

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "multiworker" / "tables.py")
_PORT_TAKEN = "Could not start gRPC server"
MANY = ["--tables", "5", "--dims", "8,4,16,2,6", "--twice"]


def _run(ranks, args, timeout=400, ok=True):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
        env.pop(name, None)
    command = [sys.executable, SCRIPT] + args
    if ranks > 1:
        command = [sys.executable, "-m", "mxrec.launch", "-n", str(ranks)] + command[1:]
    for _ in range(3):  # a free port taken by another process before the rank bound it
        result = subprocess.run(command, env=env, capture_output=True, text=True,
                                timeout=timeout)
        if _PORT_TAKEN not in result.stdout + result.stderr:
            break
    if ok:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _counted(tmp_path, name, args):
    path = tmp_path / f"{name}.json"
    _run(2, args + ["--modify_graph", "--count", str(path)])
    return json.loads(path.read_text())


@pytest.mark.parametrize("prefetch", ["0", "1"])
def test_collectives_per_step_do_not_grow_with_lookups(tmp_path, prefetch):
    one = _counted(tmp_path, "one", ["--tables", "1", "--prefetch", prefetch])
    many = _counted(tmp_path, "many", MANY + ["--prefetch", prefetch])
    kinds = many["collectives"]
    # One all-to-all each of IDs, embeddings and gradients; all-reduces: the step's one
    # agreement (buckets, fingerprints, batch times, "every rank has a next batch") and the
    # user's dense all-reduce (one variable).
    assert kinds == {"alltoall_ids": 1, "alltoall_embeddings": 1, "alltoall_gradients": 1,
                     "allreduce": 2}, many["names"]
    assert one["collectives"] == kinds, (one["names"], many["names"])
    # The fused exchanges carry every lookup's rows: more bytes than one lookup's.
    assert many["bytes_sent"] > one["bytes_sent"] > 0


def _shards(out, ranks, tables):
    got, weights = [dict() for _ in range(tables)], []
    for rank in range(ranks):
        data = np.load(out / f"rank-{rank}.npz")
        for t in range(tables):
            ids = data[f"ids_{t}"]
            assert (owner_of_numpy(ids, ranks) == rank).all()
            assert not set(ids.tolist()) & set(got[t])
            got[t].update(zip(ids.tolist(), data[f"values_{t}"]))
        weights.append(data["w"])
    return got, weights


@pytest.mark.parametrize("optimizer,prefetch", [("adagrad", "1"), ("sgd", "2")])
def test_fused_exchange_on_two_ranks_equals_one_process(tmp_path, optimizer, prefetch):
    args = MANY + ["--optimizer", optimizer, "--steps", "8"]
    _run(1, args + ["--out", str(tmp_path / "one")])  # the direct path, one process
    _run(2, args + ["--modify_graph", "--prefetch", prefetch, "--out", str(tmp_path / "many")])
    (want, (want_w,)), (got, got_w) = (_shards(tmp_path / "one", 1, 5),
                                       _shards(tmp_path / "many", 2, 5))
    for t in range(5):
        assert sorted(got[t]) == sorted(want[t]) and len(want[t]) > 20
        for key, value in want[t].items():
            np.testing.assert_allclose(got[t][key], value, rtol=0, atol=1e-5,
                                       err_msg=f"table {t}, ID {key}")
    for w in got_w:
        np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-5)


def test_ranks_that_built_different_lookups_fail_naming_the_lookup():
    """One agreement serves the step's 6 lookups; the error still names the lookup that
    differs, its table and the fields its fingerprint covers."""
    result = _run(2, MANY + ["--modify_graph", "--rename_on_rank1", "2", "--steps", "4"],
                  timeout=300, ok=False)
    assert result.returncode != 0
    out = (result.stdout + result.stderr).replace("\\'", "'")  # TF's messages escape quotes
    assert "the ranks built different lookups" in out, out[-3000:]
    assert re.search(r"sparse_lookup 'lookup_2[^']*' on table 'emb_2", out), out[-3000:]
    assert "lookup 3 of the 6 sharded lookups of this step" in out
    assert "table name, dim, key dtype, send_count, is_train or all2all_gradients_op" in out
    assert not re.search(r"sparse_lookup 'lookup_[013]", out)  # those that agree: not blamed
