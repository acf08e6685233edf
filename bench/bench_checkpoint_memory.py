"""Peak memory and time of mxrec's Saver: a full save and its restore of one table.

One table of N IDs x dim 64 with Adagrad (device-only, or with a host tier holding a third of
the IDs and an SSD tier the rest: --tiered). Each phase runs in a process of its own, which
this driver samples every 10 ms: anonymous RSS (`RssAnon` of /proc/PID/status: the SSD
tier's mapped file and the page cache are not in it) when the phase starts (the model
built, every ID admitted) and its peak during the phase.

    python bench/bench_checkpoint_memory.py --ids 1000000,4000000 [--kinds device,tiered]
    python bench/bench_checkpoint_memory.py --ids 1000000 --code /path/to/other/checkout
    python bench/bench_checkpoint_memory.py --quick --json out.json   # bench/run_all.py

`--code` runs the phases on another checkout of mxrec (its own mxrec/_lib built): the
baseline of the same run. Prints a Markdown table.

Goals (for bench/run_all.py): the save's extra memory (its peak over the trained process) and
the restore's (its peak over what the trained process held) stay within the Saver's budget
(`checkpoint_memory_mb`) plus what docs/CHECKPOINTS.md says a save and a restore hold beyond
it (the records as columns: 25 bytes per ID for a save, 41 for a restore of one version) and
a fixed MARGIN_MB for the allocator and TensorFlow. `--quick`: 1 M IDs.
"""

import argparse
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# The phases run in processes whose PYTHONPATH is --code's checkout (its mxrec first); this
# checkout's bench package is looked up after it.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import report  # noqa: E402
from bench.machine import cpu_name  # noqa: E402

DIM = 64
BATCH = 1 << 18
# Bytes per ID a save and a restore hold beyond the budget (docs/CHECKPOINTS.md), and the
# fixed margin of the goals.
SAVE_RECORD_BYTES = 25
RESTORE_RECORD_BYTES = 41
MARGIN_MB = 128


def _rss_anon_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def _phase(args) -> None:
    """One phase in this process: build the model, admit every ID, then save (or restore),
    printing START and END lines around it."""
    import numpy as np
    import tensorflow as tf

    from mxrec.core.embedding import create_table, sparse_lookup
    from mxrec.optimizers.adagrad import create_hash_optimizer
    from mxrec.saver.checkpoint import Saver
    from mxrec.util.initialize import init
    from mxrec.util.variable import get_dense_and_sparse_variable

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    init()
    n = args.ids
    tier = {}
    device = n
    if args.tiered:
        device = max(n // 8, BATCH)
        tier = dict(host_vocabulary_size=n // 3, ssd_vocabulary_size=n,
                    ssd_data_path=args.ssd)
    ids = v1.placeholder(tf.int64, [None])
    table = create_table(tf.int64, DIM, "big", v1.truncated_normal_initializer(0, 0.05),
                         device_vocabulary_size=device, **tier)
    loss = tf.reduce_sum(sparse_lookup(table, ids))
    _, sparse = get_dense_and_sparse_variable()
    train = create_hash_optimizer(0.1).apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    kwargs = {}
    if "checkpoint_memory_mb" in inspect.signature(Saver).parameters:
        kwargs["checkpoint_memory_mb"] = args.memory_mb
    saver = Saver(args.dir, **kwargs)
    config = v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    with v1.Session(config=config) as sess:
        sess.run(v1.global_variables_initializer())
        if args.phase == "save":
            for begin in range(0, n, BATCH):  # every ID admitted (and trained once)
                sess.run(train, {ids: np.arange(begin, min(n, begin + BATCH), dtype=np.int64)})
        print("START", flush=True)
        start = time.perf_counter()
        if args.phase == "save":
            saver.save(sess, 1)
        else:
            saver.restore(sess)
        print("END", time.perf_counter() - start, flush=True)


def _run_phase(args, phase: str, directory: str, ssd: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=args.code)
    command = [sys.executable, os.path.abspath(__file__), "--phase", phase, "--ids",
               str(args.ids_one), "--dir", directory, "--ssd", ssd, "--memory-mb",
               str(args.memory_mb)] + (["--tiered"] if args.tiered else [])
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    marks = {}

    def read():
        for line in child.stdout:
            if line.startswith(("START", "END")):
                marks[line.split()[0]] = line.split()[1:]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    base = peak = 0
    while child.poll() is None:
        rss = _rss_anon_kib(child.pid)
        if "START" in marks and "END" not in marks:
            base = base or rss
            peak = max(peak, rss)
        time.sleep(0.01)
    reader.join()
    if child.returncode != 0 or "END" not in marks:
        raise SystemExit(f"{phase} phase failed (exit {child.returncode})")
    return {"seconds": float(marks["END"][0]), "base_gib": base / 2**20,
            "peak_gib": peak / 2**20}


def _measure(args, ids: int) -> dict:
    """Both phases at `ids` IDs in a work folder of their own; their figures and the
    checkpoint's size."""
    args.ids_one = ids
    work = tempfile.mkdtemp(prefix="mxrec-bench-ckpt-", dir=os.environ.get("BENCH_DIR"))
    try:
        ckpt, ssd = os.path.join(work, "ckpt"), os.path.join(work, "ssd")
        os.makedirs(ssd)
        save = _run_phase(args, "save", ckpt, ssd)
        restore = _run_phase(args, "restore", ckpt, ssd)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ckpt)
                   for f in fs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"ids": ids, "save": save, "restore": restore, "checkpoint_gib": size / 2**30}


