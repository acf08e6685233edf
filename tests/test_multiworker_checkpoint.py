"""TF's Saver and tf.estimator on several ranks, against one process on the global batch.

Each rank's TF checkpoint holds the whole table keyed by ID in the one-process layout
(mxrec.distributed.sharded_state), so a checkpoint of N ranks restores on M ranks and on one
process. The reference is one process training straight through (examples/multiworker).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from support import needs_estimator

from mxrec.distributed.routing import owner_of_numpy

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "examples" / "multiworker" / "train.py")
ESTIMATOR = str(ROOT / "examples" / "multiworker" / "estimator.py")
COMMON = ["--optimizer", "adagrad", "--threshold", "2", "--steps", "20"]


def _run(ranks, script, args, timeout=300, **environment):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", **environment)
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
        env.pop(name, None)
    command = [sys.executable, script] + args
    if ranks > 1:
        command = [sys.executable, "-m", "mxrec.launch", "-n", str(ranks), script] + args
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _shards(out, ranks):
    table, weights = {}, []
    for rank in range(ranks):
        data = np.load(out / f"rank-{rank}.npz")
        assert (owner_of_numpy(data["ids"], ranks) == rank).all()
        table.update(zip(data["ids"].tolist(), data["values"]))
        weights.append(data["w"])
    return table, weights


def _assert_same(got, got_w, want, want_w, label):
    assert sorted(got) == sorted(want), label
    assert len(want) > 50
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=label)
    for w in got_w:
        np.testing.assert_allclose(w, want_w, rtol=0, atol=1e-5, err_msg=label)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    _ok(_run(1, TRAIN, COMMON + ["--out", str(out)]))
    return _shards(out, 1)


@pytest.fixture(scope="module")
def saved_by_4(tmp_path_factory):
    """4 ranks train 8 steps and save with tf.compat.v1.train.Saver."""
    base = tmp_path_factory.mktemp("four")
    _ok(_run(4, TRAIN, COMMON + ["--stop_at", "8", "--tf_save", str(base / "ckpt"),
                                 "--out", str(base / "out")]))
    return base / "ckpt"


def test_tf_saver_reshards_4_to_2_to_1_and_4(straight, saved_by_4, tmp_path):
    """4 ranks save at step 8; 2 ranks restore, train to 14 and save; from that, 1 process
    and 4 ranks train to 20: each equals 20 straight steps of one process."""
    want, (want_w,) = straight
    # Every rank wrote the same whole table, in its own directory, by one-process names.
    readers = [tf.train.load_checkpoint(str(saved_by_4 / "model-8"))] + [
        tf.train.load_checkpoint(str(saved_by_4 / f"rank-{r}" / "model-8")) for r in (1, 2, 3)]
    names = readers[0].get_variable_to_shape_map()
    assert names["emb"] == [512, 8] and names["emb/Adagrad"] == [512, 8]
    for reader in readers[1:]:
        assert reader.get_variable_to_shape_map() == names
        for name in names:
            np.testing.assert_array_equal(reader.get_tensor(name), readers[0].get_tensor(name))
    keys = readers[0].get_tensor("emb/mxrec_host/keys")
    rows = readers[0].get_tensor("emb/mxrec_host/rows")
    assert (np.diff(keys) > 0).all()  # by ID, so independent of the rank count
    admitted = rows >= 0
    np.testing.assert_array_equal(rows[admitted], np.arange(admitted.sum()))
    assert (rows[~admitted] == -1).all() and (~admitted).any()  # counted, not yet admitted
    np.testing.assert_array_equal(readers[0].get_tensor("emb/mxrec_host/meta")[:1],
                                  [admitted.sum()])

    two = tmp_path / "two"
    _ok(_run(2, TRAIN, COMMON + ["--tf_restore", str(saved_by_4), "--stop_at", "14",
                                 "--tf_save", str(two), "--out", str(tmp_path / "out2")]))
    for ranks in (1, 4):
        out = tmp_path / f"out-{ranks}"
        _ok(_run(ranks, TRAIN, COMMON + ["--tf_restore", str(two), "--out", str(out)]))
        got, got_w = _shards(out, ranks)
        _assert_same(got, got_w, want, want_w, f"4 -> 2 -> {ranks} ranks")


def test_one_process_checkpoint_restores_on_two_ranks(straight, tmp_path):
    want, (want_w,) = straight
    _ok(_run(1, TRAIN, COMMON + ["--stop_at", "8", "--tf_save", str(tmp_path / "one"),
                                 "--out", str(tmp_path / "o1")]))
    _ok(_run(2, TRAIN, COMMON + ["--tf_restore", str(tmp_path / "one"),
                                 "--out", str(tmp_path / "o2")]))
    got, got_w = _shards(tmp_path / "o2", 2)
    _assert_same(got, got_w, want, want_w, "1 -> 2 ranks")


def test_tf_restore_of_another_table_or_too_small_fails(saved_by_4, tmp_path):
    """A table of another dim, or more IDs than a rank's device_vocabulary_size: errors that
    name the table and the setting, on every rank."""
    other_dim = _run(2, TRAIN, COMMON + ["--dim", "4", "--tf_restore", str(saved_by_4),
                                         "--out", str(tmp_path / "a")])
    assert other_dim.returncode != 0
    # (TF's assert message escapes the quotes around names.)
    assert ("emb" in other_dim.stdout and "(dim 4): the checkpoint" in other_dim.stdout
            and "has rows of another dim:] [512 8]" in other_dim.stdout), \
        other_dim.stdout[-3000:]
    small = _run(2, TRAIN, COMMON + ["--capacity", "40", "--tf_restore", str(saved_by_4),
                                     "--out", str(tmp_path / "b")])
    assert small.returncode != 0
    assert ("emb" in small.stdout and "on 2 ranks: rank" in small.stdout
            and "device_vocabulary_size=40" in small.stdout), small.stdout[-3000:]


@pytest.mark.parametrize("table", [["--capacity", "150", "--host", "1000"], ["--is_dp"]],
                         ids=["host_tier", "is_dp"])
def test_tf_saver_refuses_tiered_and_replicated_tables_on_several_ranks(tmp_path, table):
    """A table with a host tier, or a replicated is_dp table, has no TF-Saver form on several
    ranks yet: an error that points at mxrec's Saver."""
    result = _run(2, TRAIN, ["--steps", "2", "--tf_save", str(tmp_path / "tf"),
                             "--out", str(tmp_path / "o")] + table, timeout=200)
    assert result.returncode != 0
    assert "has a host tier (host_vocabulary_size > 0) or is replicated (is_dp=True)" in \
        result.stdout and "mxrec.saver.checkpoint.Saver" in result.stdout, result.stdout[-3000:]


