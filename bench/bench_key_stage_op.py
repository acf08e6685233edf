"""The key stage through its TensorFlow op, against TensorFlow's own ops, TFRA and a ceiling.

Same batches for every contender, each run from empty tables, so that new IDs
arrive throughout (the synthetic Criteo vocabularies grow over the run) as well
as known ones:

- large: one table receiving every feature's IDs (26 x 4096 = 106,496 per batch);
- criteo: 26 tables, 4096 IDs each per batch.

Contenders, all run in this process and interleaved, medians reported:

- op: mxrec's `MxrecKeyStagePacked` in a `session.run` (dedupe, count, admit, rows,
  restore): one call for all tables, the batch's IDs fed as one tensor with row splits per
  table (as a step's pipeline hands them over; packed when the batches are made, like the
  per-table arrays), one output tensor each;
- op per table: `MxrecKeyStage`, one ID tensor fed per table and three outputs per table
  (the op before the packed one; reported, not compared);
- tf: `tf.unique` + `MutableHashTable` lookup + insert of the new IDs with fresh rows;
- tfra: the same with TFRA's `CuckooHashTable` (skipped with a line saying so when
  `tensorflow_recommenders_addons` does not import);
- engine: the engine alone through pybind, no TensorFlow;
- feed only: the session step feeding the IDs and doing nothing else (what every
  session contender pays before its own work; reported, not compared); feed packed: the
  same for the packed tensors the op is fed;
- ceiling: a bare single-thread C++ dedupe + find-or-insert loop over
  `absl::flat_hash_map` (bench/key_map_bench.cc), the least work a key stage does.

It also compares our ID map (engine/key_map.h) with `absl::flat_hash_map` on the
same keys, and measures host memory per admitted ID of a device-only table
(engine RSS growth, fed in batches of 106,496 IDs like the large workload's) at
1 M, 2 M and 10 M IDs.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_key_stage_op.py [--quick] [--json out.json]
TFRA (optional): pip install --target /tmp/tfra --no-deps tensorflow-recommenders-addons==0.7.2
'typeguard<3', then add /tmp/tfra to PYTHONPATH.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

from bench.machine import cpu_name
from examples.synthetic_criteo import NUM_SPARSE, SyntheticCriteo
from mxrec._lib import loader

ROOT = Path(__file__).resolve().parent.parent
_PREFIX = f"bench_key_stage_op{os.getpid()}/"
_TIMESTAMP = 1_700_000_000


class Workload:
    """Pre-generated batches: batches[b][t] is the int64 IDs of table t in batch b."""

    def __init__(self, name: str, tables: int, batches: List[List[np.ndarray]]):
        self.name = name
        self.tables = tables
        self.batches = batches
        self.keys = sum(a.size for batch in batches for a in batch)
        self.capacities = [len(np.unique(np.concatenate([batch[t] for batch in batches])))
                           for t in range(tables)]
        # Each distinct ID is new once: the share of the stream's keys that are new IDs.
        self.new_share = sum(self.capacities) / self.keys
        # The same batches packed: all tables' IDs in one vector, and its row splits.
        self.packed = [(np.concatenate(batch),
                        np.cumsum([0] + [a.size for a in batch]).astype(np.int64))
                       for batch in batches]

    def write(self, path: Path) -> None:
        """The batch file key_map_bench reads."""
        with open(path, "wb") as out:
            np.asarray([len(self.batches), self.tables], np.int64).tofile(out)
            for batch in self.batches:
                for ids in batch:
                    np.asarray([ids.size], np.int64).tofile(out)
                    ids.astype(np.int64).tofile(out)


def make_workloads(num_batches: int, seed: int) -> List[Workload]:
    # The vocabulary grows over the run's batches: new IDs arrive in every batch.
    stream = SyntheticCriteo(seed=seed, max_vocab=2_000_000, growth_batches=num_batches)
    sparse = [stream.batch(index, 4096)[1] for index in range(num_batches)]
    large = Workload("large: 1 table x 106,496", 1,
                     [[np.ascontiguousarray(s.reshape(-1))] for s in sparse])
    criteo = Workload(f"criteo: {NUM_SPARSE} tables x 4,096", NUM_SPARSE,
                      [[np.ascontiguousarray(s[:, f]) for f in range(NUM_SPARSE)]
                       for s in sparse])
    return [large, criteo]


def time_session(workload: Workload, build: Callable[[], Callable], packed: bool = False) -> float:
    """Seconds of session.run over every batch.

    build() returns plan(ids) mapping one batch's ID tensors to its outputs (the
    state, such as hash tables, shared by the batches). The IDs are fed (the
    same for every contender); the outputs are computed and not fetched. `packed`:
    plan(ids, splits) gets the batch as one ID tensor and its row splits.
    """
    graph = tf.Graph()
    with graph.as_default():
        if packed:
            ids = [tf.compat.v1.placeholder(tf.int64, [None]),
                   tf.compat.v1.placeholder(tf.int64, [workload.tables + 1])]
            step = tf.group(build()(*ids))
            batches = workload.packed
        else:
            ids = [tf.compat.v1.placeholder(tf.int64, [None]) for _ in range(workload.tables)]
            step = tf.group(build()(ids))
            batches = workload.batches
        init = tf.group(tf.compat.v1.tables_initializer())
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        # Table creation and first-run costs outside the clock.
        session.run(step, dict(zip(ids, batches[0])))
        started = time.perf_counter()
        for batch in batches[1:]:
            session.run(step, dict(zip(ids, batch)))
        return time.perf_counter() - started


def op_contender(engine, workload: Workload, run_id: int, packed: bool):
    keys = [f"{_PREFIX}{run_id}/t{t}" for t in range(workload.tables)]
    for key, capacity in zip(keys, workload.capacities):
        engine.create_table(key=key, name=key, dim=16, capacity=capacity, padding_keys=[],
                            access_threshold=0.0, faae_coefficient=1.0)
    ops = loader.op_library()

    def build_packed():
        def plan(ids, splits):
            out = ops.mxrec_key_stage_packed(
                ids=ids, splits=splits, timestamp=tf.constant(_TIMESTAMP, tf.int64),
                table_keys=keys, is_train=True, deferred=False)
            return [out.unique_rows, out.restore]

        return plan

    def build():
        def plan(ids):
            unique_rows, restore, _, _ = ops.mxrec_key_stage(
                ids=ids, timestamp=tf.constant(_TIMESTAMP, tf.int64), weights=[],
                table_keys=keys, is_train=True, deferred=False)
            return list(unique_rows) + list(restore)

        return plan

    return build_packed if packed else build


def hash_table_contender(make_table: Callable[[], object]):
    """tf.unique, then find the unique IDs and insert the new ones with fresh rows."""

    def build():
        tables = []

        def plan(ids):
            while len(tables) < len(ids):
                tables.append(make_table())
            return [out for table, t_ids in zip(tables, ids)
                    for out in find_or_insert(table, t_ids)]

        return plan

    def find_or_insert(table, t_ids):
        unique, restore = tf.unique(t_ids)
        found = table.lookup(unique)
        new = found < 0
        new_keys = tf.boolean_mask(unique, new)
        fresh = table.size() + tf.range(tf.size(new_keys, out_type=tf.int64))
        with tf.control_dependencies([table.insert(new_keys, fresh)]):
            rows = tf.tensor_scatter_nd_update(found, tf.where(new), fresh)
        return rows, restore

    return build


def feed_contender():
    """Only the session step and the feed of the IDs: the harness's own cost."""

    def build():
        return lambda ids: [tf.size(t_ids) for t_ids in ids]

    return build


