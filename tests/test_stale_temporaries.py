"""Temporaries of a checkpoint directory are removed only when their writer is gone: a save
in progress in another process survives a second Saver on the directory, a killed save's
folder does not; a reused process id, another host, and folders of an earlier mxrec (no
writer recorded) are told apart."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import pytest
import tensorflow as tf

from mxrec.saver import manifest as manifest_io
from mxrec.saver.checkpoint import Saver

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DAY = 24 * 3600

# Saves step 1, then step 2, each held after its files are written (before the flush and
# rename) until the test lets it go; the test kills it during the second.
_WRITER = textwrap.dedent("""
    import os, sys, time, tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    sys.path.insert(0, sys.argv[2])
    from test_checkpoint import Model
    from mxrec.saver import manifest
    from mxrec.saver.checkpoint import Saver
    directory, signals = sys.argv[1], sys.argv[3]
    flush = manifest.durable.fsync_tree

    def held_flush(path):
        step = int(os.path.basename(path)[len(".tmp-full-"):][:12])
        open(os.path.join(signals, f"ready-{step}"), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(signals, f"go-{step}")):
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.02)
        flush(path)

    manifest.durable.fsync_tree = held_flush
    model = Model("sgd")
    saver = Saver(directory)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(model.train, {model.ids: [1, 2, 3]})
        saver.save(sess, 1)
        saver.save(sess, 2)
