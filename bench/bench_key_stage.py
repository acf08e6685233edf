"""The host key stage alone, in keys per second, against its own thread count.

The key stage is mxrec's per-batch host work: per table, deduplicate the IDs,
count them, admit new ones and give them device rows, and build the restore
index. This benchmark calls the C++ engine directly (its pybind module, no
TensorFlow) on two workloads built from the synthetic Criteo stream:

- criteo: 26 tables, one per feature, 4096 IDs each per batch; threads split the
  batch's tables among them.
- large: 1 table receiving ~1M IDs per batch; threads split the table's IDs
  among them (the in-table parallel path).

Each run starts from empty tables and feeds the same pre-generated batches, so
new IDs arrive throughout as in training; runs for the different thread counts
alternate, and the median of the repeats is reported. Speed-ups are against 1
thread in this same run.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_key_stage.py [--threads 1,2,4 --repeats 5]
"""

import argparse
import os
import statistics
import sys
import time
from typing import List

import numpy as np

from bench import report  # noqa: E402
from bench.machine import cpu_name  # noqa: E402
from examples.synthetic_criteo import NUM_SPARSE, SyntheticCriteo
from mxrec._lib import loader

_PREFIX = f"bench_key_stage{os.getpid()}/"


class Workload:
    """Pre-generated batches for a set of engine tables.

    Attributes:
        name: label in the table.
        table_names: one engine table per entry.
        batches: per batch, one contiguous int64 array per table.
        capacities: rows per table: the distinct IDs of all the batches.
    """

    def __init__(self, name: str, table_names: List[str], batches: List[List[np.ndarray]]):
        self.name = name
        self.table_names = table_names
        self.batches = batches
        self.capacities = [
            len(np.unique(np.concatenate([batch[t] for batch in batches])))
            for t in range(len(table_names))
        ]
        self.keys = sum(a.size for batch in batches for a in batch)

    def run(self, engine, run_id: int) -> float:
        """Seconds to process every batch, into fresh tables."""
        keys = [f"{_PREFIX}{run_id}/{name}" for name in self.table_names]
        for key, name, capacity in zip(keys, self.table_names, self.capacities):
            engine.create_table(key=key, name=name, dim=16, capacity=capacity, padding_keys=[],
                                access_threshold=0.0, faae_coefficient=1.0)
        started = time.perf_counter()
        for batch in self.batches:
            engine.process(keys, batch, train=True, timestamp=-1)
        seconds = time.perf_counter() - started
        engine.drop_prefix(f"{_PREFIX}{run_id}/")
        return seconds


def criteo_workload(stream: SyntheticCriteo, num_batches: int, batch_size: int) -> Workload:
    batches = []
    for index in range(num_batches):
        sparse = stream.batch(index, batch_size)[1]
        batches.append([np.ascontiguousarray(sparse[:, f]) for f in range(NUM_SPARSE)])
    names = [f"c{f + 1}" for f in range(NUM_SPARSE)]
    return Workload(f"criteo: {NUM_SPARSE} tables x {batch_size}", names, batches)


def large_workload(stream: SyntheticCriteo, num_batches: int, keys_per_batch: int) -> Workload:
    # All 26 features' IDs into one table: a large vocabulary with the same skew.
    rows = -(-keys_per_batch // NUM_SPARSE)
    batches = [[stream.batch(index, rows)[1].reshape(-1)[:keys_per_batch].copy()]
               for index in range(num_batches)]
    return Workload(f"large: 1 table x {keys_per_batch:,}", ["big"], batches)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2",
                        help="comma-separated key-stage thread counts; 1 is always included")
    parser.add_argument("--repeats", type=int, default=5, help="runs per thread count")
    parser.add_argument("--batch_size", type=int, default=4096, help="criteo workload batch")
    parser.add_argument("--criteo_batches", type=int, default=40)
    parser.add_argument("--large_keys", type=int, default=1 << 20,
                        help="IDs per batch of the large workload")
    parser.add_argument("--large_batches", type=int, default=8)
    parser.add_argument("--max_vocab", type=int, default=2_000_000,
                        help="cap on each feature's vocabulary")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--write_large", metavar="FILE",
                        help="only write the large workload's batches to FILE, for "
                             "bench/key_stage_driver.cc, and exit")
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:  # fewer and smaller batches, 3 repeats
        args.repeats = min(args.repeats, 3)
        args.criteo_batches = min(args.criteo_batches, 20)
        args.large_keys = min(args.large_keys, 1 << 19)
        args.large_batches = min(args.large_batches, 6)
    try:
        threads = sorted({1} | {int(t) for t in args.threads.split(",") if t.strip()})
    except ValueError:
        parser.error(f"--threads must be comma-separated integers, got {args.threads!r}")
    if threads[0] < 1:
        parser.error("--threads must be >= 1")
    args.threads = threads
    for name in ("repeats", "batch_size", "criteo_batches", "large_keys", "large_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    engine = loader.engine()
    stream = SyntheticCriteo(seed=args.seed, max_vocab=args.max_vocab,
                             growth_batches=max(args.criteo_batches, args.large_batches))
    if args.write_large:
        large = large_workload(stream, args.large_batches, args.large_keys)
        with open(args.write_large, "wb") as out:
            np.asarray([len(large.batches), 1], np.int64).tofile(out)
            for (ids,) in large.batches:
                np.asarray([ids.size], np.int64).tofile(out)
                ids.astype(np.int64).tofile(out)
        return 0
    workloads = [criteo_workload(stream, args.criteo_batches, args.batch_size),
                 large_workload(stream, args.large_batches, args.large_keys)]

    previous_threads = engine.num_threads()
    seconds = {(w.name, t): [] for w in workloads for t in args.threads}
    run_id = 0
    try:
        for _ in range(args.repeats):
            for workload in workloads:
                for threads in args.threads:
                    engine.set_num_threads(threads)
                    seconds[(workload.name, threads)].append(workload.run(engine, run_id))
                    run_id += 1
    finally:
        engine.set_num_threads(previous_threads)
        engine.drop_prefix(_PREFIX)

    print("## Host key stage (dedupe, count, admit, assign rows, restore index), train=True\n")
    print(f"- machine: {os.cpu_count()} CPUs ({cpu_name()}); engine called through pybind, "
          "no TensorFlow")
    print(f"- data: synthetic Criteo IDs (power law over int64, growing vocabularies, "
          f"features capped at {args.max_vocab:,}); every run starts from empty tables")
    print(f"- median of {args.repeats} runs per row, thread counts alternating\n")
    print("| workload | batches | keys/batch | distinct keys | threads | keys/s | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    out = report.Report()
    for workload in workloads:
        keys_per_batch = workload.keys // len(workload.batches)
        base = None
        for threads in args.threads:
            rate = workload.keys / statistics.median(seconds[(workload.name, threads)])
            base = base or rate
            print(f"| {workload.name} | {len(workload.batches)} | {keys_per_batch:,} | "
                  f"{sum(workload.capacities):,} | {threads} | {rate / 1e6:,.2f} M | "
                  f"{rate / base:.2f}x |")
            label = workload.name.split(":")[0]
            out.figure(f"engine, {label}, {threads} thread(s): M keys/s", rate / 1e6)
            if threads > 1 and label == "large":
                # One table must scale with threads (issue 15): ideal is `threads`x.
                out.goal(f"one large table: {threads} threads x 1 thread (ideal {threads})",
                         rate / base, round(0.8 * threads, 2))
    out.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
