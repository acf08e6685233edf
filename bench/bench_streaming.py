"""Streaming benchmarks: parsing, trainer overhead, delivery latency, delta apply, MovieLens.

    PYTHONPATH=. .venv/bin/python bench/bench_streaming.py [--sections parse,overhead,...]
        [--movielens ROOT]     # daily partitions from scripts/movielens_partitions.py
    PYTHONPATH=. .venv/bin/python bench/bench_streaming.py --quick --json streaming.json

Sections (each prints a Markdown table; baselines are measured in the same run):

- parse: rows/s of mxrec.streaming's Criteo TSV reader (validation, line numbers,
  salted hashing) against a hand-written tf.data + tf.io.decode_csv + to_hash_bucket_fast
  pipeline on the same file, alternating, best of N.
- overhead: samples/s of the streaming trainer (per partition: one pass, a delta
  checkpoint, the donefile; no scoring pass, no export) against the same model and
  optimizers trained by a plain loop over the same files.
- delivery: seconds from a partition's done marker to the predictor serving the version
  trained on it (trainer in watch mode in a subprocess, predictor polling every 0.1 s).
- delta: time to apply a 1,000-row delta against table size (100k and 1M rows): the
  predictor's in-place apply and writing a delta-only version (both should stay flat),
  and, for comparison, `apply_delta` writing a complete SavedModel (grows with the table).
- ranks: the streaming CLI on 1 process and on 2 ranks (python -m mxrec.launch -n 2 -m
  mxrec.streaming train) over the same partitions: samples/s of the training passes and
  seconds per partition (pass, sharded checkpoint, export, donefile), 2 ranks / 1 process.
  The goal is at --batch_size (1024); the same at --ranks_large_batch (4096, the global
  batch of bench_multiworker) is a figure beside it.
- movielens: progressive AUC and rows in use, in one run on the same daily partitions:
  mxrec with raw IDs, plain TensorFlow with IDs folded into hash buckets, mxrec with
  admission and eviction.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

from bench import report  # noqa: E402
from mxrec.serving import versions  # noqa: E402
from mxrec.serving.predictor import DELTA_FILE, ModelInstance, Predictor, write_delta  # noqa: E402
from mxrec.streaming import donefile, models, parsers  # noqa: E402
from mxrec.streaming.trainer import StreamConfig, StreamingTrainer, prepared_step  # noqa: E402
from mxrec.util import initialize  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The shared samples lie beside the checkout.
SAMPLE = os.path.join(os.path.dirname(REPO), "shared", "data", "criteo_sample.csv")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} CPUs, TF {tf.__version__}"


def criteo_tsv(path: str, rows: int, seed: int = 0) -> None:
    """Criteo-like TSV: the shared sample's value distributions, with fresh hex IDs."""
    rng = np.random.default_rng(seed)
    ints = rng.integers(-1, 2000, size=(rows, 13))
    empty = rng.random((rows, 13)) < 0.2
    cats = rng.zipf(1.2, size=(rows, 26)) % 100_000
    cat_empty = rng.random((rows, 26)) < 0.05
    labels = rng.integers(0, 2, size=rows)
    with open(path, "w") as f:
        for i in range(rows):
            dense = ["" if empty[i, j] else str(ints[i, j]) for j in range(13)]
            sparse = ["" if cat_empty[i, j] else f"{cats[i, j] * 2654435761 % (1 << 32):08x}"
                      for j in range(26)]
            f.write("\t".join([str(labels[i])] + dense + sparse) + "\n")


def _drain(dataset) -> float:
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    with tf.compat.v1.Session(graph=batch["label"].graph if isinstance(batch, dict)
                              else batch[0].graph) as sess:
        start = time.perf_counter()
        while True:
            try:
                sess.run(batch)
            except tf.errors.OutOfRangeError:
                return time.perf_counter() - start


