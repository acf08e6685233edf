"""The streaming trainer: one pass per partition in time order, donefile, versions, and
exactly once across SIGKILLs at every stage and at a random moment."""

import json
import os
import random
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from mxrec.export import saved_model as serving
from mxrec.serving import versions
from mxrec.streaming import donefile, models, parsers
from mxrec.streaming.trainer import FAULT_ENV, StreamConfig, StreamingTrainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA_SPEC = "y:label,d0:dense,d1:dense,c0:categorical,c1:categorical,c2:categorical"
PARTITIONS = ["20240101/00", "20240101/01", "20240101/02", "20240102/00", "20240102/01"]
MODEL_FLAGS = ["--model", "wide_deep", "--dim", "4", "--hidden", "8", "--vocabulary", "4000",
               "--init_stddev", "0.05", "--access_threshold", "2", "--eviction_threshold", "3600",
               "--evict_daily", "--batch_size", "64", "--threads", "1", "--no_tensorboard"]


def write_stream(root, partitions=PARTITIONS, rows=200, seed=0, bad=()):
    """Small partitions with drifting IDs; `bad` partitions get one malformed line."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(3, 400))
    for index, name in enumerate(partitions):
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        lines = []
        for _ in range(rows):
            cats = (rng.zipf(1.3, size=3) + index * 7) % 400
            logit = weights[np.arange(3), cats].sum()
            label = int(rng.random() < 1 / (1 + np.exp(-logit)))
            dense = rng.integers(0, 50, size=2)
            lines.append("\t".join([str(label), str(dense[0]), "" if dense[1] > 40 else
                                    str(dense[1])] + [f"v{c}" for c in cats]))
        if name in bad:
            lines.insert(5, "1\tnot-a-number\t3\ta\tb\tc")
        with open(os.path.join(folder, "part-00000"), "w") as f:
            f.write("\n".join(lines[: rows // 2]) + "\n")
        with open(os.path.join(folder, "part-00001"), "w") as f:
            f.write("\n".join(lines[rows // 2:]) + "\n")
        open(os.path.join(folder, "_SUCCESS"), "w").close()


def _cli(data, work, export, extra=(), env=None, **kwargs):
    cmd = [sys.executable, "-m", "mxrec.streaming", "train", "--data", str(data), "--workdir",
           str(work), "--export_base", str(export), "--schema", SCHEMA_SPEC, "--no_progress",
           *MODEL_FLAGS, *extra]
    full_env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", **(env or {}))
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def _export_state(export_base):
    """{name: array} of the newest serving version, tables sorted by ID."""
    newest = versions.list_versions(str(export_base))[-1]
    directory = os.path.join(str(export_base), str(newest))
    versions.verify(directory)
    reader = tf.train.load_checkpoint(os.path.join(directory, "variables", "variables"))
    state = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
             if not name.startswith(serving.SERVING_SCOPE)}
    for table, arrays in serving.exported_tables(directory).items():
        order = np.argsort(arrays["ids"])
        state[f"{table}/ids"] = arrays["ids"][order]
        state[f"{table}/embeddings"] = arrays["embeddings"][order]
    return newest, state


def _reference(tmp_path, data):
    """The uninterrupted run, in this process through the library API."""
    args = dict(zip(MODEL_FLAGS[::2], MODEL_FLAGS[1::2]))
    config = StreamConfig(data=str(data), schema=parsers.parse_schema_spec(SCHEMA_SPEC),
                          workdir=str(tmp_path / "ref_work"),
                          export_base=str(tmp_path / "ref_export"), batch_size=64,
                          evict_daily=True, progress=False, tensorboard=False, threads=1)
    model = models.ModelConfig("wide_deep", dim=4, hidden=(8,), vocabulary=4000,
                               init_stddev=0.05, access_threshold=2,
                               eviction_threshold=3600)
    assert args["--vocabulary"] == "4000"
    entries = StreamingTrainer(config, models.make_model_fn(model)).run()
    return entries, _export_state(tmp_path / "ref_export")


def _wait_for_new_paths(proc, root, count, timeout=240.0):
    """Polls until `count` paths under `root` appeared that were not there when called (files
    and directories, cumulative: a saver's temporary files count too); False if `proc` ended
    first."""

    def paths():
        return {os.path.join(d, n) for d, dirs, files in os.walk(root) for n in dirs + files}

    before, seen = paths(), set()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= paths() - before
        if len(seen) >= count:
            return True
        time.sleep(0.002)
    assert proc.poll() is not None, f"no {count} new paths under {root} in {timeout} s"
    return False


def test_exactly_once_across_kills(tmp_path):
    data = tmp_path / "data"
    write_stream(str(data))
    ref_entries, (ref_version, ref_state) = _reference(tmp_path, data)
    assert [e["partition"] for e in ref_entries] == PARTITIONS
    assert ref_version == len(PARTITIONS)
    assert [e["checkpoint"] for e in ref_entries] == ["full", "delta", "delta", "full", "delta"]
    assert ref_entries[3]["evicted"] > 0  # the new day evicted IDs unseen for an hour

    work, export = tmp_path / "work", tmp_path / "export"
    faults = ["after_checkpoint:2", "after_export:3", "after_train:4", "after_donefile:4"]
    for fault in faults:
        proc = _cli(data, work, export, env={FAULT_ENV: fault})
        proc.communicate(timeout=240)
        assert proc.returncode == -signal.SIGKILL, (fault, proc.returncode)
    # Kills at seeded points of the last partition's run: one a seeded moment into its start
    # (import, graph building), the others when a seeded number of new paths appeared under
    # the checkpoints or the export (mid-save, mid-export): points derived from its progress,
    # not from how fast the machine is.
    rng = random.Random(1)
    killed = 0
    for where in (None, work / "checkpoints", export):
        proc = _cli(data, work, export)
        if where is None:
            time.sleep(rng.uniform(0.5, 3.0))
        elif not _wait_for_new_paths(proc, where, rng.randint(1, 6)):
            proc.communicate(timeout=60)  # it finished before that point
            assert proc.returncode == 0
            continue
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        killed += proc.returncode == -signal.SIGKILL
    assert killed >= 2, killed
    proc = _cli(data, work, export)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]

    entries = donefile.read(str(work / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == PARTITIONS  # each once, none skipped
    assert [e["step"] for e in entries] == list(range(1, len(PARTITIONS) + 1))
    for got, want in zip(entries, ref_entries):
        assert got["rows"] == want["rows"] and got["evicted"] == want["evicted"]
        assert got["table_rows"] == want["table_rows"]
        np.testing.assert_allclose(got["metrics"]["auc"], want["metrics"]["auc"], atol=1e-6)
    version, state = _export_state(export)
    assert version == ref_version and sorted(state) == sorted(ref_state)
    for name in ref_state:
        np.testing.assert_allclose(state[name], ref_state[name], atol=1e-5, err_msg=name)
    assert sorted(os.listdir(export)) == [str(v) for v in range(1, len(PARTITIONS) + 1)] + [
        "mxrec_owner.json"]


def test_watch_mode_bad_lines_and_cli_errors(tmp_path):
    data = tmp_path / "data"
    write_stream(str(data), PARTITIONS[:2], rows=60, bad=("20240101/01",))
    proc = _cli(data, tmp_path / "w", tmp_path / "e", ["--max_bad_lines", "0"])
    _, err = proc.communicate(timeout=240)
    assert proc.returncode != 0
    assert "20240101/01/part-00000:6: column d0 is not a valid dense value" in err
    assert len(donefile.read(str(tmp_path / "w" / "donefile.jsonl"))) == 1

    # Allowing it, watch mode picks up the failed partition and one that lands later.
    proc = _cli(data, tmp_path / "w", tmp_path / "e",
                ["--max_bad_lines", "1", "--watch", "--poll_interval", "0.5", "--deadline",
                 "200"])
    deadline = time.time() + 180
    while time.time() < deadline and len(donefile.read(
            str(tmp_path / "w" / "donefile.jsonl"))) < 2:
        time.sleep(0.5)
    write_stream(str(tmp_path / "late"), ["20240101/02"], rows=60, seed=3)
    os.rename(tmp_path / "late" / "20240101" / "02", data / "20240101" / "02")
    while time.time() < deadline and len(donefile.read(
            str(tmp_path / "w" / "donefile.jsonl"))) < 3:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    entries = donefile.read(str(tmp_path / "w" / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == PARTITIONS[:2] + ["20240101/02"]
    assert entries[1]["bad_lines"] == 1 and entries[1]["rows"] == 60

    for argv, needle in [(["--data", str(tmp_path / "missing")], "missing"),
                         (["--data", str(data), "--full_every", "weekly"], "--full_every"),
                         (["--data", str(data), "--nonsense", "1"], "--nonsense")]:
        result = subprocess.run(
            [sys.executable, "-m", "mxrec.streaming", "train", "--workdir",
             str(tmp_path / "x"), *argv], capture_output=True, text=True, timeout=120,
            env=dict(os.environ, PYTHONPATH=REPO))
        assert result.returncode == 2 and needle in result.stderr, result.stderr


def test_help_documents_every_flag():
    from mxrec.streaming.__main__ import build_parser

    parser = build_parser()
    for name in ("train", "replay"):
        sub = parser._subparsers._group_actions[0].choices[name]
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings} has no help"


@pytest.mark.parametrize("kind", ["dlrm", "dcn"])
def test_builtin_models_train_and_export(tmp_path, kind):
    data = tmp_path / "data"
    write_stream(str(data), PARTITIONS[:2], rows=80)
    config = StreamConfig(data=str(data), schema=parsers.parse_schema_spec(SCHEMA_SPEC),
                          workdir=str(tmp_path / "w"), export_base=str(tmp_path / "e"),
                          batch_size=32, validation="batch", full_every=1, progress=False)
    entries = StreamingTrainer(config, models.make_model_fn(
        models.ModelConfig(kind, dim=4, hidden=(8,), vocabulary=2000))).run()
    assert [e["checkpoint"] for e in entries] == ["full", "full"]
    assert all(e["metrics"]["rows"] == 80 for e in entries)
    assert versions.read_manifest(str(tmp_path / "e" / "2"))["kind"] == "full"
    assert os.listdir(tmp_path / "w" / "tensorboard")
    with open(tmp_path / "w" / "donefile.jsonl") as f:
        assert len([json.loads(line) for line in f]) == 2
    if kind == "dcn":
        pytest.importorskip("matplotlib")
        from mxrec.streaming import report

        png = report.write_png(str(tmp_path / "w" / "donefile.jsonl"), str(tmp_path / "r.png"))
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_prepared_step_runs_the_fetch_and_returns_its_tensors():
    """The trainer's step function (executors built when it is made): each call runs the
    fetch's ops once and returns its tensors' values by key, as Session.run of the dict
    would (the ops' None left out); anything but tensors and ops is a TypeError."""
    from mxrec.streaming.trainer import prepared_step  # noqa: PLC0415

    graph = tf.Graph()
    with graph.as_default():
        counter = tf.compat.v1.Variable(0, dtype=tf.int64, use_resource=True)
        bump = counter.assign_add(1).op
        fetch = {"train": bump, "lines": tf.constant(7, tf.int64),
                 "label": tf.constant([0.5, 1.0]), "name": tf.constant([b"a", b"bc"])}
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(counter.initializer)
            step = prepared_step(sess, fetch)
            assert sess.run(counter) == 0  # made, not run
            for calls in (1, 2):
                out = step()
                assert sorted(out) == ["label", "lines", "name"]
                assert out["lines"] == 7
                np.testing.assert_array_equal(out["label"], [0.5, 1.0])
                np.testing.assert_array_equal(out["name"], [b"a", b"bc"])
                assert sess.run(counter) == calls
            # A session without the callable API: the same dict through Session.run.
            plain = prepared_step(types.SimpleNamespace(run=sess.run), fetch)()
            assert sorted(plain) == ["label", "lines", "name"] and plain["lines"] == 7
            assert sess.run(counter) == 3
            with pytest.raises(TypeError, match="tensors and operations only"):
                prepared_step(sess, {"lines": fetch["lines"], "oops": 3})
