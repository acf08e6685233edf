"""parsers.make_dataset(rank=, size=): each rank's slices of the global batches, against the
batches one process reads (NumPy concatenation): the same number of batches on every rank,
the slices in rank order make each batch, line numbers kept, empty slices where a batch has
fewer lines than ranks; bad rank arguments refused."""

import numpy as np
import pytest
import tensorflow as tf

from mxrec.streaming import parsers

SCHEMA = parsers.parse_schema_spec("y:label,d0:dense,c0:categorical")


def _batches(files, batch_size, rank=0, size=1):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        batch = tf.compat.v1.data.make_one_shot_iterator(parsers.make_dataset(
            files, SCHEMA, batch_size, rank=rank, size=size)).get_next()
        out = []
        while True:
            try:
                out.append(sess.run({k: batch[k] for k in ("label", "dense", "sparse",
                                                           "lines", "bad_line")}))
            except tf.errors.OutOfRangeError:
                return out


@pytest.mark.parametrize("size", [2, 3])
def test_rank_slices_make_one_process_batches(tmp_path, size):
    rng = np.random.default_rng(0)
    files = []
    for index, count in enumerate([23, 1, 0, 10]):  # a one-line and an empty file
        path = tmp_path / f"part-{index}"
        lines = [f"{rng.integers(0, 2)}\t{rng.integers(0, 99)}\tv{rng.integers(0, 50)}"
                 for _ in range(count)]
        if index == 0:
            lines[7] = "1\tbad\tv1"  # a malformed line, reported by the rank that parses it
        path.write_text("".join(line + "\n" for line in lines))
        files.append(str(path))
    whole = _batches(files, 8)
    ranks = [_batches(files, 8, rank, size) for rank in range(size)]
    assert [len(r) for r in ranks] == [len(whole)] * size  # the same steps on every rank
    for k, batch in enumerate(whole):
        for key in ("label", "dense", "sparse"):
            np.testing.assert_array_equal(
                np.concatenate([r[k][key] for r in ranks]), batch[key], err_msg=f"{k} {key}")
        lines = [int(r[k]["lines"]) for r in ranks]
        assert sum(lines) == int(batch["lines"])
        n = int(batch["lines"])
        assert lines == [n * (r + 1) // size - n * r // size for r in range(size)]
        np.testing.assert_array_equal(np.concatenate([r[k]["bad_line"] for r in ranks]),
                                      batch["bad_line"])
    assert [int(b["lines"]) for b in whole] == [8, 8, 7, 1, 8, 2]
    assert any(int(r[3]["lines"]) == 0 for r in ranks)  # the one-line batch: empty slices
    assert whole[0]["bad_line"].tolist() == [8]


def test_bad_rank_arguments_are_refused():
    for rank, size in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="rank must be in"):
            parsers.make_dataset(["x"], SCHEMA, 8, rank=rank, size=size)