def test_tf_saver_refuses_a_gathered_table_over_the_limit_on_several_ranks(tmp_path):
    """Each rank would hold every rank's IDs, rows and slots: above MXREC_TF_SAVER_MAX_MB
    (here 1 KiB) the save fails before the gathers, naming the table, the limit, the bytes
    and mxrec's Saver; nothing is written."""
    result = _run(2, TRAIN, ["--steps", "2", "--tf_save", str(tmp_path / "tf"),
                             "--out", str(tmp_path / "o")], timeout=200,
                  MXREC_TF_SAVER_MAX_MB="0.0009765625")
    assert result.returncode != 0
    text = (result.stdout + result.stderr).replace("\\'", "'")  # the Assert's repr quotes
    for part in ("table 'emb'", "the limit of 0.000976562 MiB (MXREC_TF_SAVER_MAX_MB)",
                 "bytes (estimate):] [", "mxrec.saver.checkpoint.Saver"):
        assert part in text, (part, result.stdout[-3000:])
    assert not list(tmp_path.glob("tf*/*.index")) and not list(tmp_path.glob("tf*.index"))


# (ranks, extra arguments of the split run, extra arguments of both runs)
ESTIMATOR_CASES = {
    "direct": (2, [], []),
    # GraphModifierHook: each step plans the next batch (prefetch 1) inside the step.
    "graph_modifier-prefetch1": (2, ["--modify_graph", "--prefetch", "1"], []),
    # EvictHook every 3 global steps; the checkpoint at step 6 is written before the hook's
    # eviction of step 6 (Estimator's hook order), which the hook repeats after the restore.
    "graph_modifier-evict_hook": (2, ["--modify_graph"],
                                  ["--eviction", "30", "--evict_every", "3"]),
    "one_process-evict_hook": (1, [], ["--eviction", "30", "--evict_every", "3"]),
}


