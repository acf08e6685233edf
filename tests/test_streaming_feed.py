"""feed.PartitionFeed: one pipeline for every partition, the same batches as make_dataset.

References: parsers.make_dataset drained per partition (its batches, exactly), and Python's
own split of the files' bytes for the line counts.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec.streaming import parsers
from mxrec.streaming.feed import PartitionFeed

tf.compat.v1.disable_eager_execution()

SCHEMA = parsers.parse_schema_spec("label:label,i1:dense,c1:categorical,c2:categorical",
                                   delimiter=",")
HEADER_SCHEMA = parsers.parse_schema_spec("label:label,i1:dense,c1:categorical,c2:categorical",
                                          delimiter=",", header=True)


def _write(path, text: bytes) -> str:
    with open(path, "wb") as f:
        f.write(text)
    return str(path)


def _records(rng, n, bad_every=0):
    out = []
    for i in range(n):
        if bad_every and i % bad_every == bad_every - 1:
            out.append(b"x,not a number,a")  # malformed: 3 fields
        else:
            out.append(b"%d,%d,c%d,d%d" % (rng.integers(0, 2), rng.integers(0, 50),
                                           rng.integers(0, 9), rng.integers(0, 9)))
    return out


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    made = {
        "trailing": b"\n".join(_records(rng, 23)) + b"\n",
        "no_trailing": b"\n".join(_records(rng, 17, bad_every=5)),
        "crlf": b"\r\n".join(_records(rng, 9)) + b"\r\n",
        "empty": b"",
        "one_newline": b"\n",  # one empty line (malformed)
        "blank_inside": b"\n".join(_records(rng, 4)) + b"\n\n" + b"\n".join(_records(rng, 3)),
        "exact": b"\n".join(_records(rng, 16)) + b"\n",  # a multiple of the batch size
    }
    return {name: _write(tmp_path / name, text) for name, text in made.items()}


def _lines_by_python(path, header):
    data = open(path, "rb").read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return max(len(lines) - 1, 0) if header else len(lines)


def _drain(sess, batch):
    out = []
    while True:
        try:
            out.append(sess.run(batch))
        except tf.errors.OutOfRangeError:
            return out


@pytest.mark.parametrize("piece", [1, 2, 7, 64, parsers.COUNT_PIECE])
def test_count_lines_across_pieces(files, tmp_path, monkeypatch, piece):
    """Pieces smaller than a line, ending at a newline or inside a line, the last one
    partial; a local path and the same file through a scheme (tf.io.gfile)."""
    monkeypatch.setattr(parsers, "COUNT_PIECE", piece)
    for header in (False, True):
        for name, path in files.items():
            expected = _lines_by_python(path, header)
            assert parsers.count_lines(path, header) == expected, (name, header, piece)
            assert parsers.count_lines("file://" + os.path.abspath(path), header) == expected


def test_count_lines_matches_text_line_dataset(files):
    for header in (False, True):
        for name, path in files.items():
            expected = _lines_by_python(path, header)
            assert parsers.count_lines(path, header) == expected, (name, header)
            with tf.Graph().as_default():
                ds = tf.data.TextLineDataset(path)
                if header:
                    ds = ds.skip(1)
                got = _drain(tf.compat.v1.Session(),
                             tf.compat.v1.data.make_one_shot_iterator(ds).get_next())
            assert len(got) == expected, (name, header)


def test_batch_lines_slices():
    assert parsers.batch_lines(0, 4) == []
    assert parsers.batch_lines(9, 4) == [4, 4, 1]
    assert parsers.batch_lines(8, 4) == [4, 4]
    # 2 ranks: the slices of each batch add up to it; an empty slice still counts a step
    assert parsers.batch_lines(9, 4, 0, 2) == [2, 2, 0]
    assert parsers.batch_lines(9, 4, 1, 2) == [2, 2, 1]
    with pytest.raises(ValueError, match="lines"):
        parsers.batch_lines(-1, 4)


@pytest.mark.parametrize("rank,size,schema", [(0, 1, SCHEMA), (0, 2, SCHEMA), (1, 2, SCHEMA),
                                              (2, 3, HEADER_SCHEMA)])
def test_feed_equals_make_dataset_per_partition(files, rank, size, schema):
    partitions = [[files["trailing"], files["empty"], files["no_trailing"]],
                  [],  # a partition without files
                  [files["empty"]],  # without lines
                  [files["crlf"], files["one_newline"], files["blank_inside"]],
                  [files["exact"]]]
    with tf.Graph().as_default():
        names = tf.compat.v1.placeholder(tf.string, [None])
        reference = tf.compat.v1.data.make_initializable_iterator(
            parsers.make_dataset(names, schema, 4, rank=rank, size=size))
        ref_batch = reference.get_next()
        feed = PartitionFeed(schema, 4, rank, size, stamp_time=True)
        batch = feed.get_next()
        with tf.compat.v1.Session() as sess:
            sess.run(feed.initializer)
            for stamp, partition in enumerate(partitions, start=100):
                sess.run(reference.initializer, {names: partition})
                want = _drain(sess, ref_batch)
                steps, lines = feed.start(sess, partition, stamp)
                assert steps == len(want)
                assert lines == sum(int(b["lines"]) for b in want)
                for expected in want:
                    got = sess.run(batch)
                    np.testing.assert_array_equal(got["time"],
                                                  np.full(len(got["label"]), stamp))
                    assert set(got) == set(expected) | {"time"}
                    for key, value in expected.items():
                        np.testing.assert_array_equal(got[key], value, err_msg=key)
            sess.run(feed.close_op)
            # closed and drained: the pipeline stops (the dequeue inside it fails)
            with pytest.raises((tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError),
                               match="closed"):
                sess.run(batch)


def test_feed_missing_file_is_an_error(tmp_path):
    with tf.Graph().as_default():
        feed = PartitionFeed(SCHEMA, 4)
        with tf.compat.v1.Session() as sess:
            sess.run(feed.initializer)
            with pytest.raises(tf.errors.NotFoundError):
                feed.start(sess, [os.path.join(tmp_path, "absent")], 0)


class _PlainSession:
    """A session without the callable-from-options API (the feed falls back to
    Session.make_callable)."""

    def __init__(self, sess):
        self._sess = sess

    def run(self, *args, **kwargs):
        return self._sess.run(*args, **kwargs)

    def make_callable(self, *args, **kwargs):
        return self._sess.make_callable(*args, **kwargs)


@pytest.mark.parametrize("plain", [False, True])
def test_prepared_enqueue_feeds_every_partition(files, plain):
    # The enqueue is made once per session (prepare, before the first partition), on both
    # session APIs, and every partition's batches and counts come through it.
    partitions = [[files["trailing"], files["no_trailing"]], [files["exact"]],
                  [files["crlf"]]]
    with tf.Graph().as_default():
        names = tf.compat.v1.placeholder(tf.string, [None])
        reference = tf.compat.v1.data.make_initializable_iterator(
            parsers.make_dataset(names, SCHEMA, 4))
        ref_batch = reference.get_next()
        feed = PartitionFeed(SCHEMA, 4, stamp_time=True)
        batch = feed.get_next()
        with tf.compat.v1.Session() as real:
            sess = _PlainSession(real) if plain else real
            sess.run(feed.initializer)
            feed.prepare(sess)
            made = feed._enqueue_fn
            for stamp, partition in enumerate(partitions, start=7):
                sess.run(reference.initializer, {names: partition})
                want = _drain(sess, ref_batch)
                assert feed.start(sess, partition, stamp) == (
                    len(want), sum(int(b["lines"]) for b in want))
                for expected in want:
                    got = sess.run(batch)
                    np.testing.assert_array_equal(got["time"], np.full(len(got["label"]), stamp))
                    np.testing.assert_array_equal(got["label"], expected["label"])
            assert feed._enqueue_fn is made
            sess.run(feed.close_op)