def _hand_written(path: str, batch_size: int):
    defaults = [[0.0]] + [[0.0]] * 13 + [[""]] * 26

    def parse(lines):
        fields = tf.io.decode_csv(lines, defaults, field_delim="\t")
        return {"label": fields[0], "dense": tf.stack(fields[1:14], axis=1),
                "sparse": tf.strings.to_hash_bucket_fast(tf.stack(fields[14:], axis=1),
                                                         1 << 56)}

    return tf.data.TextLineDataset(path).batch(batch_size).map(
        parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)


def bench_parse(rows: int, batch_size: int, repeats: int, out: report.Report) -> None:
    work = tempfile.mkdtemp(prefix="bench_parse_")
    path = os.path.join(work, "part-00000")
    criteo_tsv(path, rows)
    best = {"mxrec": float("inf"), "hand": float("inf")}
    for _ in range(repeats):
        for name in ("mxrec", "hand"):
            with tf.Graph().as_default():
                dataset = (parsers.make_dataset([path], parsers.CRITEO_TSV, batch_size)
                           if name == "mxrec" else _hand_written(path, batch_size))
                best[name] = min(best[name], _drain(dataset))
    print(f"\n### Parsing Criteo TSV ({rows:,} rows, batch {batch_size}, best of {repeats}; "
          f"{machine()})\n")
    print("| reader | rows/s | ratio |\n|---|---|---|")
    for name, label in (("hand", "tf.data + tf.io.decode_csv + to_hash_bucket_fast (baseline)"),
                        ("mxrec", "mxrec.streaming.parsers (validated, line numbers, salted)")):
        print(f"| {label} | {rows / best[name]:,.0f} | {best['hand'] / best[name]:.2f} |")
    out.figure("parse: mxrec reader rows/s", round(rows / best["mxrec"]))
    out.figure("parse: mxrec reader x hand-written tf.data", round(best["hand"] / best["mxrec"], 3))
    shutil.rmtree(work)


def _hourly_stream(root: str, partitions: int, rows: int, seed: int = 0) -> list:
    names = []
    for index in range(partitions):
        name = f"20240101/{index:02d}"
        folder = os.path.join(root, name)
        os.makedirs(folder)
        criteo_tsv(os.path.join(folder, "part-00000"), rows, seed + index)
        open(os.path.join(folder, "_SUCCESS"), "w").close()
        names.append(name)
    return names


MODEL = dict(kind="wide_deep", dim=8, hidden=(64, 32), vocabulary=1_500_000)


def _plain_loop(files, batch_size: int, threads: int) -> float:
    """The same model and optimizers, one pass over all files in a plain loop."""
    from mxrec.optimizers.adagrad import create_hash_optimizer
    from mxrec.util.variable import get_dense_and_sparse_variable

    initialize.init()
    try:
        with tf.Graph().as_default() as graph:
            # Made before the clock starts, as the streaming trainer's pipeline (made once
            # per run, in its initializer); the step is prepared before it too, as the
            # trainer's (its executors built at start-up: no graph set-up in either time).
            iterator = tf.compat.v1.data.make_initializable_iterator(
                parsers.make_dataset(files, parsers.CRITEO_TSV, batch_size))
            batch = iterator.get_next()
            logits = models.make_model_fn(models.ModelConfig(**MODEL))(
                {"sparse": batch["sparse"], "dense": batch["dense"]}, True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=batch["label"], logits=logits))
            dense, sparse = get_dense_and_sparse_variable()
            grads = tf.gradients(loss, dense + sparse)
            train = tf.group(
                tf.compat.v1.train.AdamOptimizer(0.001).apply_gradients(
                    zip(grads[:len(dense)], dense)),
                create_hash_optimizer(0.05).apply_gradients(zip(grads[len(dense):], sparse)))
            config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                              inter_op_parallelism_threads=threads)
            with tf.compat.v1.Session(graph=graph, config=config) as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), iterator.initializer])
                step = prepared_step(sess, {"train": train})
                start = time.perf_counter()
                while True:
                    try:
                        step()
                    except tf.errors.OutOfRangeError:
                        return time.perf_counter() - start
    finally:
        initialize.terminate_config_initializer()


