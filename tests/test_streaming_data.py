"""mxrec.streaming data source: partitions in time order, the tf.data parsers against a
Python reference on the shared Criteo and Avazu samples, malformed lines, hashing."""

import calendar
import csv
import datetime
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from mxrec.streaming import parsers, partitions
from mxrec.streaming.partitions import list_partitions, partition_at

# The project's shared data sets lie beside the checkout (../shared/data, as in CI), or
# beside the folder of worktrees.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = next((d for d in (os.path.join(os.path.dirname(_ROOT), "shared", "data"),
                         os.path.join(os.path.dirname(os.path.dirname(_ROOT)), "shared", "data"),
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
    assert counter.messages[1] == (
        f"{path}:5: column x is not a valid dense value: empty, or a finite number of at most "
        "31 characters with |x| <= 1e+15 (the schema's dense_limit, --dense-limit)")
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


# ------------------------------------------------------------------ poisoned lines

NUMBER = re.compile(r"[-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?")


def _number(text):
    """Python's float32 of a number of the documented grammar, or None."""
    if len(text) > 31 or not NUMBER.fullmatch(text):
        return None
    with np.errstate(over="ignore"):
        value = np.float32(float(text))
    return value if np.isfinite(value) else None


def _hour(text):
    if not re.fullmatch(r"[0-9]{8}", text):
        return None
    try:
        moment = datetime.datetime(2000 + int(text[:2]), int(text[2:4]), int(text[4:6]),
                                   int(text[6:8]))
    except ValueError:
        return None
    return calendar.timegm(moment.timetuple())


