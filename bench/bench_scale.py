"""One table larger than memory: training speed over the run, RAM per ID in each tier, SSD
bytes per ID, and a full save and restore against the disk's own speed.

The table: `--ids` IDs of dim `--dim` (64) with Adagrad (the embedding and one slot per ID),
a device cache of `--device_rows`, a host tier of `--host_rows` and the rest on the SSD tier
(defaults scale with `--ids`: a cache of min(1 M, ids / 4) rows and a host tier of
min(4 M, 2 ids / 5), so that 5e7 IDs run with the cache of 1 M rows and the host tier of 4 M
that the goals are set for). Training feeds batches of `--batch_size` samples x 16 positions,
3/4 of them IDs never seen before and the rest drawn from every ID seen so far, until `--ids`
IDs were trained; a step is one batch through the direct lookup path and Adagrad.

Figures:
- samples/s of the first steps (the first 10 % but the very first, all in memory) and of the
  steady state (the last 25 %, the SSD tier spilling and reading back), and their ratio;
- RAM per ID in each tier: the device cache's and the host tier's values (their sizes over
  their rows); per SSD-resident ID the growth of the process's anonymous RSS (RssAnon: the
  SSD file's mapped pages are the kernel's to drop) from the step the SSD tier first held rows
  to the last, over the rows it gained meanwhile; the same on the engine alone (no
  TensorFlow, IDs streamed once), as it is and with the heap trimmed (malloc_trim: what the
  data structures hold, without the free pages temporaries left in the heap), and the ID
  map's share by its own count;
- SSD bytes per ID (the file over its rows);
- the steady state's disk reads and writes (GiB/s, /proc/self/io: what missed the page
  cache and what was written), as shares of `dd`'s bandwidth on the same disk;
- a full save with mxrec's `Saver` and a restore of it in a new process: seconds, GiB/s of
  the files written or read, against `dd`'s sequential write (fdatasync) and direct read of
  the same disk, and each phase's peak RssAnon (sampled every 50 ms); the trained table is
  freed and its SSD file removed before the restore's process starts.

Tables larger than the machine's memory: run it inside a memory cgroup, which counts page
cache as a pod's limit does. `--memory_limit 10G` makes one (cgroup v1, as root: a child of
/sys/fs/cgroup/memory with that `memory.limit_in_bytes`, this process moved into it; the
restore's process is started inside it too) and reports its peak and any OOM kill; elsewhere
it is an error that says why.

    PYTHONPATH=. .venv/bin/python bench/bench_scale.py                      # 1e6 IDs
    PYTHONPATH=. .venv/bin/python bench/bench_scale.py --ids 10000000
    PYTHONPATH=. .venv/bin/python bench/bench_scale.py --ids 50000000 --memory_limit 10G \\
        --dir /var/tmp/scale                                                # 23.8 GiB of rows

Where the SSD file fits the page cache, no step waits on the disk. Steps that do (the file
about twice the page cache the cgroup leaves it; run_all's `bench_scale_disk`):

    PYTHONPATH=. .venv/bin/python bench/bench_scale.py --ids 3e6 --device_rows 200000 \\
        --host_rows 200000 --engine_ids 0 --memory_limit 1400M --no_checkpoint
"""

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import report  # noqa: E402
from bench.machine import describe  # noqa: E402

