"""The SSD tier's background spill writer, on the engine alone: a table with a small device
cache, a smaller host tier and a disk tier, trained by a NumPy loop that applies the swap plans
as the step does (embedding, then an optimizer slot) with batches planned ahead, and checked
against a NumPy reference of every ID's value. Spills are written off the step, so the swaps
read IDs back from spills still queued or being written, and saves, evaluation reads,
eviction and restores run while spills are pending."""

import itertools
import re
import subprocess

import numpy as np
import pytest

from mxrec._lib import loader

DIM = 4
DEVICE = 24
HOST = 16
SSD = 4000
IDS = 600
BATCH = 12
SLOT = "opt/accum"
_serial = itertools.count()


@pytest.fixture
def engine():
    return loader.engine()


@pytest.fixture
def delay(engine):
    """The spill writer sleeps before each write (2 ms: many steps of the NumPy loop), so
    that spills are still queued or being written when the next steps need them."""
    engine.set_spill_delay_for_testing(2000)
    yield
    engine.set_spill_delay_for_testing(0)


@pytest.fixture
def key(engine, tmp_path, delay):
    key = f"test_ssd_spill_writer_{next(_serial)}/t"
    engine.create_table(key=key, name="spill", dim=DIM, capacity=DEVICE, host_capacity=HOST,
                        ssd_capacity=SSD, ssd_path=str(tmp_path))
    engine.tier_register(key, SLOT)
    yield key
    engine.drop_prefix(key)


class Trainer:
    """Plans batches `ahead` steps before their step, applies each plan to a NumPy device
    table and slot in plan order, and "trains" each batch: every ID's embedding row grows by
    1 and its slot row by 2 per step it appears in. `want` is the reference: what each ID's
    rows must hold (a new ID, or one evicted, starts from zeros, the swap's fresh value)."""

    def __init__(self, engine, key, ahead, seed=0):
        self.engine, self.key, self.ahead = engine, key, ahead
        self.rng = np.random.default_rng(seed)
        self.table = np.zeros((DEVICE, DIM), np.float32)
        self.slot = np.zeros((DEVICE, DIM), np.float32)
        self.want = {}
        self.planned = []  # (ids, rows of the IDs, reused rows), oldest first
        self.time = 0

    def plan(self):
        ids = np.unique((self.rng.zipf(1.2, size=3 * BATCH) % IDS).astype(np.int64))[:BATCH]
        self.time += 1
        (unique_rows, restore, reused), = self.engine.process([self.key], [ids], True, self.time)
        self.planned.append((ids, np.asarray(unique_rows)[np.asarray(restore)], reused))

    def step(self):
        while len(self.planned) <= self.ahead:
            self.plan()
        ids, rows, reused = self.planned.pop(0)
        for component, table in (("embedding", self.table), (SLOT, self.slot)):
            values, fresh = self.engine.tier_swap(self.key, component, reused, table[reused])
            table[reused] = np.where(fresh[:, None], 0.0, values)
        for i, row in zip(ids.tolist(), rows.tolist()):
            want = self.want.get(i, 0.0)
            np.testing.assert_array_equal(self.table[row], np.full(DIM, want, np.float32),
                                          err_msg=f"ID {i}")
            np.testing.assert_array_equal(self.slot[row], np.full(DIM, 2 * want, np.float32),
                                          err_msg=f"ID {i} (slot)")
            self.table[row] += 1.0
            self.slot[row] += 2.0
            self.want[i] = want + 1.0

    def drain(self):
        """Trains every planned batch: the step boundary with nothing in flight."""
        while self.planned:
            ids, rows, reused = self.planned[0]
            self.ahead = len(self.planned) - 1
            self.step()

    def everywhere(self, component="embedding"):
        """{ID: value} over the device rows and the host and SSD tiers (the export)."""
        table = self.table if component == "embedding" else self.slot
        device_ids, device_rows = self.engine.export_rows(self.key)
        out = {int(i): table[r, 0] for i, r in zip(device_ids, device_rows)}
        tier_ids, tier_values = self.engine.tier_export(self.key, component)
        for i, v in zip(tier_ids.tolist(), tier_values):
            assert i not in out, f"ID {i} is both on the device and in the tier"
            np.testing.assert_array_equal(v, np.full(DIM, v[0], np.float32))
            out[i] = v[0]
        return out


@pytest.mark.parametrize("ahead", [0, 2])
def test_values_follow_their_ids_through_background_spills(engine, key, ahead):
    trainer = Trainer(engine, key, ahead)
    for _ in range(250):
        trainer.step()
    trainer.drain()
    stats = engine.tier_stats(key)
    assert stats["ssd_rows"] > 50 and stats["swap_in_total"] > 500, stats
    assert stats["pending_plans"] == 0
    for component, scale in (("embedding", 1.0), (SLOT, 2.0)):
        got = trainer.everywhere(component)
        assert sorted(got) == sorted(trainer.want)
        for i, want in trainer.want.items():
            assert got[i] == scale * want, (component, i, got[i], want)