def _streaming(root: str, work: str, batch_size: int, threads: int, export_base=None,
               validation="none", model=None):
    config = StreamConfig(data=root, schema=parsers.CRITEO_TSV, workdir=work,
                          export_base=export_base, batch_size=batch_size,
                          validation=validation, progress=False, tensorboard=False,
                          threads=threads)
    start = time.perf_counter()
    entries = StreamingTrainer(config, models.make_model_fn(
        model or models.ModelConfig(**MODEL))).run()
    return entries, time.perf_counter() - start


def bench_overhead(partitions: int, rows: int, batch_size: int, threads: int,
                   repeats: int, out: report.Report) -> None:
    work = tempfile.mkdtemp(prefix="bench_overhead_")
    root = os.path.join(work, "data")
    names = _hourly_stream(root, partitions, rows)
    files = [os.path.join(root, n, "part-00000") for n in names]
    total = partitions * rows
    plain, stream, stream_train, saves = [], [], [], []
    for r in range(repeats):  # alternating which goes first
        if r % 2 == 0:
            plain.append(_plain_loop(files, batch_size, threads))
        entries, _ = _streaming(root, os.path.join(work, f"w{r}"), batch_size, threads)
        stream.append(sum(e["seconds"] for e in entries))
        stream_train.append(sum(e["train_seconds"] for e in entries))
        saves.append(sum(e["stage_seconds"]["save"] for e in entries))
        if r % 2 == 1:
            plain.append(_plain_loop(files, batch_size, threads))
    print(f"\n### Streaming overhead ({partitions} partitions x {rows:,} rows, batch "
          f"{batch_size}, wide_deep dim 8, {threads or 'default'} threads, best of "
          f"{repeats}; {machine()})\n")
    print("| loop | samples/s | ratio to plain |\n|---|---|---|")
    base = total / min(plain)
    print(f"| plain loop over all files (baseline) | {base:,.0f} | 1.00 |")
    print(f"| streaming: training passes only | {total / min(stream_train):,.0f} | "
          f"{total / min(stream_train) / base:.3f} |")
    print(f"| streaming: + per-partition delta checkpoint and donefile | "
          f"{total / min(stream):,.0f} | {total / min(stream) / base:.3f} |")
    best = stream.index(min(stream))
    print(f"\nOf the best streaming run's {stream[best]:.2f} s: training passes "
          f"{stream_train[best]:.2f} s, checkpoint saves {saves[best]:.2f} s (the entries' "
          f"stage_seconds), the rest (donefile, partition set-up) "
          f"{stream[best] - stream_train[best] - saves[best]:.2f} s.")
    out.goal("streaming training passes: x plain loop", total / min(stream_train) / base, 0.95)
    out.figure("streaming + delta checkpoint and donefile: x plain loop",
               round(total / min(stream) / base, 3))
    shutil.rmtree(work)


def _cli_run(ranks: int, root: str, work: str, batch_size: int, vocabulary: int) -> list:
    argv = ["-m", "mxrec.streaming", "train", "--data", root, "--model-dir",
            os.path.join(work, "model"), "--export-base", os.path.join(work, "export"),
            "--format", "criteo", "--model", "wide_deep", "--dim", "8", "--vocabulary",
            str(vocabulary), "--batch_size", str(batch_size), "--validation", "none",
            "--no_tensorboard", "--no_progress"]
    if ranks > 1:
        argv = ["-m", "mxrec.launch", "-n", str(ranks)] + argv
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"streaming on {ranks} rank(s) failed: {result.stderr[-2000:]}")
    return donefile.read(os.path.join(work, "model", "donefile.jsonl"))