POSITIONS = 16
NEW_SHARE = 0.75
CGROUP_ROOT = "/sys/fs/cgroup/memory"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=float, default=None,
                        help="distinct IDs trained (1e6; --quick 2e5)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=None,
                        help="samples per batch, 16 positions each (8192; --quick 1024)")
    parser.add_argument("--device_rows", type=int, default=None,
                        help="device cache rows (min(1 M, ids / 4))")
    parser.add_argument("--host_rows", type=int, default=None,
                        help="host tier rows (min(4 M, 2 ids / 5))")
    parser.add_argument("--engine_ids", type=int, default=None,
                        help="IDs streamed through the engine alone for its RAM per "
                             "SSD-resident ID (2000000; --quick 300000; 0: skip)")
    parser.add_argument("--dir", default=None,
                        help="where the SSD tier and the checkpoint go (a fresh temporary "
                             "directory)")
    parser.add_argument("--memory_limit", default=None,
                        help="run inside a memory cgroup of this size (bytes, or with K/M/G)")
    parser.add_argument("--dd_bytes", type=int, default=None,
                        help="bytes dd writes and reads (1 GiB; --quick 256 MiB)")
    parser.add_argument("--no_checkpoint", action="store_true",
                        help="train only: no save or restore (while a full save or restore "
                             "of the table would not fit the machine's memory)")
    parser.add_argument("--restore_child", default=None, help=argparse.SUPPRESS)
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    defaults = {"ids": (1e6, 2e5), "batch_size": (8192, 1024),
                "engine_ids": (2_000_000, 300_000), "dd_bytes": (1 << 30, 256 << 20)}
    for name, (full, short) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, short if args.quick else full)
    args.ids = int(args.ids)
    if args.device_rows is None:
        args.device_rows = min(1_000_000, args.ids // 4)
    if args.host_rows is None:
        args.host_rows = min(4_000_000, 2 * args.ids // 5)
    unique_per_batch = args.batch_size * POSITIONS
    if args.device_rows < unique_per_batch + 16:
        parser.error(f"--device_rows {args.device_rows} cannot hold one batch's "
                     f"{unique_per_batch} positions: raise it or lower --batch_size")
    if args.ids <= args.device_rows + args.host_rows:
        print(f"note: {args.ids} IDs fit the device cache and the host tier; nothing goes to "
              "the SSD tier")
    return args


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def rss_anon() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def disk_bytes() -> tuple:
    """(bytes read from, bytes written to storage) by this process so far
    (/proc/self/io: page-cache hits are not reads, dirtied pages count as written)."""
    values = {}
    with open("/proc/self/io", encoding="ascii") as io_:
        for line in io_:
            name, value = line.split(":")
            values[name] = int(value)
    return values["read_bytes"], values["write_bytes"]


def rss_pair() -> tuple:
    """RssAnon as it is, and after malloc_trim(0) hands the heap's free pages back: the
    second is what the process's data structures hold, the first adds what freed
    temporaries (NumPy batches, spill buffers, a rehash's old array) left in the heap."""
    raw = rss_anon()
    ctypes.CDLL(None).malloc_trim(0)
    return raw, rss_anon()


class PeakSampler:
    """The peak RssAnon of each phase, sampled every 50 ms on a thread of its own."""

    def __init__(self):
        self.peaks = {}
        self.phase = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.05):
            self.note()

    def note(self):
        if self.phase is not None:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss_anon())

    def start(self, phase: str):
        self.note()
        self.phase = phase
        self.note()

    def stop(self):
        self.note()
        self._stop.set()
        self._thread.join()


def enter_cgroup(limit: int) -> str:
    """Moves this process into a new memory cgroup of `limit` bytes; returns its path."""
    if not os.access(CGROUP_ROOT, os.W_OK):
        raise SystemExit(f"--memory_limit needs a writable cgroup v1 memory controller at "
                         f"{CGROUP_ROOT} (as root); it is not here")
    path = os.path.join(CGROUP_ROOT, f"mxrec-bench-scale-{os.getpid()}")
    os.mkdir(path)
    with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    return path