def tf_table():
    return tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)


def tfra_table_factory() -> Optional[Callable[[], object]]:
    try:
        from tensorflow_recommenders_addons import dynamic_embedding as de
    except ImportError:
        return None
    counter = [0]

    class Rows:
        """TFRA's table holds vectors: rows as vectors of one."""

        def __init__(self):
            counter[0] += 1
            self.table = de.CuckooHashTable(key_dtype=tf.int64, value_dtype=tf.int64,
                                            default_value=[-1], name=f"tfra{counter[0]}")

        def lookup(self, keys):
            return self.table.lookup(keys)[:, 0]

        def size(self):
            return self.table.size()

        def insert(self, keys, rows):
            return self.table.insert(keys, rows[:, None])

    return Rows


def engine_seconds(engine, workload: Workload, run_id: int) -> float:
    keys = [f"{_PREFIX}{run_id}/e{t}" for t in range(workload.tables)]
    for key, capacity in zip(keys, workload.capacities):
        engine.create_table(key=key, name=key, dim=16, capacity=capacity, padding_keys=[],
                            access_threshold=0.0, faae_coefficient=1.0)
    engine.process(keys, workload.batches[0], train=True, timestamp=_TIMESTAMP)
    started = time.perf_counter()
    for batch in workload.batches[1:]:
        engine.process(keys, batch, train=True, timestamp=_TIMESTAMP)
    seconds = time.perf_counter() - started
    engine.drop_prefix(f"{_PREFIX}{run_id}/")
    return seconds


