"""Exactly once on several ranks: SIGKILL of one rank of 2 at a stage of a partition (the
launcher then stops the other), restarts on 2 ranks and on 1 process (a restore on another
rank count reshards), and the result equals one process that never stopped: the donefile
holds each partition once, every serving version predicts what the uninterrupted run's
does, the newest version holds the same tables and dense values."""

import os
import random
import signal
import subprocess

import numpy as np
import pytest
from test_streaming_ranks_equal import (
    ALL_PARTITIONS,
    assert_same_state,
    assert_same_versions,
    check,
    command,
    held_out,
    predictions,
    train,
    write_data,
)
from test_streaming_trainer import _export_state, _wait_for_new_paths

from mxrec.streaming import donefile
from mxrec.streaming.trainer import FAULT_ENV


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The data and one process's uninterrupted run on it: what both tests compare against
    (trained once for the module); returns (data, its donefile entries, its serving versions'
    predictions of the held-out partition, that partition, its newest version's state)."""
    root = tmp_path_factory.mktemp("restart_reference")
    data = root / "data"
    write_data(data)
    check(train(1, data, root / "ref_work", root / "ref_export"))
    query = held_out(root / "held_out")
    return (data, donefile.read(str(root / "ref_work" / "donefile.jsonl")),
            predictions(root / "ref_export", query), query,
            _export_state(root / "ref_export")[1])


def _killed(result, rank):
    """The launcher's run ended because `rank` was killed (SIGKILL: status -9)."""
    text = result.stdout + result.stderr
    assert result.returncode != 0, text[-3000:]
    assert f"rank {rank} failed" in text, text[-3000:]


def test_kills_of_one_rank_then_restarts_on_two_and_one_equal_the_straight_run(
        tmp_path, reference):
    data, ref_entries, ref_predictions, query, ref_state = reference
    work, export = tmp_path / "work", tmp_path / "export"
    # Rank 1 dies once its shard of partition 2 is saved (rank 0 may be exporting it).
    _killed(train(2, data, work, export, env={FAULT_ENV: "after_checkpoint:2:1"}), 1)
    entries = donefile.read(str(work / "donefile.jsonl"))
    assert [e["partition"] for e in entries] in (ALL_PARTITIONS[:1], ALL_PARTITIONS[:2])
    # Restart on 2 ranks; rank 0 dies after delivering partition 4, before its line.
    _killed(train(2, data, work, export, env={FAULT_ENV: "after_export:4:0"}), 0)
    assert [e["partition"] for e in donefile.read(str(work / "donefile.jsonl"))] == \
        ALL_PARTITIONS[:3]
    # Restart on one process (the 2-rank checkpoint reshards onto it), killed after the line
    # of partition 5 is written; then on 2 ranks again (1 -> 2).
    one = train(1, data, work, export, env={FAULT_ENV: "after_donefile:5"})
    assert one.returncode == -9, one.stderr[-3000:]
    # Rank 1 dies once it is through partition 6 (rank 0 may not have written its line yet).
    _killed(train(2, data, work, export, env={FAULT_ENV: "after_donefile:6:1"}), 1)
    assert len(donefile.read(str(work / "donefile.jsonl"))) in (5, 6)
    check(train(2, data, work, export))

    entries = donefile.read(str(work / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == ALL_PARTITIONS  # each once, in order
    assert [e["step"] for e in entries] == list(range(1, len(ALL_PARTITIONS) + 1))
    assert [e["ranks"] for e in entries][5:] == [2] * (len(ALL_PARTITIONS) - 5)
    assert entries[4]["ranks"] == 1
    assert len(ref_entries) == len(entries)
    for a, b in zip(ref_entries, entries):
        assert (a["rows"], a["checkpoint"], a["table_rows"]) == \
            (b["rows"], b["checkpoint"], b["table_rows"]), (a, b)
        np.testing.assert_allclose(b["metrics"]["logloss"], a["metrics"]["logloss"],
                                   atol=1e-5)
    assert_same_versions(ref_predictions, predictions(export, query), "killed and restarted")
    assert_same_state(ref_state, _export_state(export)[1], "killed and restarted, newest version")


def _children(pid: int):
    children = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children += [int(child) for child in f.read().split()]
    except FileNotFoundError:
        pass
    return children


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The process id of `rank` among the launcher's descendants: its own children on the
    gRPC engine (MXREC_RANK), mpirun's on the MPI engine (OMPI_COMM_WORLD_RANK)."""
    marks = (f"MXREC_RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode())
    todo, seen = _children(launcher.pid), []
    while todo:
        pid = todo.pop(0)
        seen.append(pid)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except FileNotFoundError:
            continue
        if any(mark in environ for mark in marks):
            return pid
        todo += _children(pid)
    raise AssertionError(f"no rank {rank} among the launcher's descendants {seen}")


def test_kills_at_seeded_moments_of_a_rank_and_of_the_launcher(tmp_path, reference):
    """SIGKILL of rank 1 and SIGTERM to the launcher at points derived from the run's progress
    (a seeded number of new paths under the checkpoints, under the export: mid-save,
    mid-export), after a kill before the save (rank 1 after training partition 3: rank 0
    waits in the save until the launcher stops it); then a run to the end."""
    data, _, ref_predictions, query, ref_state = reference
    work, export = tmp_path / "work", tmp_path / "export"
    _killed(train(2, data, work, export, env={FAULT_ENV: "after_train:3:1"}), 1)
    assert [e["partition"] for e in donefile.read(str(work / "donefile.jsonl"))] == \
        ALL_PARTITIONS[:2]
    rng = random.Random(5)
    for where, victim in ((work / "checkpoints", "rank 1"), (export, "launcher")):
        argv, env = command(2, data, work, export)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        stopped = _wait_for_new_paths(proc, where, rng.randint(2, 10))
        if stopped:
            if victim == "launcher":
                proc.send_signal(signal.SIGTERM)
            else:
                os.kill(_rank_pid(proc, 1), signal.SIGKILL)
        _, err = proc.communicate(timeout=180)
        # Killed, or it finished before that point (then a later run has nothing to do).
        assert (proc.returncode != 0) == stopped, (victim, proc.returncode, err[-3000:])
    check(train(2, data, work, export))
    entries = donefile.read(str(work / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == ALL_PARTITIONS
    assert_same_versions(ref_predictions, predictions(export, query), "killed at seeded moments")
    assert_same_state(ref_state, _export_state(export)[1],
                      "killed at seeded moments, newest version")
