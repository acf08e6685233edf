"""mxrec.util.shared_dirs and the Saver's first save on several ranks: a folder every rank
must share is checked by a marker rank 0 writes, and a rank that does not see it stops every
rank with an error naming the folder and the ranks.

The ranks are threads of this process with a sum over them (what the streaming trainer's
all-reduce and the Saver's barrier compute); a folder "not shared" is a different folder on
one rank, as a host's own disk mounted at the same path would be.
"""

import os
import threading

import numpy as np

from mxrec.saver import manifest
from mxrec.util import shared_dirs


class ThreadRanks:
    """`size` ranks as threads, with the sums of the streaming trainer's `_sum_over_ranks`
    and of the Saver's barrier; `run(fn)` calls fn(rank) on every rank, returns the results
    (or exceptions) by rank."""

    def __init__(self, size):
        self.size = size
        self._barrier = threading.Barrier(size, timeout=60)
        self._slots = [None] * size
        self.calls = 0

    def exchange(self, rank):
        def call(values, mine):
            self._slots[rank] = (np.asarray(values, np.float64), mine)
            self._barrier.wait()
            sums = np.sum([v for v, _ in self._slots], axis=0)
            everyone = np.asarray([m for _, m in self._slots], np.float64)
            if rank == 0:
                self.calls += 1
            self._barrier.wait()
            return sums, everyone
        return call

    def count(self, rank):
        exchange = self.exchange(rank)
        return lambda value: int(exchange([float(value)], 0.0)[0][0])

    def run(self, fn):
        out = [None] * self.size

        def body(rank):
            try:
                out[rank] = fn(rank)
            except Exception as error:  # noqa: BLE001 (returned to the test)
                out[rank] = error

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return out


def _folders(tmp_path, names):
    for name in names:
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
    return sorted(os.listdir(tmp_path / names[0]))


def test_shared_folders_pass_and_leave_nothing(tmp_path):
    ranks = ThreadRanks(3)
    folders = [("the model dir", str(tmp_path / "model")),
               ("the data root", str(tmp_path / "data"))]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "20240101").mkdir()
    out = ranks.run(lambda r: shared_dirs.check(folders, r, 3, ranks.exchange(r), wait=0.5))
    assert out == [None, None, None]
    assert ranks.calls == 2  # two collectives: the tokens, then who saw them
    assert os.listdir(tmp_path / "model") == []  # made by the check, the marker removed
    assert os.listdir(tmp_path / "data") == ["20240101"]


def test_a_rank_with_its_own_folder_stops_every_rank_naming_it(tmp_path):
    ranks = ThreadRanks(3)

    def folders(rank):  # rank 2 sees another disk at the model dir's path
        model = tmp_path / ("model" if rank != 2 else "elsewhere")
        return [("the model dir (--model-dir)", str(model)),
                ("the export base (--export-base)", str(tmp_path / "export"))]

    out = ranks.run(lambda r: shared_dirs.check(folders(r), r, 3, ranks.exchange(r), wait=0.3))
    for rank, error in enumerate(out):
        assert isinstance(error, shared_dirs.NotSharedError), out
        text = str(error)
        assert "the model dir (--model-dir)" in text and "rank(s) [2] do not see" in text
        assert "export base" not in text  # that one is shared
        assert f"this is rank {rank}" in text
    assert "which does not see it" in str(out[2]) and "which does not see it" not in str(out[0])
    assert os.listdir(tmp_path / "model") == [] and os.listdir(tmp_path / "export") == []


def test_a_folder_rank_0_cannot_write(tmp_path):
    """A data root mounted read-only stays unchecked; any other folder stops every rank."""
    ranks = ThreadRanks(2)
    unwritable = "/proc/mxrec-no-such-folder"  # not even root can write there
    folders = [("the data root (--data)", unwritable)]
    out = ranks.run(lambda r: shared_dirs.check(folders, r, 2, ranks.exchange(r), wait=0.2,
                                                may_be_read_only=[unwritable]))
    assert out == [None, None]
    out = ranks.run(lambda r: shared_dirs.check(folders, r, 2, ranks.exchange(r), wait=0.2))
    assert all(isinstance(e, shared_dirs.NotSharedError) for e in out), out
    assert all("rank 0 cannot write into it" in str(e) for e in out)


def test_one_rank_checks_nothing(tmp_path):
    def refuse(*_):
        raise AssertionError("no collective for one rank")

    shared_dirs.check([("x", str(tmp_path / "x"))], 0, 1, refuse)
    assert not (tmp_path / "x").exists()


def _files(rank):
    return {f"table-000-rank{rank:05d}.npz": f"rank {rank}".encode()}


def _manifest():
    return {"format": manifest.FORMAT_VERSION, "kind": "full", "step": 1, "base": 1,
            "previous": None, "time": 0.0, "tables": {}, "files": {}}


def test_sharded_save_into_a_folder_one_rank_does_not_share_stops_every_rank(tmp_path):
    ranks = ThreadRanks(2)

    def save(rank, check):
        directory = str(tmp_path / ("ckpt" if rank == 0 else "local"))
        return manifest.write_version_sharded(
            directory, "full-000000000001", _files(rank), _manifest(), rank, 2, ranks.count(rank),
            check_shared=check)

    out = ranks.run(lambda r: save(r, True))
    for error in out:
        assert isinstance(error, shared_dirs.NotSharedError), out
        assert "mxrec Saver: the checkpoint folder" in str(error)
        assert "1 of 2 ranks do not see" in str(error)
    assert "this rank (1 on" in str(out[1])
    # Nothing published, rank 0's temporary folder removed.
    assert os.listdir(tmp_path / "ckpt") == []
    # The same folder on both ranks: saved (the check costs one collective more).
    before = ranks.calls
    out = ranks.run(lambda r: manifest.write_version_sharded(
        str(tmp_path / "ckpt"), "full-000000000001", _files(r), _manifest(), r, 2,
        ranks.count(r), check_shared=True))
    assert out == [str(tmp_path / "ckpt" / "full-000000000001")] * 2
    assert ranks.calls - before == 4  # the temporary, the check, written, published