def test_save_while_spills_are_pending(engine, key):
    """export_state right after the step whose plan queued spills (the writer has not
    necessarily written them): every ID's saved values are its trained values."""
    trainer = Trainer(engine, key, ahead=0)
    saves = 0
    for step in range(120):
        trainer.step()
        if step % 7 != 6:
            continue
        state = engine.export_state(key)
        keys = np.asarray(state["keys"])
        in_host = np.asarray(state["in_host"]).astype(bool)
        assert state["tier_components"][:2] == ["embedding", SLOT]
        values = np.asarray(state["tier_values"])
        assert len(values) == in_host.sum()
        rows = np.asarray(state["rows"])
        for i, row in zip(keys[~in_host].tolist(), rows[~in_host].tolist()):
            assert trainer.table[row, 0] == trainer.want[i], i
        for i, v in zip(keys[in_host].tolist(), values):
            np.testing.assert_array_equal(v[0], np.full(DIM, trainer.want[i], np.float32))
            np.testing.assert_array_equal(v[1], np.full(DIM, 2 * trainer.want[i], np.float32))
        saves += 1
    assert saves == 17 and engine.tier_stats(key)["ssd_rows"] > 0


def test_eviction_while_spills_are_pending(engine, key):
    """IDs evicted while their spill waits for the writer are gone from every tier, stay
    gone once the writer is done, and start again from zeros when they come back."""
    trainer = Trainer(engine, key, ahead=0)
    evicted = 0
    for step in range(200):
        trainer.step()
        if step % 25 == 24:
            evicted += engine.evict(key, 3)
            kept = set(np.asarray(engine.export_state(key)["keys"]).tolist())
            trainer.want = {i: v for i, v in trainer.want.items() if i in kept}
            assert sorted(trainer.everywhere()) == sorted(kept)
    assert evicted > 50
    for i, v in trainer.everywhere().items():
        assert v == trainer.want[i], i


def test_restore_while_spills_are_pending(engine, key, tmp_path):
    """A restore right after a step that queued spills replaces the tier whole: the
    restored values are the saved ones, and the old spills never reach the new file."""
    trainer = Trainer(engine, key, ahead=0)
    for _ in range(60):
        trainer.step()
    state = engine.export_state(key)
    saved = dict(trainer.want)
    for _ in range(5):
        trainer.step()  # queues more spills, then the restore below replaces the tier
    args = {name: state[name] for name in (
        "keys", "rows", "counts", "last_seen", "free_rows", "next_row", "newest_timestamp",
        "counting_frozen", "access_threshold", "in_host", "lru_rows", "lru_ages",
        "tier_components", "tier_present", "tier_values")}
    engine.import_state(key, **args)
    # The device rows as they were at the save: the restore gives them back by row.
    trainer.table[:] = 0
    trainer.slot[:] = 0
    keys, rows, in_host = (np.asarray(state[n]) for n in ("keys", "rows", "in_host"))
    for i, row in zip(keys[in_host == 0].tolist(), rows[in_host == 0].tolist()):
        trainer.table[row] = saved[i]
        trainer.slot[row] = 2 * saved[i]
    trainer.want = saved
    assert trainer.everywhere() == saved
    for _ in range(60):
        trainer.step()
    trainer.drain()
    assert trainer.everywhere() == trainer.want


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs with one 4 KiB page left free (needs root, as CI has; skipped where
    a mount is not allowed)."""
    path = tmp_path / "small"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        (path / "filler").write_bytes(b"\0" * (60 << 10))
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_an_ssd_path_without_room_is_refused_with_the_bytes(engine, small_disk):
    """Spills that would grow the SSD file past the free space of ssd_data_path's file system
    fail before anything is written, and the next swap says which table, which path, how
    many bytes were needed and how many are free; the values stay exact up to there."""
    key = f"test_ssd_spill_writer_{next(_serial)}/full"
    engine.create_table(key=key, name="full_disk", dim=DIM, capacity=DEVICE, host_capacity=HOST,
                        ssd_capacity=SSD, ssd_path=str(small_disk))
    engine.tier_register(key, SLOT)
    try:
        trainer = Trainer(engine, key, ahead=0)
        with pytest.raises(Exception) as refused:
            for _ in range(400):
                trainer.step()
        message = str(refused.value)
        assert "'full_disk'" in message and f"ssd_data_path '{small_disk}'" in message, message
        needed, free = re.search(r"by (\d+) bytes: .* has (\d+) bytes free", message).groups()
        assert int(needed) > int(free) and int(free) <= 4096, message
    finally:
        engine.drop_prefix(key)
    assert [p.name for p in small_disk.iterdir()] == ["filler"]
