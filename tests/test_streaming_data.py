"""mxrec.streaming data source: partitions in time order, the tf.data parsers against a
Python reference on the shared Criteo and Avazu samples, malformed lines, hashing."""

import calendar
import csv
import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec.streaming import parsers
from mxrec.streaming.partitions import list_partitions, partition_at

# The project's shared data sets lie beside the checkout (../shared/data), as in CI.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = next((d for d in (os.path.join(os.path.dirname(_ROOT), "shared", "data"),
                         os.path.join(_ROOT, "shared", "data")) if os.path.isdir(d)),
            os.path.join(os.path.dirname(_ROOT), "shared", "data"))
needs_data = pytest.mark.skipif(not os.path.isfile(os.path.join(DATA, "criteo_sample.csv")),
                                reason="shared/data samples not present")


def _run(dataset):
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    out = []
    with tf.compat.v1.Session() as sess:
        while True:
            try:
                out.append(sess.run(batch))
            except tf.errors.OutOfRangeError:
                return out


def _concat(batches, key):
    return np.concatenate([b[key] for b in batches if key in b])


def _fingerprints(strings):
    """FarmHash Fingerprint64 of each string by tf.fingerprint (another op than the parser's)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        raw = sess.run(tf.fingerprint(tf.constant(list(strings), tf.string)))
    return np.frombuffer(raw.tobytes(), "<u8")


def _reference_ids(rows, columns):
    """Python: (feature index << 56) | (fingerprint64 mod 2**56), as int64."""
    values = [row[c] for row in rows for c in columns]
    fps = _fingerprints(values).reshape(len(rows), len(columns)) % (1 << 56)
    salts = np.array([i << 56 for i in range(len(columns))], np.uint64)
    return (fps.astype(np.uint64) | salts).view(np.int64)


@needs_data
def test_criteo_sample_every_field_against_python():
    path = os.path.join(DATA, "criteo_sample.csv")
    batches = _run(parsers.make_dataset([path], parsers.named_schema("criteo_csv"), 33))
    with open(path) as f:
        rows = list(csv.reader(f))[1:]
    assert sum(b["lines"] for b in batches) == len(rows) == 200
    np.testing.assert_array_equal(_concat(batches, "label"), [float(r[0]) for r in rows])
    dense = np.array([[float(v) if v else 0.0 for v in r[1:14]] for r in rows], np.float32)
    assert any(v == "" for r in rows for v in r[1:14]) and (dense < 0).any()
    np.testing.assert_array_equal(_concat(batches, "dense"), dense)
    assert any(v == "" for r in rows for v in r[14:])  # empty categoricals are IDs too
    np.testing.assert_array_equal(_concat(batches, "sparse"),
                                  _reference_ids(rows, list(range(14, 40))))
    assert len(_concat(batches, "bad_line")) == 0


@needs_data
def test_criteo_tsv_form_equals_csv_form(tmp_path):
    with open(os.path.join(DATA, "criteo_sample.csv")) as f:
        rows = list(csv.reader(f))[1:]
    tsv = tmp_path / "part-0"
    tsv.write_text("".join("\t".join(r) + "\n" for r in rows))
    a = _run(parsers.make_dataset([str(tsv)], parsers.CRITEO_TSV, 64))
    b = _run(parsers.make_dataset([os.path.join(DATA, "criteo_sample.csv")],
                                  parsers.named_schema("criteo_csv"), 64))
    for key in ("label", "dense", "sparse"):
        np.testing.assert_array_equal(_concat(a, key), _concat(b, key))


@needs_data
def test_avazu_sample_every_field_against_python():
    path = os.path.join(DATA, "avazu_sample.csv")
    batches = _run(parsers.make_dataset([path], parsers.AVAZU_CSV, 16))
    with open(path) as f:
        rows = list(csv.reader(f))[1:]
    ids = np.array([int(r[0]) for r in rows], np.uint64)
    assert (ids > np.uint64(2 ** 63 - 1)).any()  # some IDs above the signed range
    np.testing.assert_array_equal(_concat(batches, "row_id"), ids.view(np.int64))
    np.testing.assert_array_equal(_concat(batches, "label"), [float(r[1]) for r in rows])
    hours = [calendar.timegm((2000 + int(r[2][:2]), int(r[2][2:4]), int(r[2][4:6]),
                              int(r[2][6:8]), 0, 0)) for r in rows]
    np.testing.assert_array_equal(_concat(batches, "time"), hours)
    np.testing.assert_array_equal(_concat(batches, "sparse"),
                                  _reference_ids(rows, list(range(3, 24))))


def test_uint64_edges_and_malformed_lines(tmp_path):
    schema = parsers.parse_schema_spec("id:uint64,y:label,x:dense,c:categorical",
                                       delimiter=",")
    lines = ["18446744073709551615,1,2.5,a",     # 1: 2**64 - 1
             "18446744073709551616,1,2.5,a",     # 2: 2**64: out of range
             "9223372036854775808,0,,b",         # 3: 2**63
             "0,1,-3,",                          # 4
             "1,1,abc,c",                        # 5: dense not a number
             "1,1,2",                            # 6: too few fields
             "99999999999999999999,1,1,d",       # 7: 20 digits above the range
             "12,x,1,d",                         # 8: label not a number
             "1,1,1,a,extra"]                    # 9: too many fields
    path = tmp_path / "part-0"
    path.write_text("\n".join(lines) + "\n")
    batches = _run(parsers.make_dataset([str(path)], schema, 4))
    np.testing.assert_array_equal(
        _concat(batches, "row_id"),
        np.array([2 ** 64 - 1, 2 ** 63, 0], np.uint64).view(np.int64))
    np.testing.assert_array_equal(_concat(batches, "dense")[:, 0], [2.5, 0.0, -3.0])
    np.testing.assert_array_equal(_concat(batches, "bad_line"), [2, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(_concat(batches, "bad_column"), [0, 2, -1, 0, 1, -1])
    counter = parsers.BadLineCounter([str(path)], schema, limit=6)
    for b in batches:
        counter.add(b["bad_file"], b["bad_line"], b["bad_column"])
    assert counter.count == 6
    assert counter.messages[1] == f"{path}:5: column x is not a valid dense value"
    assert counter.messages[2] == f"{path}:6: not 4 fields"
    strict = parsers.BadLineCounter([str(path)], schema, limit=1)
    with pytest.raises(parsers.MalformedDataError, match=rf"{path}:5: column x"):
        for b in batches:
            strict.add(b["bad_file"], b["bad_line"], b["bad_column"])


def test_header_line_numbers_and_files_in_order(tmp_path):
    schema = parsers.parse_schema_spec("y:label,c:categorical", delimiter=",", header=True)
    (tmp_path / "a").write_text("y,c\n1,u\nbad\n0,v\n")
    (tmp_path / "b").write_text("y,c\n0,w\n")
    batches = _run(parsers.make_dataset([str(tmp_path / "a"), str(tmp_path / "b")], schema, 2))
    np.testing.assert_array_equal(_concat(batches, "label"), [1, 0, 0])
    np.testing.assert_array_equal(_concat(batches, "bad_line"), [3])
    np.testing.assert_array_equal(_concat(batches, "bad_file"), [0])


def test_features_never_share_ids():
    values = tf.constant([["same", "same", "same"]])
    with tf.compat.v1.Session() as sess:
        ids = sess.run(parsers.hash_categorical(values, [0, 1, 200 - 256]))
    assert len(set(ids[0].tolist())) == 3
    assert [(int(i) >> 56) & 0xFF for i in ids[0]] == [0, 1, 200]


def test_schema_errors():
    with pytest.raises(ValueError, match="exactly one label"):
        parsers.parse_schema_spec("c:categorical")
    with pytest.raises(ValueError, match="kind must be one of"):
        parsers.parse_schema_spec("y:label,c:word")
    with pytest.raises(ValueError, match="unknown format 'parquet'"):
        parsers.named_schema("parquet")


def _touch(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_partitions_in_time_order_with_done_markers(tmp_path):
    for name in ("20240102/00", "20240101/23", "20240101/05", "20240103"):
        _touch(tmp_path / name / "part-1", "x")
        _touch(tmp_path / name / "part-0", "x")
        _touch(tmp_path / name / "_SUCCESS")
    _touch(tmp_path / "20240102" / "01" / "part-0", "x")  # no marker: not ready
    _touch(tmp_path / "20240102" / "02" / "part-0", "x")
    _touch(tmp_path / "20240102" / "02" / "DONE")
    _touch(tmp_path / "notes" / "x")
    found = list_partitions(str(tmp_path))
    assert [p.name for p in found] == ["20240101/05", "20240101/23", "20240102/00", "20240103"]
    assert [os.path.basename(f) for f in found[0].files] == ["part-0", "part-1"]
    assert found[1].timestamp == calendar.timegm((2024, 1, 1, 23, 0, 0))
    assert [p.name for p in list_partitions(str(tmp_path), done_marker="DONE")] == \
        ["20240102/02"]
    assert partition_at(str(tmp_path), "20240102/01") is None
    with pytest.raises(FileNotFoundError, match="nowhere"):
        list_partitions(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="yyyyMMdd"):
        partition_at(str(tmp_path), "2024-01-01")


def test_parsers_build_in_a_graph_after_an_eager_import(tmp_path):
    """The CLI imports the parsers before it turns eager execution off."""
    import subprocess
    import sys

    path = tmp_path / "part-0"
    path.write_text("1\tx\t874724710\n0\ty\t874724711\n")
    code = ("import sys, tensorflow as tf\n"
            "from mxrec.streaming import parsers\n"
            "tf.compat.v1.disable_eager_execution()\n"
            "s = parsers.parse_schema_spec('y:label,c:categorical,t:timestamp')\n"
            "b = tf.compat.v1.data.make_one_shot_iterator(\n"
            "    parsers.make_dataset([sys.argv[1]], s, 8)).get_next()\n"
            "print(tf.compat.v1.Session().run(b['time']).tolist())\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                            text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[874724710, 874724711]"