def build_native_bench(out: Path) -> Path:
    """Compiles bench/key_map_bench.cc against TensorFlow's absl headers."""
    include = tf.sysconfig.get_include()
    lib_dir = str(Path(include).parent)
    binary = out / "key_map_bench"
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O3", "-DNDEBUG",
           "-D_GLIBCXX_USE_CXX11_ABI=1", f"-I{ROOT / 'cc_ops'}", "-isystem", include,
           str(ROOT / "bench" / "key_map_bench.cc"), str(ROOT / "cc_ops/engine/huge_pages.cc"),
           "-o", str(binary), f"-L{lib_dir}", "-l:libtensorflow_framework.so.2",
           f"-Wl,-rpath,{lib_dir}"]
    subprocess.run(cmd, check=True)
    return binary


def native(binary: Path, *args) -> Dict[str, float]:
    proc = subprocess.run([str(binary), *map(str, args)], check=True, capture_output=True,
                          text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ceiling_seconds(binary: Path, batch_file: Path) -> float:
    """The ceiling loop's seconds over the batches the others time (all but the first: it
    runs the first untimed, and reserves its maps per batch as the engine does)."""
    return native(binary, "ceiling", batch_file)["seconds"]


# IDs per batch of the memory measurement: the large workload's batch (26 x 4096), so that
# the kept batch scratch is what training keeps, not a million-ID batch's.
MEMORY_BATCH = 106_496


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bytes_per_id(ids: int) -> Dict[str, float]:
    """Host memory per admitted ID of a device-only table fed `ids` distinct IDs:
    RSS growth and the engine's own count of its ID map's bytes.

    Measured in a fresh process, so that no memory freed by earlier runs is reused.
    """
    proc = subprocess.run([sys.executable, __file__, "--memory_ids", str(ids)], check=True,
                          capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_bytes_per_id(ids: int) -> Dict[str, float]:
    engine = loader.engine()
    key = f"{_PREFIX}mem"
    chunk = MEMORY_BATCH
    # Distinct IDs spread over int64, made before the baseline is read.
    stream = (np.arange(ids, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    engine.create_table(key=key, name=key, dim=16, capacity=ids, padding_keys=[],
                        access_threshold=0.0, faae_coefficient=1.0)
    before = rss_bytes()
    for start in range(0, ids, chunk):
        engine.process([key], [stream[start:start + chunk]], train=True, timestamp=_TIMESTAMP)
    grown = rss_bytes() - before
    stats = engine.stats(key)
    assert stats["admitted"] == ids
    engine.drop_prefix(key)
    return {"rss": grown / ids, "id_map": stats["id_map_bytes"] / ids}


def goal(text: str, value: float, target: float, at_most: bool = False) -> dict:
    """A goal in bench/report.py's shape ("(<=)" in the text marks a ceiling for run_all)."""
    met = value <= target if at_most else value >= target
    if at_most:
        text += " (<=)"
    return {"goal": text, "value": round(value, 3), "target": target, "met": bool(met)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer batches and repeats (for RESULTS.md)")
    parser.add_argument("--json", help="write the figures and goals to this file")
    parser.add_argument("--batches", type=int, default=None, help="batches per run")
    parser.add_argument("--repeats", type=int, default=None, help="runs per contender")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="engine threads (the thread-scaling goal compares with 1)")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--memory_ids", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no_memory", action="store_true",
                        help="skip the ID-map and host-memory sections (key-stage rates only)")
    args = parser.parse_args(argv)
    if args.batches is None:
        args.batches = 12 if args.quick else 40
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.batches < 2 or args.repeats < 1 or args.threads < 1:
        parser.error("--batches must be >= 2, --repeats and --threads >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.memory_ids:
        print(json.dumps(measure_bytes_per_id(args.memory_ids)))
        return 0
    tf.compat.v1.disable_eager_execution()
    engine = loader.engine()
    workloads = make_workloads(args.batches, args.seed)
    make_tfra = tfra_table_factory()
    previous_threads = engine.num_threads()
    work_dir = Path(tempfile.mkdtemp(prefix="bench_key_stage_op"))
    binary = build_native_bench(work_dir)
    files = {}
    for w in workloads:
        files[w.name] = work_dir / f"{len(files)}.bin"
        w.write(files[w.name])

    names = (["op", "op per table", "tf", "engine", "engine 1 thread", "ceiling", "feed only",
              "feed packed"]
             + (["tfra"] if make_tfra else []))
    seconds = {(w.name, c): [] for w in workloads for c in names}
    run_id = 0
    try:
        for _ in range(args.repeats):
            for w in workloads:
                for contender in names:
                    run_id += 1
                    engine.set_num_threads(1 if contender == "engine 1 thread" else args.threads)
                    if contender in ("op", "op per table"):
                        s = time_session(w, op_contender(engine, w, run_id, contender == "op"),
                                         packed=contender == "op")
                        engine.drop_prefix(f"{_PREFIX}{run_id}/")
                    elif contender == "feed only":
                        s = time_session(w, feed_contender())
                    elif contender == "feed packed":
                        s = time_session(w, lambda: lambda ids, splits: [tf.size(ids)],
                                         packed=True)
                    elif contender == "tf":
                        s = time_session(w, hash_table_contender(tf_table))
                    elif contender == "tfra":
                        s = time_session(w, hash_table_contender(make_tfra))
                    elif contender == "ceiling":
                        s = ceiling_seconds(binary, files[w.name])
                    else:
                        s = engine_seconds(engine, w, run_id)
                    seconds[(w.name, contender)].append(s)
        engine.set_num_threads(args.threads)
        if not args.no_memory:
            maps = native(binary, "maps", files[workloads[0].name], 10_000_000)
            memory = {n: bytes_per_id(n) for n in [1_000_000, 2_000_000, 10_000_000]}
    finally:
        engine.set_num_threads(previous_threads)
        engine.drop_prefix(_PREFIX)

    figures: Dict[str, object] = {}
    goals = []
    print("## Key stage through the op, against TensorFlow's ops, TFRA and a C++ ceiling\n")
    print(f"- machine: {os.cpu_count()} CPUs ({cpu_name()}); TensorFlow {tf.__version__}; "
          f"engine threads: {args.threads}")
    print(f"- data: synthetic Criteo IDs (power law over int64, vocabularies growing over the "
          f"run); {args.batches} batches, the first untimed; every run from empty tables")
    print(f"- median of {args.repeats} runs, contenders interleaved; keys/s over the timed batches")
    if not make_tfra:
        print("- TFRA: not installed (tensorflow_recommenders_addons does not import), "
              "its column is skipped")
    print()
    print("| workload | new IDs per key | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for w in workloads:
        timed = w.keys - sum(a.size for a in w.batches[0])
        rate = {c: timed / statistics.median(seconds[(w.name, c)]) for c in names}
        print(f"| {w.name} | {w.new_share:.3f} | "
              + " | ".join(f"{rate[c] / 1e6:.1f} M" for c in names) + " |")
        short = "1 table" if w.tables == 1 else f"{w.tables} tables"
        for c in names:
            figures[f"{short}: {c} keys/s"] = round(rate[c])
        figures[f"{short}: new IDs per key"] = round(w.new_share, 4)
        goals.append(goal(f"{short}: op / (tf.unique + MutableHashTable)", rate["op"] / rate["tf"],
                          1.5))
        if make_tfra:
            goals.append(goal(f"{short}: op / TFRA cuckoo", rate["op"] / rate["tfra"], 1.2))
        goals.append(goal(f"{short}: op overhead over the engine alone",
                          rate["engine"] / rate["op"] - 1.0, 0.10, at_most=True))
        # The op's time less the feed's (session.run and the IDs' way in, which
        # every session contender pays) against the engine's.
        net = 1.0 / rate["op"] - 1.0 / rate["feed packed"]
        figures[f"{short}: op overhead over the engine, net of the feed"] = round(
            rate["engine"] * net - 1.0, 3)
        figures[f"{short}: op per table overhead over the engine"] = round(
            rate["engine"] / rate["op per table"] - 1.0, 3)
        goals.append(goal(f"{short}: engine / ({args.threads} threads x ceiling)",
                          rate["engine"] / (args.threads * rate["ceiling"]), 0.8))
        if w.tables == 1 and args.threads > 1:
            goals.append(goal(f"1 table: engine {args.threads} threads / 1 thread",
                              rate["engine"] / rate["engine 1 thread"],
                              1.0 + 0.5 * (args.threads - 1)))
    if args.no_memory:
        return finish(args, figures, goals)
    print("\n## ID map: engine/key_map.h against absl::flat_hash_map, same record (KeyRecord, "
          "16 bytes)\n")
    print(f"- {maps['ids']:,.0f} distinct IDs inserted, then {maps['finds']:,.0f} finds in stream "
          "order")
    print("\n| map | insert ns/ID | find ns/ID | bytes per ID |")
    print("|---|---:|---:|---:|")
    print(f"| KeyMap (12-byte probe slots over record chunks, splitmix64) | "
          f"{maps['keymap_insert_ns']:.1f} | "
          f"{maps['keymap_find_ns']:.1f} | {maps['keymap_bytes_per_id']:.1f} |")
    print(f"| absl::flat_hash_map (absl::Hash) | {maps['absl_insert_ns']:.1f} | "
          f"{maps['absl_find_ns']:.1f} | {maps['absl_bytes_per_id']:.1f} |")
    print(f"| absl::flat_hash_map (splitmix64) | {maps['absl_splitmix_insert_ns']:.1f} | "
          f"{maps['absl_splitmix_find_ns']:.1f} | {maps['absl_bytes_per_id']:.1f} |")
    for k in ("keymap_insert_ns", "keymap_find_ns", "keymap_bytes_per_id", "absl_insert_ns",
              "absl_find_ns", "absl_bytes_per_id"):
        figures[f"map: {k}"] = maps[k]
    print("\n## Host memory per admitted ID of a device-only table\n")
    print(f"RSS growth of a fresh process fed batches of {MEMORY_BATCH:,} new IDs (includes the "
          "batch scratch and the allocator's slack) and the engine's exact count of its ID map "
          "(probe arrays + record chunks, `stats()['id_map_bytes']`).\n")
    print("| IDs | RSS growth, bytes per ID | ID map, bytes per ID |")
    print("|---:|---:|---:|")
    for n, b in memory.items():
        millions = n // 1_000_000
        print(f"| {n:,} | {b['rss']:.1f} | {b['id_map']:.1f} |")
        figures[f"host bytes per ID (RSS), {millions} M IDs"] = round(b["rss"], 1)
        figures[f"host bytes per ID (ID map), {millions} M IDs"] = round(b["id_map"], 1)
        goals.append(goal(f"host bytes per admitted ID, device-only, {millions} M IDs (RSS)",
                          b["rss"], 40, at_most=True))
    return finish(args, figures, goals)


def finish(args, figures: Dict[str, object], goals: List[dict]) -> int:
    print("\n| goal | value | target | met |")
    print("|---|---:|---:|---|")
    for g in goals:
        print(f"| {g['goal']} | {g['value']} | {g['target']} | {'yes' if g['met'] else 'no'} |")
    if args.json:
        figures["goals"] = goals
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
