"""Soak: a long stream through one table with admission and eviction; host memory must stay flat.

The engine alone (pybind, no TensorFlow) takes batches of 65,536 IDs, 90% of them seen once
(fresh IDs), 10% drawn from a hot set, with count admission (threshold 2) and eviction of IDs
unseen for 50 batches every 10 batches, as a production stream with a long tail does. Two
variants in one run:

- plain: no delta checkpoints (TF's Saver or none): the table must log no removal at all;
- delta: an mxrec full/delta chain, a delta export (and log prune) every 100 batches.

Resident memory (VmRSS) is sampled after every batch; the goal is the mean of the last third
within 10% of the mean of the middle third, for each variant. The exit status is 1 when a
variant misses it.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_soak.py [--lookups 100000000]
    PYTHONPATH=. .venv/bin/python bench/bench_soak.py --quick --json soak.json  # 3 x 10^7
"""

import argparse
import os
import sys
import time

import numpy as np

from bench import report
from bench.machine import cpu_name
from mxrec._lib import loader

BATCH = 65_536
HOT = 200_000


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def soak(engine, key: str, batches: int, delta_every: int, seed: int):
    rng = np.random.default_rng(seed)
    fresh = 1 << 40
    samples = []
    epoch = None
    evicted = 0
    start = time.perf_counter()
    for step in range(batches):
        hot = rng.integers(0, HOT, size=BATCH // 10)
        ids = np.concatenate([hot, np.arange(fresh, fresh + BATCH - hot.size)]).astype(np.int64)
        fresh += BATCH - hot.size
        engine.process([key], [ids], True, step)
        if step % 10 == 9:
            evicted += engine.evict(key, 50)
        if delta_every and step % delta_every == delta_every - 1:
            state = engine.export_state(key, epoch or 0, delta_chain=True)
            epoch = int(state["epoch"])
            engine.prune_removed_log(key, epoch)
        samples.append(rss_bytes())
    seconds = time.perf_counter() - start
    third = len(samples) // 3
    middle = float(np.mean(samples[third:2 * third]))
    last = float(np.mean(samples[2 * third:]))
    stats = engine.stats(key)
    return dict(seconds=seconds, middle_mib=middle / 2**20, last_mib=last / 2**20,
                ratio=last / middle, evicted=evicted, tracked=stats["ids_tracked"],
                removed_log=engine.removed_log_size(key))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lookups", type=int, default=None,
                        help="lookups per variant (10^8; --quick 3 x 10^7: four delta "
                             "exports)")
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.lookups is None:
        args.lookups = 30_000_000 if args.quick else 100_000_000
    out = report.Report()
    engine = loader.engine()
    batches = max(30, args.lookups // BATCH)
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; {batches} batches x {BATCH} IDs "
          f"= {batches * BATCH:,} lookups per variant")
    failed = False
    for name, delta_every in (("plain", 0), ("delta", 100)):
        key = f"bench_soak{os.getpid()}/{name}"
        engine.create_table(key=key, name=name, dim=8, capacity=2**31 - 1, padding_keys=[],
                            access_threshold=2.0, faae_coefficient=1.0)
        result = soak(engine, key, batches, delta_every, seed=1)
        ok = out.goal(f"soak, {name}: RSS last third / middle third (<=)", result["ratio"], 1.10,
                      lower_is_better=True)
        out.figure(f"soak, {name}: M lookups/s",
                   round(batches * BATCH / result["seconds"] / 1e6, 2))
        failed |= not ok
        print(f"{name:5s}: {result['seconds']:.1f} s, RSS middle third {result['middle_mib']:.0f} "
              f"MiB, last third {result['last_mib']:.0f} MiB, ratio {result['ratio']:.3f} "
              f"({'ok' if ok else 'GROWS'}); {result['evicted']:,} evicted, "
              f"{result['tracked']:,} IDs tracked at the end, removal log "
              f"{result['removed_log']:,} entries")
        engine.drop_prefix(key.rsplit("/", 1)[0] + "/")
    out.write(args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