def _record(out, args, kind: str, got: dict) -> None:
    """The figures and goals of one measurement (MiB over the trained process)."""
    ids, save, restore = got["ids"], got["save"], got["restore"]
    name = f"{kind}, {ids / 1e6:g} M IDs"
    save_extra = (save["peak_gib"] - save["base_gib"]) * 1024
    restore_extra = (restore["peak_gib"] - save["base_gib"]) * 1024
    out.figure(f"{name}: save s", round(save["seconds"], 2))
    out.figure(f"{name}: restore s", round(restore["seconds"], 2))
    out.figure(f"{name}: trained process RssAnon MiB", round(save["base_gib"] * 1024))
    out.figure(f"{name}: checkpoint GiB", round(got["checkpoint_gib"], 3))
    for phase, extra, per_id in (("save", save_extra, SAVE_RECORD_BYTES),
                                 ("restore", restore_extra, RESTORE_RECORD_BYTES)):
        target = round(args.memory_mb + per_id * ids / 2**20 + MARGIN_MB)
        out.goal(f"{name}: {phase} peak RssAnon over the trained process, MiB (budget "
                 f"{args.memory_mb} + {per_id} B/ID + {MARGIN_MB}) (<=)", extra, target,
                 lower_is_better=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", default=None, help="IDs per run (1000000,4000000; --quick: "
                                                    "1000000)")
    parser.add_argument("--kinds", default="device,tiered",
                        help="device (device-only) and/or tiered (host + SSD tiers)")
    parser.add_argument("--tiered", action="store_true", help="--kinds tiered")
    parser.add_argument("--memory-mb", type=int, default=256)
    parser.add_argument("--code", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    parser.add_argument("--phase", choices=("save", "restore"))
    parser.add_argument("--dir")
    parser.add_argument("--ssd", default="")
    report.add_arguments(parser)
    args = parser.parse_args()
    if args.phase:
        args.ids = int(float(args.ids))
        _phase(args)
        return
    kinds = ["tiered"] if args.tiered else [k for k in args.kinds.split(",") if k]
    if set(kinds) - {"device", "tiered"}:
        parser.error(f"--kinds takes device and tiered, got {args.kinds!r}")
    counts = args.ids or ("1000000" if args.quick else "1000000,4000000")
    out = report.Report()
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; mxrec from {args.code}; table "
          f"dim {DIM}, Adagrad; checkpoint_memory_mb={args.memory_mb} where the Saver takes "
          "it; 'extra': MiB of RssAnon over the trained process\n")
    print("| table | IDs | table GiB | save s | RssAnon trained GiB | save extra MiB | "
          "restore s | restore extra MiB | checkpoint GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in kinds:
        args.tiered = kind == "tiered"
        for ids in [int(float(x)) for x in counts.split(",")]:
            got = _measure(args, ids)
            save, restore = got["save"], got["restore"]
            print(f"| {kind} | {ids:,} | {ids * DIM * 4 * 2 / 2**30:.2f} | "
                  f"{save['seconds']:.1f} | {save['base_gib']:.2f} | "
                  f"{(save['peak_gib'] - save['base_gib']) * 1024:.0f} | "
                  f"{restore['seconds']:.1f} | "
                  f"{(restore['peak_gib'] - save['base_gib']) * 1024:.0f} | "
                  f"{got['checkpoint_gib']:.2f} |", flush=True)
            _record(out, args, kind, got)
    out.write(args.json)


if __name__ == "__main__":
    main()
