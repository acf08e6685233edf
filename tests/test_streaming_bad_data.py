"""A poisoned stream through `python -m mxrec.streaming train`: lines with non-finite,
unparseable, out-of-range or non-UTF-8 values are counted and skipped (the partitions
train, the model stays finite), folders named no date or hour are skipped with one warning
each while the trainer watches, and --dense-limit moves the dense range."""

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from mxrec.export import saved_model as serving
from mxrec.serving import versions
from mxrec.serving.predictor import ModelInstance
from mxrec.streaming import donefile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = "y:label,d0:dense,d1:dense,c0:categorical,c1:categorical"


def _good_lines(rng, rows):
    return [f"{rng.integers(0, 2)}\t{rng.integers(0, 50)}\t{rng.integers(0, 9)}\t"
            f"v{rng.integers(0, 30)}\tw{rng.integers(0, 30)}".encode() for _ in range(rows)]


# (line, the column the donefile's example names); the first two are the issue's.
POISONED = [
    (b"1\t1e39\t3\ta\tb", "column d0 is not a valid dense value"),
    (b"0\t" + b"1" * 40 + b"\t1\ta\tb", "column d0 is not a valid dense value"),
    (b"1\t2\tnan\ta\tb", "column d1 is not a valid dense value"),
    (b"1\t2\t2e16\ta\tb", "column d1 is not a valid dense value"),
    (b"2\t1\t1\ta\tb", "column y is not a valid label value"),
    (b"1\t1\t1\t\xff\xfe\tb", "column c0 is not a valid categorical value"),
    (b"1\t1\t1\ta\tb\x00", "column c1 is not a valid categorical value"),
    (b"\t" * 30000, "not 5 fields"),
]


def _write(folder, lines):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "part-00000"), "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    open(os.path.join(folder, "_SUCCESS"), "w").close()


def _newest_version(export_base):
    newest = versions.list_versions(str(export_base))[-1]
    return os.path.join(str(export_base), str(newest))


def test_poisoned_lines_and_bad_folder_names_through_the_cli(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    first = _good_lines(rng, 60)
    first.insert(2, POISONED[0][0])
    _write(data / "20240101" / "00", first)
    second = _good_lines(rng, 60)
    for offset, (line, _) in enumerate(POISONED[1:]):
        second.insert(3 + 4 * offset, line)
    second.insert(1, b"1\t2\t5e15\tbig\tvalue")  # within --dense-limit 1e16
    _write(data / "20240101" / "01", second)
    for name in ("20241301/00", "20240230", "20240101/24", "2024-01-03"):
        _write(data / name, _good_lines(rng, 10))
    _write(data / "20240102", _good_lines(rng, 40))
    result = subprocess.run(
        [sys.executable, "-m", "mxrec.streaming", "train", "--data", str(data), "--model-dir",
         str(tmp_path / "model"), "--export-base", str(tmp_path / "export"), "--schema",
         SCHEMA, "--max-bad-lines", "10", "--dense-limit", "1e16", "--batch-size", "16",
         "--vocabulary", "1000", "--dim", "4", "--hidden", "8", "--no-progress",
         "--no-tensorboard", "--threads", "1", "--watch", "--poll-interval", "0.3",
         "--deadline", "4"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["partitions"] == 3

    entries = donefile.read(str(tmp_path / "model" / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == ["20240101/00", "20240101/01", "20240102"]
    assert [e["bad_lines"] for e in entries] == [1, len(POISONED) - 1, 0]
    assert [e["rows"] for e in entries] == [60, 61, 40]
    assert entries[0]["bad_line_examples"][0].startswith(
        f"{data}/20240101/00/part-00000:3: {POISONED[0][1]}: ")
    examples = entries[1]["bad_line_examples"]
    for n, (example, (_, column)) in enumerate(zip(examples, POISONED[1:])):
        assert example.startswith(f"{data}/20240101/01/part-00000:{5 + 4 * n}: {column}")

    # Each folder is named once, though the watching trainer listed the root many times.
    for name, why in [("20241301", "not a date yyyyMMdd (month must be in 1..12)"),
                      ("20240230", "not a date yyyyMMdd (day is out of range for month)"),
                      ("2024-01-03", "not a date yyyyMMdd"),
                      ("20240101/24", "not an hour 00-23")]:
        assert result.stderr.count(f"skipping folder {data}/{name}: {why}") == 1, result.stderr

    # The model the last version serves is finite, and so are its answers.
    version = _newest_version(tmp_path / "export")
    reader = tf.train.load_checkpoint(os.path.join(version, "variables", "variables"))
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if np.asarray(value).dtype.kind == "f":
            assert np.isfinite(value).all(), name
    for table, arrays in serving.exported_tables(version).items():
        assert np.isfinite(arrays["embeddings"]).all(), table
    model = ModelInstance(version)
    try:
        answer = model.predict({"d0": [12.0, 5e15, 3.0], "d1": [0.0, 1.0, 2.0],
                                "c0": ["v1", "big", "a"], "c1": ["w2", "value", "b"]}, "raw")
    finally:
        model.close()
    prob = np.asarray(next(iter(answer.values())))
    assert prob.shape == (3,) and np.isfinite(prob).all()


def test_a_first_line_that_is_no_utf8_is_a_bad_line_not_a_crash(tmp_path):
    """The CLI looks at the first line to tell CSV from TSV; a poisoned one (invalid UTF-8,
    no line end for a megabyte) is the parser's bad line, not a UnicodeDecodeError."""
    rng = np.random.default_rng(1)
    lines = ["\t".join([str(rng.integers(0, 2))] + [str(rng.integers(0, 9)) for _ in range(13)]
                       + [f"{rng.integers(0, 1 << 32):08x}" for _ in range(26)]).encode()
             for _ in range(20)]
    _write(tmp_path / "data" / "20240101", [b"\xff\xfe" + b"x" * (1 << 20)] + lines)
    result = subprocess.run(
        [sys.executable, "-m", "mxrec.streaming", "train", "--data", str(tmp_path / "data"),
         "--model-dir", str(tmp_path / "model"), "--max-bad-lines", "1", "--batch-size", "8",
         "--vocabulary", "1000", "--dim", "4", "--hidden", "8", "--no-progress",
         "--no-tensorboard", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    (entry,) = donefile.read(str(tmp_path / "model" / "donefile.jsonl"))
    assert entry["bad_lines"] == 1 and entry["rows"] == 20
    assert entry["bad_line_examples"] == [f"{tmp_path}/data/20240101/part-00000:1: not 40 fields"]