def bench_ranks(partitions: int, rows: int, batch_size: int, repeats: int,
                out: report.Report, goal: bool = True) -> None:
    work = tempfile.mkdtemp(prefix="bench_ranks_")
    root = os.path.join(work, "data")
    _hourly_stream(root, partitions, rows)
    total = partitions * rows
    train = {1: [], 2: []}
    whole = {1: [], 2: []}
    for r in range(repeats):  # alternating which goes first
        for ranks in ((1, 2) if r % 2 == 0 else (2, 1)):
            # every ID of the run fits a rank's table (26 per line at most)
            entries = _cli_run(ranks, root, os.path.join(work, f"r{r}-{ranks}"), batch_size,
                               max(200_000, total * 26))
            assert sum(e["rows"] for e in entries) == total
            train[ranks].append(sum(e["train_seconds"] for e in entries))
            whole[ranks].append(sum(e["seconds"] for e in entries))
    print(f"\n### Streaming on ranks ({partitions} partitions x {rows:,} rows, global batch "
          f"{batch_size}, wide_deep dim 8, best of {repeats}; {machine()})\n")
    print("| run | training samples/s | seconds per partition (all stages) | ratio (training) "
          "|\n|---|---|---|---|")
    base = total / min(train[1])
    for ranks in (1, 2):
        speed = total / min(train[ranks])
        print(f"| {ranks} rank(s) | {speed:,.0f} | {min(whole[ranks]) / partitions:.2f} | "
              f"{speed / base:.3f} |")
    ratio = total / min(train[2]) / base
    if goal:
        out.goal("streaming on 2 ranks: training x 1 process", ratio, 0.8)
    else:
        out.figure(f"streaming on 2 ranks, global batch {batch_size}: training x 1 process",
                   round(ratio, 3))
    out.figure(f"streaming on 2 ranks, global batch {batch_size}: whole partition x 1 process",
               round(min(whole[1]) / min(whole[2]), 3))
    shutil.rmtree(work)