@needs_estimator
@pytest.mark.parametrize("case", sorted(ESTIMATOR_CASES))
def test_estimator_split_over_calls_and_ranks_equals_one_run(tmp_path, case):
    """Estimator.train() twice (6 steps each, a checkpoint every 3, the second call restoring
    the first's) on N ranks equals one process's single train() of 12 steps."""
    ranks, split_args, both = ESTIMATOR_CASES[case]
    one = tmp_path / "one.npz"
    _ok(_run(1, ESTIMATOR, ["--model_dir", str(tmp_path / "m1"), "--calls", "1",
                            "--steps_per_call", "12", "--out", str(one)] + both))
    two = tmp_path / "two.npz"
    _ok(_run(ranks, ESTIMATOR, ["--model_dir", str(tmp_path / "m2"), "--calls", "2",
                                "--steps_per_call", "6", "--out", str(two)]
             + split_args + both))
    # Each rank checkpointed by steps, in its own directory.
    for rank in range(ranks):
        directory = tmp_path / "m2" / (f"rank-{rank}" if rank else "")
        assert tf.train.latest_checkpoint(str(directory)).endswith("model.ckpt-12")
    want, got = np.load(one), np.load(two)
    assert int(got["step"]) == int(want["step"]) == 12
    want_table = dict(zip(want["ids"].tolist(), want["values"]))
    got_table = dict(zip(got["ids"].tolist(), got["values"]))
    if both:  # the eviction removed IDs
        assert len(want_table) < 200
    _assert_same(got_table, [got["w"]], want_table, want["w"], f"estimator {case}")


@needs_estimator
def test_estimator_save_checkpoints_secs_is_refused_on_ranks(tmp_path):
    by_time = _run(2, ESTIMATOR, ["--model_dir", str(tmp_path / "m3"), "--save_secs", "5"])
    assert by_time.returncode != 0
    assert "save_checkpoints_secs is refused on several ranks" in by_time.stdout and \
        "use save_checkpoints_steps" in by_time.stdout, by_time.stdout[-3000:]


def test_a_rank_without_checkpoint_starts_from_rank_0s(tmp_path):
    """A restore on more ranks than saved: rank R's directory has no checkpoint, so its
    checkpoint state points at rank 0's latest, and lists nothing for max_to_keep."""
    from mxrec.distributed import communication

    model_dir, own = tmp_path / "model", tmp_path / "model" / "rank-3"
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, str(model_dir / "model.ckpt"), global_step=step)
            sess.run(step.assign(7))
            saver.save(sess, str(model_dir / "model.ckpt"), global_step=step)
    communication._start_from_rank0(str(model_dir), str(own))  # noqa: SLF001
    assert tf.train.latest_checkpoint(str(own)) == str(model_dir / "model.ckpt-7")
    assert list(tf.train.get_checkpoint_state(str(own)).all_model_checkpoint_paths) == []
    # Its own later checkpoint wins over rank 0's older one.
    (own / "model.ckpt-9.index").write_bytes(b"")
    (own / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-9"\n')
    communication._start_from_rank0(str(model_dir), str(own))  # noqa: SLF001
    assert tf.train.latest_checkpoint(str(own)) == str(own / "model.ckpt-9")


def test_one_process_rank_directory_and_run_config(tmp_path):
    from mxrec.distributed import communication

    assert communication.rank_directory(str(tmp_path)) == str(tmp_path)
    assert communication.session_kwargs() == {}
    if not hasattr(tf, "estimator"):
        pytest.skip("tf.estimator is absent in this TensorFlow")
    config = communication.run_config(str(tmp_path), save_checkpoints_steps=5)
    assert config.model_dir == str(tmp_path) and config.master == ""
    assert config.save_checkpoints_steps == 5