""")


def _env():
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
        env.pop(name, None)
    return env


def _wait_for(path, process, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if process.poll() is not None:
            raise AssertionError(f"the writer exited with {process.returncode}: "
                                 f"{process.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def _temporaries(directory, spools=False) -> list:
    """The `.tmp-` folders of the directory; without `spools`, not a save's spool folders
    (a save holds one beside its version's folder while it writes)."""
    return sorted(name for name in os.listdir(directory) if name.startswith(".tmp-")
                  and (spools or not name.startswith(".tmp-spool-")))


def _gone_pid() -> int:
    """The process id of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_second_saver_keeps_a_live_writers_temporary_and_removes_a_killed_ones(
        tmp_path, caplog):
    from test_checkpoint import Model

    directory, signals = tmp_path / "ckpt", tmp_path / "signals"
    directory.mkdir()
    signals.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), HERE,
                               str(signals)], env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(signals / "ready-1", writer)
        (in_progress,) = _temporaries(directory)
        named = manifest_io.writer_of(str(directory), in_progress)
        assert named.pid == writer.pid and named.host == manifest_io.this_writer().host
        Model("sgd")
        with caplog.at_level(logging.WARNING):
            Saver(str(directory))  # a second Saver on the directory, mid-save of the first
        assert _temporaries(directory) == [in_progress]
        assert f"kept {directory}/{in_progress}: its writer (host {named.host}, pid " \
               f"{writer.pid}) is still running" in caplog.text
        (signals / "go-1").touch()
        _wait_for(signals / "ready-2", writer)  # step 1 published, step 2 held
        assert sorted(os.listdir(directory))[-1] == "full-000000000001"
        (killed,) = _temporaries(directory)
        assert killed.startswith(".tmp-full-000000000002@")
    finally:
        writer.kill()
        writer.wait(timeout=60)
    assert _temporaries(directory) == [killed]
    saver = Saver(str(directory))
    assert _temporaries(directory, spools=True) == []  # the killed save's spool too
    assert saver.versions() == [("full", 1)]
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        assert saver.restore(sess) == 1


def _make(directory, name, writer=None, age=0.0, fresh_file=False):
    """A temporary holding one file, `age` seconds old; `writer` (a dict) in its
    writer.json; with fresh_file, one more file written just now."""
    path = os.path.join(directory, name)
    os.makedirs(path)
    with open(os.path.join(path, "table-000.npz"), "wb") as f:
        f.write(b"partial")
    if writer is not None:
        with open(os.path.join(path, manifest_io.WRITER_FILE), "w") as f:
            f.write(writer if isinstance(writer, str) else json.dumps(writer))
    then = time.time() - age
    for entry in os.listdir(path):
        os.utime(os.path.join(path, entry), (then, then))
    if fresh_file:
        with open(os.path.join(path, "dense.npz"), "wb") as f:
            f.write(b"now")
    os.utime(path, (then, then))


def test_which_temporaries_are_removed(tmp_path, caplog):
    me = manifest_io.this_writer()
    assert me.pid == os.getpid() and me.start > 0  # /proc is there on Linux
    gone = _gone_pid()
    mine = dict(me._asdict())
    directory = str(tmp_path)
    # name: (writer.json's content or None, files written just now)
    removed = {
        # This host, a process that has exited (a deletion's folder; a sharded save's).
        f".tmp-deleted-full-000000000001@{me.host}-{gone}-77-0a1b2c3d": (None, False),
        ".tmp-full-000000000002-ranks": (dict(host=me.host, pid=gone, start=77), False),
        # This process's id, but a process that started at another time: the id was reused.
        f".tmp-full-000000000003@{me.host}-{me.pid}-{me.start + 1}-0a1b2c3d": (None, False),
        # No writer (an earlier mxrec), untouched for two days; a damaged writer.json too.
        ".tmp-full-000000000004-5f0e": (None, False),
        ".tmp-full-000000000005-ranks": ("{not json", False),
    }
    # name: (writer.json's content or None, files written just now, why it is kept)
    kept = {
        f".tmp-full-000000000006@{me.host}-{me.pid}-{me.start}-0a1b2c3d":
            (None, False, f"its writer (host {me.host}, pid {me.pid}) is still running"),
        ".tmp-full-000000000007-ranks": (mine, False, "is still running"),
        f".tmp-full-000000000008@other-host.example-{gone}-77-0a1b2c3d":
            (None, False, "runs on another host"),
        # No writer, but a file written just now (an earlier mxrec still saving).
        ".tmp-full-000000000009-5f0e": (None, True, "it names no writer"),
    }
    for name, (writer, fresh) in removed.items():
        _make(directory, name, writer, age=2 * DAY, fresh_file=fresh)
    for name, (writer, fresh, _) in kept.items():
        _make(directory, name, writer, age=2 * DAY, fresh_file=fresh)
    os.makedirs(os.path.join(directory, "full-000000000001"))
    with caplog.at_level(logging.WARNING):
        got = manifest_io.remove_stale_temporaries(directory)
    assert got == sorted(removed)
    assert sorted(os.listdir(directory)) == sorted([*kept, "full-000000000001"])
    for name, (_, _, why) in kept.items():
        (line,) = [line for line in caplog.text.splitlines() if name in line]
        assert "kept" in line and why in line, line
    # Once untouched for UNNAMED_TEMPORARY_AGE_S, the folder without a writer goes too.
    assert manifest_io.UNNAMED_TEMPORARY_AGE_S <= DAY
    unnamed = os.path.join(directory, ".tmp-full-000000000009-5f0e")
    old = time.time() - 2 * DAY
    for entry in os.listdir(unnamed):
        os.utime(os.path.join(unnamed, entry), (old, old))
    assert manifest_io.remove_stale_temporaries(directory) == [".tmp-full-000000000009-5f0e"]


def test_a_sharded_save_skips_a_live_writers_folder_and_takes_a_dead_ones(tmp_path):
    """write_version_sharded (here one rank, whose barrier sums its own value) removes the
    folder of a save whose writer is gone, and keeps one whose writer runs: it writes into
    the next name instead, the ranks agreeing on it through the barrier."""
    directory = str(tmp_path)
    me = manifest_io.this_writer()
    _make(directory, ".tmp-full-000000000001-ranks",
          writer=dict(host=me.host, pid=_gone_pid(), start=77))
    _make(directory, ".tmp-full-000000000002-ranks", writer=dict(me._asdict()))
    agreed = []

    def barrier(value):
        agreed.append(value)
        return value

    manifest = {"format": manifest_io.FORMAT_VERSION, "kind": "full", "step": 1, "base": 1,
                "tables": {}}
    for step in (1, 2):
        name = manifest_io.version_name("full", step)
        path = manifest_io.write_version_sharded(directory, name, {"dense.npz": b"d"},
                                                 dict(manifest, step=step), 0, 1, barrier)
        assert sorted(os.listdir(path)) == ["dense.npz", "manifest.json"]
    assert agreed == [1, 0, 0, 2, 0, 0]  # the folder index + 1, then two plain barriers
    assert _temporaries(directory) == [".tmp-full-000000000002-ranks"]
    assert sorted(os.listdir(os.path.join(directory, ".tmp-full-000000000002-ranks"))) == [
        "table-000.npz", manifest_io.WRITER_FILE]  # the live writer's, untouched
    with pytest.raises(manifest_io.CheckpointError, match="already exists"):
        manifest_io.write_version_sharded(directory, manifest_io.version_name("full", 1),
                                          {}, manifest, 0, 1, barrier)
    assert agreed[-1] == 0  # the other ranks learn it from the barrier and raise too


def test_a_failed_write_removes_its_own_temporary(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(manifest_io.durable, "rename_durably", fail)
    with pytest.raises(OSError, match="disk full"):
        manifest_io.write_version(str(tmp_path), "full-000000000001", {"dense.npz": b"d"},
                                  {"format": manifest_io.FORMAT_VERSION})
    assert os.listdir(tmp_path) == []