def _field(kind, raw, limit):
    """(valid, value) of one field by Python's own rules: the reference of the parser."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False, None
    if set(text) & set("\0\r\n"):
        return False, None
    if kind == "label":
        value = _number(text)
        return value is not None and 0 <= value <= 1, value
    if kind == "dense":
        value = np.float32(0) if text == "" else _number(text)
        return value is not None and abs(value) <= np.float32(limit), value
    if kind == "uint64":
        ok = re.fullmatch(r"[0-9]{1,20}", text) is not None and int(text) < 2 ** 64
        return ok, int(text) if ok else None
    if kind == "yymmddhh":
        value = _hour(text)
        return value is not None, value
    if kind == "timestamp":
        ok = re.fullmatch(r"-?[0-9]{1,18}", text) is not None and 0 <= int(text) <= 4102444800
        return ok, int(text) if ok else None
    return True, text


def _reference_parse(lines, schema):
    """[(first column at fault or -1, or None when good, values)] of each line."""
    out = []
    for line in lines:
        fields = line.split(schema.delimiter.encode())
        if len(fields) != len(schema.columns):
            out.append((-1, None))
            continue
        checked = [_field(c.kind, f, schema.dense_limit) for c, f in zip(schema.columns, fields)]
        bad = [i for i, (ok, _) in enumerate(checked) if not ok]
        out.append((bad[0] if bad else None, [v for _, v in checked]))
    return out


def _pick(rng, items):
    return items[int(rng.integers(0, len(items)))]


GOOD = {
    "label": lambda rng: _pick(rng, ["0", "1", "0.25", "1.0"]),
    "dense": lambda rng: _pick(rng, ["", str(int(rng.integers(-5, 100))), "2.5", "-0.125",
                                     "99.5"]),
    "uint64": lambda rng: str(int(rng.integers(0, 2 ** 63)) * 2 + int(rng.integers(0, 2))),
    "yymmddhh": lambda rng: f"{rng.integers(0, 100):02d}{rng.integers(1, 13):02d}"
                            f"{rng.integers(1, 29):02d}{rng.integers(0, 24):02d}",
    "timestamp": lambda rng: str(int(rng.integers(0, 4102444801))),
    "categorical": lambda rng: _pick(rng, ["a", "", "é", "x y", "\U0001F600", "7f3a"]),
    "skip": lambda rng: _pick(rng, ["", "whatever"]),
}
# Values a poisoned partition holds, by kind (some are good: the reference decides).
POISON = {
    "label": ["2", "-0.5", "1e39", "nan", "inf", "1" * 40, "0x1", " 1", "", "1.0000001",
              "0.99999999999", "+1", "1."],
    "dense": ["1e3", "1e15", "-1e15", "1000000000000000", "1e39", "-1e39", "1" * 40,
              "9" * 31, "9" * 32, "1.5e15", "nan", "NaN", "inf", "-inf", "1e400", "abc",
              "0x10", "1e-50", ".", "-", "+5", ".5", "5.", "1e", "--1", " 1",
              "1e0000000000000000000000005", "0." + "0" * 28 + "1"],
    "uint64": ["18446744073709551616", "99999999999999999999", "123456789012345678901", "-1",
               "", "1.0", "18446744073709551615", "0"],
    "yymmddhh": ["14023000", "14133100", "14010124", "16022900", "15022900", "14043100",
                 "00022900", "1401010", "", "99123123"],
    "timestamp": ["-1", "4102444801", "4102444800", "9" * 18, "9" * 19, "1e9", "", "0"],
    "categorical": [b"\xff", b"a\x00b", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80",
                    b"\xe2\x82", "x" * 100000, "ok"],
    "skip": [b"\xff", b"\x00", "fine"],
}
LINE_POISON = [b"", b",", b"\t", b"," * 100000, b"\x00", b"1" * (1 << 20), b"\xff\xfe",
               b"\t" * 5 + b"\xff"]


def _poisoned_lines(schema, count, rng):
    lines = []
    for _ in range(count):
        fields = [GOOD[c.kind](rng) for c in schema.columns]
        for _ in range(int(rng.integers(0, 3))):
            index = int(rng.integers(0, len(fields)))
            fields[index] = _pick(rng, POISON[schema.columns[index].kind])
        line = schema.delimiter.encode().join(
            f if isinstance(f, bytes) else str(f).encode() for f in fields)
        if rng.random() < 0.05:
            line = _pick(rng, LINE_POISON)
        elif rng.random() < 0.03:
            line += schema.delimiter.encode() + b"extra"
        lines.append(bytes(line))
    return lines


@pytest.mark.parametrize("spec,delimiter,limit", [
    ("id:uint64,y:label,h:yymmddhh,x0:dense,x1:dense,c0:categorical,s:skip,c1:categorical",
     ",", parsers.DEFAULT_DENSE_LIMIT),
    ("y:label,x0:dense,t:timestamp,c0:categorical,x1:dense", "\t", float("inf")),
    ("y:label,x0:dense,t:timestamp,c0:categorical,x1:dense", "\t", 100.0),
])
def test_poisoned_lines_are_counted_never_a_failed_batch(tmp_path, spec, delimiter, limit):
    """Random lines with poisoned fields (non-finite, too long, out of range, invalid
    dates, non-UTF-8, NUL, wrong field counts, megabyte lines): every batch parses, the bad
    lines and their first column at fault are Python's, the good lines' values too."""
    schema = parsers.parse_schema_spec(spec, delimiter, dense_limit=limit)
    rng = np.random.default_rng(len(spec) + int(min(limit, 1e9)))
    lines = _poisoned_lines(schema, 700, rng)
    files = [tmp_path / "part-0", tmp_path / "part-1"]
    files[0].write_bytes(b"\n".join(lines[:400]) + b"\n")
    files[1].write_bytes(b"\n".join(lines[400:]))
    batches = _run(parsers.make_dataset([str(f) for f in files], schema, 64))

    want = _reference_parse(lines, schema)
    where = [(0, n + 1) for n in range(400)] + [(1, n + 1) for n in range(300)]
    bad = [(f, n, c) for (f, n), (c, _) in zip(where, want) if c is not None]
    assert 60 < len(bad) < 500  # both kinds of line are there
    got = list(zip(_concat(batches, "bad_file").tolist(), _concat(batches, "bad_line").tolist(),
                   _concat(batches, "bad_column").tolist()))
    assert got == bad
    assert sum(int(b["lines"]) for b in batches) == len(lines)

    good = [values for c, values in want if c is None]
    kinds = [c.kind for c in schema.columns]
    np.testing.assert_array_equal(_concat(batches, "label"),
                                  [v[kinds.index("label")] for v in good])
    dense = [i for i, k in enumerate(kinds) if k == "dense"]
    np.testing.assert_array_equal(_concat(batches, "dense"),
                                  np.array([[v[i] for i in dense] for v in good], np.float32))
    assert np.isfinite(_concat(batches, "dense")).all()
    if "uint64" in kinds:
        np.testing.assert_array_equal(
            _concat(batches, "row_id"),
            np.array([v[kinds.index("uint64")] for v in good], np.uint64).view(np.int64))
    time_kind = "yymmddhh" if "yymmddhh" in kinds else "timestamp"
    np.testing.assert_array_equal(_concat(batches, "time"),
                                  [v[kinds.index(time_kind)] for v in good])
    categorical = [i for i, k in enumerate(kinds) if k == "categorical"]
    np.testing.assert_array_equal(_concat(batches, "sparse"),
                                  _reference_ids(good, categorical))


def test_every_rule_has_its_message(tmp_path):
    schema = parsers.parse_schema_spec(
        "id:uint64,y:label,h:yymmddhh,x:dense,c:categorical", ",", dense_limit=1e6)
    lines = ["1,1,14010100,2,a", "1,1,14010100,2e6,a", "1,2,14010100,2,a",
             "1,1,14023000,2,a", "18446744073709551616,1,14010100,2,a", "1,1,14010100,2,\xff",
             "1,1"]
    path = tmp_path / "part-0"
    path.write_bytes(b"\n".join(line.encode("latin-1") for line in lines) + b"\n")
    batches = _run(parsers.make_dataset([str(path)], schema, 4))
    counter = parsers.BadLineCounter([str(path)], schema, limit=10)
    for b in batches:
        counter.add(b["bad_file"], b["bad_line"], b["bad_column"])
    assert [m.split(": ", 1)[1] for m in counter.messages] == [
        "column x is not a valid dense value: empty, or a finite number of at most 31 "
        "characters with |x| <= 1e+06 (the schema's dense_limit, --dense-limit)",
        "column y is not a valid label value: a number of at most 31 characters in [0, 1]",
        "column h is not a valid yymmddhh value: YYMMDDHH: a date that exists and an hour "
        "00-23",
        "column id is not a valid uint64 value: a decimal integer in [0, 2**64 - 1]",
        "column c is not a valid categorical value: UTF-8 text without NUL bytes or line "
        "breaks",
        "not 5 fields"]
    assert [m.split(": ", 1)[0] for m in counter.messages] == [
        f"{path}:{n}" for n in (2, 3, 4, 5, 6, 7)]
    schema = parsers.parse_schema_spec("y:label,t:timestamp", ",")
    assert "seconds since the epoch in [0, 4102444800]" in parsers.BadLineCounter(
        [str(path)], schema, 0).message(0, 1, 1)


def test_dense_limit_and_delimiter_settings():
    assert parsers.CRITEO_TSV.dense_limit == parsers.DEFAULT_DENSE_LIMIT == 1e15
    assert parsers.named_schema("criteo_csv", dense_limit=1e20).dense_limit == 1e20
    for limit in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="dense_limit must be > 0"):
            parsers.parse_schema_spec("y:label,x:dense", dense_limit=limit)
    for limit in ("1e15", None, True):
        with pytest.raises(TypeError, match="dense_limit must be a number"):
            parsers.parse_schema_spec("y:label,x:dense", dense_limit=limit)
    for delimiter in (".", "e", "-", "7", "\n", "\0"):
        with pytest.raises(ValueError, match="can be part of a number or end a line"):
            parsers.parse_schema_spec("y:label,x:dense", delimiter)
    for delimiter in ("é", "ab", ""):
        with pytest.raises(ValueError, match="one ASCII character"):
            parsers.parse_schema_spec("y:label,x:dense", delimiter)


def test_every_number_of_the_length_bound_converts():
    """Numbers of the grammar up to MAX_NUMBER_CHARS characters convert as Python converts
    them (TensorFlow 2.15 fails the op on one character more; the bound makes longer ones
    bad lines under every version)."""
    rng = np.random.default_rng(5)
    texts = ["9" * 31, "-" + "9" * 30, "0." + "0" * 28 + "1", "-1." + "0" * 21 + "1e-308",
             "1e0000000000000000000000000001", ".5", "+5", "1e38", "3.4028235e38", "1e39"]
    for _ in range(2000):
        digits = "".join(_pick(rng, "0123456789") for _ in range(int(rng.integers(1, 30))))
        cut = int(rng.integers(0, len(digits)))
        text = _pick(rng, ["", "-", "+"]) + digits[:cut] + "." + digits[cut:]
        if rng.random() < 0.5:
            text += f"e{int(rng.integers(-60, 60))}"
        texts.append(text[:parsers.MAX_NUMBER_CHARS].rstrip("e-+."))
    texts = [t for t in texts if NUMBER.fullmatch(t)]
    assert max(len(t) for t in texts) == parsers.MAX_NUMBER_CHARS
    with tf.compat.v1.Session() as sess:
        got = sess.run(tf.strings.to_number(texts, tf.float32))
    with np.errstate(over="ignore"):
        want = np.array([np.float32(float(t)) for t in texts])
    # TensorFlow 2.15 flushes subnormal values to 0, 2.21 keeps them.
    normal = np.abs(want) >= np.finfo(np.float32).tiny
    np.testing.assert_array_equal(got[normal], want[normal])
    assert ((got[~normal] == 0) | (got[~normal] == want[~normal])).all()
    assert (~normal).sum() < len(texts) // 4


def test_partition_names_that_are_no_date_or_hour_are_skipped_once(tmp_path, caplog):
    for name in ("20240101/00", "20240229", "20241301/00", "20240230", "20240101/24",
                 "20240101/7", "2024-01-02", "00000101", "20240102/123", "20240101/ab"):
        _touch(tmp_path / name / "part-0", "x")
        _touch(tmp_path / name / "_SUCCESS")
    _touch(tmp_path / "_tmp" / "x")
    _touch(tmp_path / "20240101" / ".staging" / "_SUCCESS")
    with caplog.at_level("WARNING"):
        names = [p.name for p in list_partitions(str(tmp_path))]
        again = [p.name for p in list_partitions(str(tmp_path))]
    assert names == again == ["20240101/00", "20240229"]
    skipped = sorted(r.getMessage() for r in caplog.records if "skipping" in r.getMessage())
    assert skipped == sorted(
        f"streaming: skipping folder {tmp_path}/{name}: {why}" for name, why in [
            ("20241301", "not a date yyyyMMdd (month must be in 1..12)"),
            ("20240230", "not a date yyyyMMdd (day is out of range for month)"),
            ("2024-01-02", "not a date yyyyMMdd"),
            ("00000101", "not a date yyyyMMdd (year 0 is out of range)"),
            ("20240101/24", "not an hour 00-23"), ("20240101/7", "not an hour 00-23"),
            ("20240102/123", "not an hour 00-23")])
    assert partitions.unready(str(tmp_path))[0] == (
        "folders that are no date yyyyMMdd or hour 00-23 (00000101, 2024-01-02, 20240230, ... "
        "(7 in all))")
    for name in ("20241301/00", "20240101/24", "20240230"):
        with pytest.raises(ValueError, match=re.escape(repr(name))):
            partition_at(str(tmp_path), name)


def test_line_breaks_inside_fields_are_bad_lines_not_a_failed_batch():
    """TextLineDataset drops CRs, but parse_lines may be given any strings; a CR or LF
    inside a field would fail tf.io.decode_csv's batch."""
    schema = parsers.parse_schema_spec("y:label,c:categorical,s:skip", ",")
    lines = ["1,a,b", "1,a\rb,c", "0,a,b\n", "0,\r,x", "1,z,z"]
    with tf.compat.v1.Session() as sess:
        out = sess.run(parsers.parse_lines(tf.constant(lines), tf.zeros([5], tf.int32),
                                           tf.range(1, 6, dtype=tf.int64), schema))
    assert out["bad_line"].tolist() == [2, 3, 4] and out["bad_column"].tolist() == [1, 2, 1]
    assert out["label"].tolist() == [1.0, 1.0] and out["lines"] == 5