def leave_cgroup(path: str) -> dict:
    """The cgroup's peak usage and OOM kills; moves this process out and removes it."""
    with open(os.path.join(path, "memory.max_usage_in_bytes")) as f:
        peak = int(f.read())
    with open(os.path.join(path, "memory.oom_control")) as f:
        kills = [int(line.split()[1]) for line in f if line.startswith("oom_kill ")]
    with open(os.path.join(CGROUP_ROOT, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    os.rmdir(path)
    return {"cgroup_peak_bytes": peak, "cgroup_oom_kills": kills[0] if kills else 0}


def engine_bytes_per_ssd_id(args, directory: str) -> tuple:
    """RssAnon growth per SSD-resident ID on the engine alone, as it is and with the heap
    trimmed (rss_pair), and the ID map's own bytes per ID: `--engine_ids` new IDs streamed
    once through the key stage and the swaps of the embedding and one slot, with a small
    device cache and host tier, so that nearly all of them end on the SSD tier."""
    from mxrec._lib import loader

    engine = loader.engine()
    key = "bench_scale/engine"
    device_rows, host_rows, batch = 20_000, 40_000, 10_000
    engine.create_table(key=key, name="engine_alone", dim=args.dim, capacity=device_rows,
                        host_capacity=host_rows, ssd_capacity=args.engine_ids,
                        ssd_path=directory)
    engine.tier_register(key, "optimizer/slot")
    device = np.zeros((device_rows, args.dim), np.float32)
    start = None
    for first in range(0, args.engine_ids, batch):
        ids = np.arange(first, min(first + batch, args.engine_ids), dtype=np.int64) * 7919 + 1
        (_, _, reused), = engine.process([key], [ids], True, first)
        for component in ("embedding", "optimizer/slot"):
            engine.tier_swap(key, component, reused, device[reused])
        ssd_rows = engine.tier_stats(key)["ssd_rows"]
        if start is None and ssd_rows > 0:
            start = rss_pair() + (ssd_rows, engine.stats(key)["id_map_bytes"])
    end = rss_pair()
    rows = engine.tier_stats(key)["ssd_rows"] - start[2]
    id_map = (engine.stats(key)["id_map_bytes"] - start[3]) / max(1, rows)
    engine.drop_prefix(key)
    return (end[0] - start[0]) / max(1, rows), (end[1] - start[1]) / max(1, rows), id_map


def build_model(args, ssd_dir: str):
    """The table (DDR + SSD tiers), a lookup of a fed batch and Adagrad: (graph, ids, train,
    table)."""
    import tensorflow as tf

    from mxrec.core.embedding import create_table, sparse_lookup
    from mxrec.optimizers.adagrad import create_hash_optimizer
    from mxrec.util.initialize import init
    from mxrec.util.variable import get_dense_and_sparse_variable

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    init()
    table = create_table(tf.int64, args.dim, "scale", v1.truncated_normal_initializer(0, 0.05),
                         device_vocabulary_size=args.device_rows,
                         host_vocabulary_size=args.host_rows,
                         ssd_vocabulary_size=max(1, args.ids - args.host_rows),
                         ssd_data_path=ssd_dir, init_by_id=True)
    ids = v1.placeholder(tf.int64, [None, POSITIONS])
    loss = tf.reduce_sum(tf.square(sparse_lookup(table, ids) - 1.0))
    _, sparse = get_dense_and_sparse_variable()
    train = create_hash_optimizer(0.05).apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    return ids, train, table


def spread(counter: np.ndarray) -> np.ndarray:
    """IDs from a counter, spread over int64 (a bijection: an odd multiplier mod 2^64)."""
    return (counter.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)


def train(args, sess, ids, train_op, table, sampler: PeakSampler) -> dict:
    """Trains until `--ids` IDs were seen; per step: seconds, tier rows, RssAnon."""
    from mxrec.core import tiers

    rng = np.random.default_rng(0)
    positions = args.batch_size * POSITIONS
    new = int(positions * NEW_SHARE)
    seen = 0
    steps = []
    sampler.start("train")
    while seen < args.ids:
        fresh = np.arange(seen, min(seen + new, args.ids))
        old = rng.integers(0, max(1, seen), positions - len(fresh)) if seen else \
            rng.integers(0, len(fresh), positions - len(fresh)) + seen
        batch = spread(rng.permutation(np.concatenate([fresh, old]))).reshape(-1, POSITIONS)
        seen += len(fresh)
        started = time.perf_counter()
        sess.run(train_op, {ids: batch})
        seconds = time.perf_counter() - started
        stats = tiers.stats(table)
        steps.append({"seconds": seconds, "ssd_rows": stats["ssd_rows"],
                      "host_rows": stats["host_rows"], "rss": rss_anon(), "stats": stats,
                      "disk": disk_bytes()})
        if stats["ssd_rows"] > 0 and "trimmed" not in steps[0]:
            steps[0]["trimmed"] = (rss_pair()[1], stats["ssd_rows"])
    if "trimmed" in steps[0]:
        steps[-1]["trimmed_end"] = (rss_pair()[1], steps[-1]["ssd_rows"])
    return steps


def train_figures(args, steps: list, rep: report.Report) -> None:
    samples = args.batch_size
    n = len(steps)
    # The first step builds TensorFlow's kernels and is left out.
    first = steps[1:max(2, n // 10 + 1)]
    last = steps[n - max(1, n // 4):]
    first_rate = samples * len(first) / sum(s["seconds"] for s in first)
    last_rate = samples * len(last) / sum(s["seconds"] for s in last)
    rep.figure("steps", n)
    rep.figure("first steps samples/s", round(first_rate))
    rep.figure("steady state samples/s", round(last_rate))
    rep.figure("steady / first steps", round(last_rate / first_rate, 3))
    # The steady state's disk traffic, from the step before it to its last step.
    before = steps[n - len(last) - 1]["disk"] if n > len(last) else (0, 0)
    seconds = sum(s["seconds"] for s in last)
    rep.figure("steady state disk reads (GiB/s)",
               round((last[-1]["disk"][0] - before[0]) / seconds / 2**30, 3))
    rep.figure("steady state disk writes (GiB/s)",
               round((last[-1]["disk"][1] - before[1]) / seconds / 2**30, 3))
    spill_figures(steps, len(last), rep)
    stats = steps[-1]["stats"]
    comps = 2  # the embedding and Adagrad's slot
    rep.figure("device cache RAM per ID (values, bytes)", args.dim * 4 * comps)
    rep.figure("host tier RAM per ID (values, bytes)",
               round(stats["host_bytes"] / max(1, stats["host_rows"]), 1))
    rep.figure("ssd rows", stats["ssd_rows"])
    rep.figure("SSD bytes per ID", round(stats["ssd_file_bytes"] / max(1, stats["ssd_rows"]), 1))
    rep.figure("RssAnon at the end of training (GiB)", round(steps[-1]["rss"] / 2**30, 3))
    # Over a few steps TensorFlow's own allocations outweigh the tier's growth.
    on_ssd = [s for s in steps if s["ssd_rows"] > 0]
    rep.figure("steps with rows on the SSD tier", len(on_ssd))
    if len(on_ssd) < 10:
        return
    if on_ssd[-1]["ssd_rows"] > on_ssd[0]["ssd_rows"]:
        grown = on_ssd[-1]["rss"] - on_ssd[0]["rss"]
        rows = on_ssd[-1]["ssd_rows"] - on_ssd[0]["ssd_rows"]
        rep.figure("RAM per SSD-resident ID, training (RssAnon bytes)", round(grown / rows, 1))
    if "trimmed_end" in steps[-1] and steps[-1]["trimmed_end"][1] > steps[0]["trimmed"][1]:
        (start, start_rows), (end, end_rows) = steps[0]["trimmed"], steps[-1]["trimmed_end"]
        rep.figure("RAM per SSD-resident ID, training, heap trimmed (bytes)",
                   round((end - start) / (end_rows - start_rows), 1))


def spill_figures(steps: list, count: int, rep: report.Report) -> None:
    """Per steady-state step: the rows spilled to the SSD file, the writes and bytes that
    wrote them, the 4 KiB pages those writes touched, and what the process dirtied in all
    (/proc/self/io); the last two over the first show the write amplification."""
    n = len(steps)
    if n <= count:
        return
    before, end = steps[n - count - 1], steps[-1]

    def per_step(key):
        return (end["stats"].get(key, 0) - before["stats"].get(key, 0)) / count

    records = per_step("ssd_spilled_records")
    written = per_step("ssd_write_bytes")
    pages = per_step("ssd_write_pages") * 4096
    dirtied = (end["disk"][1] - before["disk"][1]) / count
    rep.figure("steady state rows spilled per step", round(records))
    rep.figure("steady state spill runs per step", round(per_step("ssd_write_runs")))
    rep.figure("steady state spill bytes per step (MiB)", round(written / 2**20, 1))
    rep.figure("steady state pages the spills touched per step (MiB)", round(pages / 2**20, 1))
    rep.figure("steady state bytes dirtied per step (MiB, /proc/self/io)",
               round(dirtied / 2**20, 1))
    if written:
        rep.figure("pages the spills touched / spill bytes", round(pages / written, 2))


def dd_speeds(directory: str, size: int) -> tuple:
    """dd's sequential write (fdatasync) and direct read of `size` bytes in `directory`:
    bytes/s each."""
    path = os.path.join(directory, "dd.bin")
    count = max(1, size // (16 << 20))
    try:
        started = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}",
                        "conv=fdatasync"], check=True, capture_output=True)
        write = count * (16 << 20) / (time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct"],
                       check=True, capture_output=True)
        read = count * (16 << 20) / (time.perf_counter() - started)
    finally:
        if os.path.exists(path):
            os.remove(path)
    return write, read


def directory_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files)


def restore_child(args) -> int:
    """The restore phase, in a process of its own: prints its figures as one JSON line."""
    import tensorflow as tf

    from mxrec.core import tiers
    from mxrec.saver.checkpoint import Saver

    checkpoint, ssd_dir = args.restore_child.split(os.pathsep)
    ids, _, table = build_model(args, ssd_dir)
    sampler = PeakSampler()
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sampler.start("before")
        sampler.start("restore")
        started = time.perf_counter()
        Saver(checkpoint).restore(sess)
        seconds = time.perf_counter() - started
        sampler.stop()
        stats = tiers.stats(table)
    print(json.dumps({"seconds": seconds, "peak": sampler.peaks["restore"],
                      "before": sampler.peaks["before"],
                      "ids": stats["device_rows"] + stats["tier_ids"]}))
    return 0


def save_phase(sess, directory: str, sampler: PeakSampler, rep: report.Report) -> tuple:
    """The full save: (bytes saved, seconds, the trained process's RssAnon before it)."""
    from mxrec.saver.checkpoint import Saver

    checkpoint = os.path.join(directory, "checkpoint")
    trained_rss = rss_anon()
    sampler.start("save")
    started = time.perf_counter()
    Saver(checkpoint).save(sess, 1, kind="full")
    save_seconds = time.perf_counter() - started
    sampler.note()
    saved = directory_bytes(checkpoint)
    rep.figure("checkpoint GiB", round(saved / 2**30, 3))
    rep.figure("save seconds", round(save_seconds, 2))
    rep.figure("save GiB/s", round(saved / save_seconds / 2**30, 3))
    rep.figure("save peak RssAnon (GiB)", round(sampler.peaks["save"] / 2**30, 3))
    rep.figure("save peak extra RssAnon over training (MiB)",
               round((sampler.peaks["save"] - trained_rss) / 2**20))
    sampler.start(None)
    return saved, save_seconds, trained_rss


def release_trained(table, ssd_dir: str) -> None:
    """Frees the trained table (the engine's state, its SSD file) before the restore's
    process starts: under a memory limit both would not fit, nor both SSD files on disk."""
    import gc

    import tensorflow as tf

    from mxrec._lib import loader

    loader.engine().drop_prefix(table.table_key)
    tf.compat.v1.reset_default_graph()
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    shutil.rmtree(ssd_dir, ignore_errors=True)


def restore_phase(args, directory: str, saved: int, save_seconds: float, trained_rss: int,
                  rep: report.Report) -> tuple:
    """A restore of the full save in a new process (inside the same memory cgroup)."""
    checkpoint = os.path.join(directory, "checkpoint")
    restore_ssd = os.path.join(directory, "restore_ssd")
    os.makedirs(restore_ssd, exist_ok=True)
    command = [sys.executable, os.path.abspath(__file__), "--ids", str(args.ids),
               "--dim", str(args.dim), "--batch_size", str(args.batch_size),
               "--device_rows", str(args.device_rows), "--host_rows", str(args.host_rows),
               "--restore_child", os.pathsep.join([checkpoint, restore_ssd])]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the restore's process failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    child = json.loads(done.stdout.strip().splitlines()[-1])
    rep.figure("restore seconds", round(child["seconds"], 2))
    rep.figure("restore GiB/s", round(saved / child["seconds"] / 2**30, 3))
    rep.figure("restore peak RssAnon (GiB)", round(child["peak"] / 2**30, 3))
    rep.figure("restore peak RssAnon / training's (x)", round(child["peak"] / trained_rss, 3))
    rep.figure("IDs restored", child["ids"])
    return saved / save_seconds, saved / child["seconds"], child, trained_rss


def run(args, directory: str, rep: report.Report) -> None:
    import tensorflow as tf

    sampler = PeakSampler()
    if args.engine_ids:
        engine_dir = os.path.join(directory, "engine")
        os.makedirs(engine_dir)
        raw, trimmed, id_map = engine_bytes_per_ssd_id(args, engine_dir)
        rep.figure("RAM per SSD-resident ID, engine alone (RssAnon bytes)", round(raw, 1))
        rep.figure("RAM per SSD-resident ID, engine alone, heap trimmed (bytes)",
                   round(trimmed, 1))
        rep.figure("of which the ID map (bytes)", round(id_map, 1))
    ssd_dir = os.path.join(directory, "ssd")
    os.makedirs(ssd_dir)
    ids, train_op, table = build_model(args, ssd_dir)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        steps = train(args, sess, ids, train_op, table, sampler)
        rep.figure("train peak RssAnon (GiB)", round(sampler.peaks["train"] / 2**30, 3))
        train_figures(args, steps, rep)
        if not args.no_checkpoint:
            saved = save_phase(sess, directory, sampler, rep)
    sampler.stop()
    if not args.no_checkpoint:
        release_trained(table, ssd_dir)
        rates = restore_phase(args, directory, *saved, rep)
    write, read = dd_speeds(directory, args.dd_bytes)
    rep.figure("dd write GiB/s", round(write / 2**30, 3))
    rep.figure("dd read GiB/s", round(read / 2**30, 3))
    # The seconds of the steady state count the step's CPU work too: these are the shares
    # of the disk's bandwidth the tier used, not what it could use.
    rep.figure("steady state disk reads / dd's direct read",
               round(rep.figures["steady state disk reads (GiB/s)"] * 2**30 / read, 3))
    rep.figure("steady state disk writes / dd's sequential write",
               round(rep.figures["steady state disk writes (GiB/s)"] * 2**30 / write, 3))
    per_ssd = rep.figures.get("RAM per SSD-resident ID, engine alone, heap trimmed (bytes)")
    if per_ssd is not None:
        rep.goal("RAM per SSD-resident ID, engine alone, heap trimmed (bytes) (<=)", per_ssd, 48,
                 lower_is_better=True)
    if rep.figures["ssd rows"] > 0:
        rep.goal("steady state (SSD tier) / first steps samples/s",
                 rep.figures["steady / first steps"], 0.5)
    if not args.no_checkpoint:
        checkpoint_goals(rates, write, read, rep)


def checkpoint_goals(rates: tuple, write: float, read: float, rep: report.Report) -> None:
    save_rate, restore_rate, child, trained = rates
    f = rep.figures
    rep.goal("full save: GiB/s / dd's sequential write", save_rate / write, 0.5)
    rep.goal("restore: GiB/s / dd's direct read", restore_rate / read, 0.5)
    rep.goal("full save: peak extra RssAnon over training (MiB) (<=)",
             f["save peak extra RssAnon over training (MiB)"], 256, lower_is_better=True)
    rep.goal("restore: peak RssAnon over training's (MiB) (<=)", (child["peak"] - trained) / 2**20,
             256, lower_is_better=True)


def print_table(args, rep: report.Report) -> None:
    print(f"## bench_scale: one table of {args.ids:,} IDs x dim {args.dim}, Adagrad; device "
          f"cache {args.device_rows:,} rows, host tier {args.host_rows:,}, the rest on the SSD "
          f"tier; batches of {args.batch_size} x {POSITIONS} positions, {NEW_SHARE:.0%} new "
          f"IDs ({describe()})\n")
    print("| figure | value |\n|---|---:|")
    for name, value in rep.figures.items():
        print(f"| {name} | {value} |")
    print("\n| goal | target | measured | met |\n|---|---:|---:|---|")
    for goal in rep.goals:
        sign = "<=" if "(<=)" in goal["goal"] else ">="
        print(f"| {goal['goal']} | {sign} {goal['target']} | {goal['value']} | "
              f"{'met' if goal['met'] else 'NOT met'} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.restore_child:
        return restore_child(args)
    cgroup = enter_cgroup(parse_bytes(args.memory_limit)) if args.memory_limit else None
    directory = tempfile.mkdtemp(prefix="mxrec_bench_scale_", dir=args.dir)
    rep = report.Report()
    try:
        run(args, directory, rep)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if cgroup:
            for name, value in leave_cgroup(cgroup).items():
                rep.figure(name, value)
    print_table(args, rep)
    rep.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
