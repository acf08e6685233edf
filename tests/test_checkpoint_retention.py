"""Checkpoint retention: several ranks saving into one folder with the default max_to_keep,
deletions that tolerate what is gone and never leave a delta without its full save, and the
folders of killed saves removed at the next start."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from mxrec.saver import manifest as manifest_io
from mxrec.saver.checkpoint import Saver
from mxrec.util.initialize import terminate_config_initializer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "multirank_saves.py")


def _env():
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
        env.pop(name, None)
    return env


@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_save_a_full_every_step_with_the_default_max_to_keep(tmp_path, ranks):
    """5 runs of 30 full saves (and one run of fulls and deltas), each in a fresh folder
    holding a killed save's and a killed deletion's folders: no failure, exactly the newest
    versions listed, each restores to what the ranks held at its step (checked by every rank
    in tests/multirank_saves.py), no delta outlives its full.

    The runs share one launch: the race was between the ranks' file operations at each
    save, which process start-up does not change, and a launch of 4 ranks costs more than
    its 180 saves. On main, 2 and 4 ranks fail in the first run."""
    result = subprocess.run(
        [sys.executable, "-m", "mxrec.launch", "-n", str(ranks), SCRIPT, "--out",
         str(tmp_path), "--runs", "5", "--steps", "30"],
        env=_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [r["pattern"] for r in report] == ["full"] * 5 + ["mixed"]
    for run in report[:5]:
        assert run["versions"] == [["full", step] for step in range(26, 31)]
    kinds = [kind for kind, _ in report[5]["versions"]]
    assert kinds.count("full") == 5 and kinds.count("delta") == 10


def _version(directory, kind, step, base=None):
    path = os.path.join(directory, manifest_io.version_name(kind, step))
    os.makedirs(path)
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump({"format": manifest_io.FORMAT_VERSION, "kind": kind, "step": step,
                   "base": step if base is None else base, "files": {}, "tables": {}}, f)


def test_deletion_goes_newest_first_and_skips_what_is_gone(tmp_path, monkeypatch):
    directory = str(tmp_path)
    for step in range(1, 10):
        _version(directory, "full" if step % 3 == 1 else "delta", step, base=step - (step - 1) % 3)
    renamed = []
    real_rename = tf.io.gfile.rename

    def rename(src, dst, overwrite=False):
        name = os.path.basename(src)
        renamed.append(name)
        if name == "delta-000000000002":  # another process deleted it first
            raise tf.errors.NotFoundError(None, None, f"{src} not found")
        # Every moment of the deletion lists only restorable chains.
        listed = manifest_io.list_versions(directory)
        fulls = {step for kind, step in listed if kind == "full"}
        for kind, step in listed:
            if kind == "delta":
                assert manifest_io.read_manifest(directory, kind, step)["base"] in fulls
        return real_rename(src, dst, overwrite)

    monkeypatch.setattr(tf.io.gfile, "rename", rename)
    manifest_io.delete_old_versions(directory, max_to_keep=1)
    assert renamed == [manifest_io.version_name("delta" if s % 3 != 1 else "full", s)
                       for s in (6, 5, 4, 3, 2, 1)]
    assert sorted(os.listdir(directory)) == ["delta-000000000002", "delta-000000000008",
                                             "delta-000000000009", "full-000000000007"]
    # What the other process left (delta 2 without full 1) is not listed.
    assert manifest_io.list_versions(directory) == [("full", 7), ("delta", 8), ("delta", 9)]


def test_listing_leaves_out_deltas_no_full_precedes(tmp_path):
    directory = str(tmp_path)
    _version(directory, "delta", 4, base=2)
    _version(directory, "delta", 6, base=2)
    assert manifest_io.list_versions(directory) == []
    _version(directory, "full", 5)
    assert manifest_io.list_versions(directory) == [("full", 5), ("delta", 6)]
    assert manifest_io.list_versions(str(tmp_path / "absent")) == []


_KILLED_SAVE = textwrap.dedent("""
    import os, sys, tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    sys.path.insert(0, sys.argv[2])
    from test_checkpoint import Model
    from mxrec.saver.checkpoint import Saver
    model = Model("adagrad")
    saver = Saver(sys.argv[1])
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(model.train, {model.ids: [1, 2, 3]})
        saver.save(sess, 1)
        sess.run(model.train, {model.ids: [3, 4, 5]})
        # Killed once every file is written, before the rename publishes the version.
        tf.io.gfile.rename = lambda *args, **kwargs: os._exit(9)
        saver.save(sess, 2)
""")


def test_a_killed_saves_folder_is_gone_after_the_next_start(tmp_path):
    from test_checkpoint import Model

    killed = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(tmp_path),
                             os.path.dirname(__file__)], env=_env(), capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == 9, killed.stderr[-3000:]
    left = sorted(name for name in os.listdir(tmp_path) if name.startswith(".tmp-"))
    # The version being written, and the table's spool (its records, written by the
    # engine before the file): both the killed process's temporaries.
    assert len(left) == 2 and left[0].startswith(".tmp-full-000000000002@")
    assert left[1].startswith(".tmp-spool-000@")
    writer = manifest_io.writer_of(str(tmp_path), left[0])  # the killed process
    assert manifest_io.writer_of(str(tmp_path), left[1]) == writer
    assert writer.host == manifest_io.this_writer().host and writer.pid != os.getpid()
    assert manifest_io.writer_gone(writer)
    with tf.Graph().as_default():
        model = Model("adagrad")
        saver = Saver(str(tmp_path))
        assert sorted(os.listdir(tmp_path)) == ["full-000000000001"]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert saver.restore(sess) == 1
            ids, _ = model.table.export_rows()
            np.testing.assert_array_equal(np.sort(ids), [1, 2, 3])
            saver.save(sess, 2)  # the killed step saves again
        terminate_config_initializer()
    assert saver.versions() == [("full", 1), ("full", 2)]