def bench_delivery(partitions: int, rows: int, mode: str) -> list:
    work = tempfile.mkdtemp(prefix="bench_delivery_")
    root, export = os.path.join(work, "data"), os.path.join(work, "export")
    os.makedirs(root)
    staging = os.path.join(work, "staging")
    names = _hourly_stream(staging, partitions, rows)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    # The first partition before the trainer starts (the full version); then one at a time.
    os.makedirs(os.path.join(root, "20240101"))
    os.rename(os.path.join(staging, names[0]), os.path.join(root, names[0]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mxrec.streaming", "train", "--data", root, "--workdir",
         os.path.join(work, "w"), "--export_base", export, "--watch", "--poll_interval", "0.1",
         "--deadline", "600", "--validation", "none", "--delta_export", mode, "--vocabulary",
         "1500000", "--no_progress", "--no_tensorboard"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    latencies = []
    try:
        predictor = Predictor(export)
        deadline = time.time() + 300
        while predictor.version is None and time.time() < deadline:
            predictor.poll()
            time.sleep(0.1)
        for step, name in enumerate(names[1:], start=2):
            os.rename(os.path.join(staging, name), os.path.join(root, name))
            marked = time.time()
            while predictor.version != step and time.time() < deadline:
                predictor.poll()
                time.sleep(0.1)
            latencies.append(time.time() - marked)
        predictor.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    entries = donefile.read(os.path.join(work, "w", "donefile.jsonl"))
    shutil.rmtree(work)
    return latencies, entries


def _grow_export(small_export: str, out: str, rows: int, dim: int) -> None:
    """A copy of an export whose "embedding" table holds `rows` IDs (via apply_delta)."""
    from mxrec.export import saved_model as serving

    rng = np.random.default_rng(0)
    ids = rng.choice(np.int64(1) << 60, size=rows, replace=False).astype(np.int64)
    serving.apply_delta(small_export, {"embedding": {
        "ids": ids, "embeddings": rng.normal(size=(rows, dim)).astype(np.float32)}}, out)


def bench_delta(sizes, changed: int, results: report.Report) -> None:
    from mxrec.export import saved_model as serving

    work = tempfile.mkdtemp(prefix="bench_delta_")
    root, export = os.path.join(work, "data"), os.path.join(work, "export")
    _hourly_stream(root, 1, 2000)
    _streaming(root, os.path.join(work, "w"), 512, 0, export_base=export)
    small = os.path.join(export, "1")
    dim = MODEL["dim"]
    print(f"\n### Delta apply against table size ({changed:,} changed rows: half updated, "
          f"half new; dim {dim}; {machine()})\n")
    print("| table rows | predictor in place, median of 5 (s) | write delta-only version (s) | "
          "apply_delta -> complete SavedModel (s) |\n|---|---|---|---|")
    rng = np.random.default_rng(1)
    for size in sizes:
        big = os.path.join(work, f"big{size}", "1")
        _grow_export(small, big, size, dim)
        tables = serving.exported_tables(big)
        known = tables["embedding"]["ids"]
        delta = {"embedding": {
            "ids": np.concatenate([rng.choice(known, changed // 2, replace=False),
                                   rng.integers(1 << 61, 1 << 62, changed // 2)]),
            "embeddings": rng.normal(size=(changed, dim)).astype(np.float32)}}
        instance = ModelInstance(big)
        times = []
        for round_ in range(5):  # five deltas of fresh and known IDs; the median
            fresh = rng.integers(1 << 61, 1 << 62, changed // 2)
            round_delta = {"embedding": dict(delta["embedding"], ids=np.concatenate(
                [delta["embedding"]["ids"][:changed // 2], fresh]))}
            start = time.perf_counter()
            instance.apply_delta(2 + round_, round_delta, {})
            times.append(time.perf_counter() - start)
        in_place = float(np.median(times))
        instance.close()
        start = time.perf_counter()
        out = versions.staging_dir(os.path.dirname(big), 2)
        os.makedirs(out)
        write_delta(os.path.join(out, DELTA_FILE), delta, {})
        versions.publish(out, os.path.dirname(big), 2, {"kind": "delta", "base": 1})
        delta_only = time.perf_counter() - start
        start = time.perf_counter()
        serving.apply_delta(big, delta, os.path.join(work, f"big{size}", "3"))
        full = time.perf_counter() - start
        print(f"| {size:,} | {in_place:.4f} | {delta_only:.4f} | {full:.3f} |")
        results.figure(f"delta apply in place, {size:,} rows (s)", round(in_place, 4))
    shutil.rmtree(work)


def bench_movielens(root: str, batch_size: int, buckets: int, sparse_lr: float,
                    dense_lr: float) -> None:
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    from movielens_partitions import SCHEMA

    schema = parsers.parse_schema_spec(SCHEMA)
    common = dict(kind="wide_deep", dim=8, hidden=(32, 16), vocabulary=20_000,
                  init_stddev=0.01)
    variants = [
        ("mxrec, raw IDs", models.ModelConfig(**common)),
        (f"plain TF, {buckets:,} hash buckets", models.ModelConfig(**common, buckets=buckets)),
        ("mxrec, admission 2 + eviction 30 days", models.ModelConfig(
            **common, access_threshold=2, eviction_threshold=30 * 86400)),
    ]
    print(f"\n### MovieLens-100k, daily partitions ({root}), wide_deep dim 8, batch "
          f"{batch_size}, Adagrad {sparse_lr} on tables, Adam {dense_lr} on dense; progressive "
          f"validation (each day scored before training on it); {machine()}\n")
    print("| model | progressive AUC (row-weighted over days) | pooled log loss | "
          "rows in use at the end | seconds |\n|---|---|---|---|---|")
    for label, model in variants:
        work = tempfile.mkdtemp(prefix="bench_ml_")
        config = StreamConfig(data=root, schema=schema, workdir=work, batch_size=batch_size,
                              validation="partition", full_every=30, evict_daily=True,
                              progress=False, tensorboard=False,
                              sparse_learning_rate=sparse_lr, dense_learning_rate=dense_lr)
        start = time.perf_counter()
        entries = StreamingTrainer(config, models.make_model_fn(model)).run()
        seconds = time.perf_counter() - start
        scored = [e for e in entries if e["metrics"]["auc"] == e["metrics"]["auc"]]
        weights = np.array([e["metrics"]["rows"] for e in scored], np.float64)
        auc = float(np.average([e["metrics"]["auc"] for e in scored], weights=weights))
        all_rows = np.array([e["metrics"]["rows"] for e in entries], np.float64)
        loss = float(np.average([e["metrics"]["logloss"] for e in entries], weights=all_rows))
        rows_in_use = (sum(entries[-1]["table_rows"].values()) if model.buckets is None
                       else 2 * model.buckets)
        print(f"| {label} | {auc:.4f} | {loss:.4f} | {rows_in_use:,} | {seconds:.0f} |")
        shutil.rmtree(work)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="parse,overhead,delivery,delta,ranks",
                        help="comma-separated: parse, overhead, delivery, delta, ranks, "
                             "movielens")
    parser.add_argument("--parse_rows", type=int, default=None,
                        help="rows parsed (200000; --quick 50000)")
    parser.add_argument("--partitions", type=int, default=2,
                        help="partitions of the overhead run (2)")
    parser.add_argument("--rows", type=int, default=None,
                        help="rows per partition of the overhead run (60000; --quick 20000)")
    parser.add_argument("--batch_size", type=int, default=1024, help="batch size (1024)")
    parser.add_argument("--ranks_large_batch", type=int, default=4096,
                        help="ranks: a second global batch, reported as a figure (4096; 0: "
                             "none)")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow threads (0: default)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats, best taken (4; --quick 2)")
    parser.add_argument("--delta_sizes", default=None,
                        help="table sizes of the delta section (100000,1000000; --quick "
                             "100000)")
    parser.add_argument("--movielens", default=None,
                        help="data root of scripts/movielens_partitions.py (movielens section)")
    parser.add_argument("--buckets", type=int, default=1000,
                        help="hash buckets per table of the plain-TF baseline (1000)")
    parser.add_argument("--sparse_lr", type=float, default=0.05,
                        help="movielens: Adagrad learning rate of the tables (0.05)")
    parser.add_argument("--dense_lr", type=float, default=0.001,
                        help="movielens: Adam learning rate of the dense part (0.001)")
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    quick = {"parse_rows": (200_000, 50_000), "rows": (60_000, 20_000), "repeats": (4, 2),
             "delta_sizes": ("100000,1000000", "100000")}
    for name, (full, short) in quick.items():
        if getattr(args, name) is None:
            setattr(args, name, short if args.quick else full)
    out = report.Report()
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - {"parse", "overhead", "delivery", "delta", "ranks",
                                      "movielens"})
    if unknown:
        parser.error(f"--sections: unknown {unknown}")
    if "movielens" in sections and not (args.movielens and os.path.isdir(args.movielens)):
        parser.error(f"--movielens {args.movielens!r} is not a folder (needed by the "
                     "movielens section)")
    if "parse" in sections:
        bench_parse(args.parse_rows, args.batch_size, args.repeats, out)
    if "overhead" in sections:
        bench_overhead(args.partitions, args.rows, args.batch_size, args.threads, args.repeats,
                       out)
    if "delivery" in sections:
        print(f"\n### Delivery: done marker -> predictor serving the version ({machine()})\n")
        print("| serving versions | seconds per partition (marker to served) | of which "
              "training + save + export (s) |\n|---|---|---|")
        for mode in ("savedmodel", "delta_only"):
            latencies, entries = bench_delivery(3 if args.quick else 4, 5000, mode)
            out.figure(f"delivery, {mode}: marker to served, median (s)",
                       round(float(np.median(latencies)), 2))
            work = [e["seconds"] for e in entries[1:]]
            print(f"| {mode} | {', '.join(f'{x:.2f}' for x in latencies)} | "
                  f"{', '.join(f'{x:.2f}' for x in work)} |")
    if "ranks" in sections:
        bench_ranks(args.partitions, args.rows, args.batch_size, args.repeats, out)
        if args.ranks_large_batch:
            bench_ranks(args.partitions, args.rows, args.ranks_large_batch, args.repeats, out,
                        goal=False)
    if "delta" in sections:
        bench_delta([int(s) for s in args.delta_sizes.split(",")], 1000, out)
    if "movielens" in sections:
        bench_movielens(args.movielens, 256, args.buckets, args.sparse_lr, args.dense_lr)
    out.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
