"""What int8 serving and half-precision tables cost in quality: `mxrec.quality` on a
synthetic Criteo stream and on MovieLens-100k.

    PYTHONPATH=. .venv/bin/python bench/bench_quality.py [--quick] [--json PATH]
        [--movielens-source DIR]    # ml-100k.inter/.user/.item (default: the recbole wheel)

For each data set one wide_deep model (float32 tables) is trained on every partition but
the held-out last ones, then scored on those with a float32 and an int8 serving SavedModel
of the same checkpoint; two more models whose tables rest in bfloat16 and float16 while
training are trained on the same partitions and scored the same way (`python -m
mxrec.quality --compare float32,int8,bfloat16,float16`). The table gives AUC, log loss, the
serving model's bytes, the tables' serving bytes per ID (the 8-byte ID plus its row), an
ID's row bytes at rest while training, and an ID's row and optimizer slot in each training
tier (device variables, host tier, SSD record: mxrec.quality.tier_bytes). The float32 form
is the baseline of the same run.

- criteo: Criteo's TSV layout (label, 13 integers, 26 hex categorical columns), labels
  drawn from a hidden per-ID effect of every categorical column, so AUC means something.
- movielens: MovieLens-100k from the recbole 1.2.1 wheel (pip download, outside the
  repository: its licence forbids redistribution), one partition per day
  (scripts/movielens_partitions.py), label = rating >= 4; the last days held out.
"""

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import movielens_partitions  # noqa: E402

from bench import report  # noqa: E402
from mxrec.quality import report as quality  # noqa: E402
from mxrec.streaming import models, parsers  # noqa: E402
from mxrec.streaming.trainer import StreamConfig  # noqa: E402

AUC_GOAL = 0.002  # int8 serving within this AUC of float32 (the goal)
BYTES_GOAL = 0.27  # int8 tables' bytes x float32's
HALF_AUC_GOAL = 0.001  # bfloat16 tables within this AUC of float32 (the goal)
HALF_BYTES_GOAL = 0.5  # bfloat16 training row bytes x float32's


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, " \
           f"TF {tf.__version__}"


def criteo_stream(root: str, partitions: int, rows: int, seed: int = 0) -> None:
    """Hourly partitions in Criteo's TSV layout whose labels depend on the IDs."""
    rng = np.random.default_rng(seed)
    vocabulary = 5_000
    effect = rng.normal(0, 1.0, size=(26, vocabulary))
    for index in range(partitions):
        folder = os.path.join(root, f"20240101/{index:02d}")
        os.makedirs(folder)
        cats = rng.zipf(1.3, size=(rows, 26)) % vocabulary
        ints = rng.integers(0, 3, size=(rows, 13))
        logit = effect[np.arange(26), cats].sum(axis=1) / np.sqrt(26) * 1.5 - 0.5
        labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
        with open(os.path.join(folder, "part-00000"), "w") as f:
            for i in range(rows):
                hexes = [f"{(c * 2654435761 + j) % (1 << 32):08x}" for j, c in
                         enumerate(cats[i])]
                f.write("\t".join([str(labels[i])] + [str(v) for v in ints[i]] + hexes)
                        + "\n")
        open(os.path.join(folder, "_SUCCESS"), "w").close()


def run(name: str, data: str, schema, holdout: int, dim: int, batch_size: int,
        sparse_lr: float, out: report.Report) -> None:
    """Trains, scores both forms, prints the table, records figures and goals."""
    work = tempfile.mkdtemp(prefix=f"bench_quality_{name}_")
    config = StreamConfig(data=data, schema=schema, workdir=work, batch_size=batch_size,
                          progress=False, tensorboard=False, validation="none",
                          sparse_learning_rate=sparse_lr, dense_learning_rate=0.005)
    model = models.ModelConfig("wide_deep", dim=dim, hidden=(64, 32), vocabulary=400_000)
    rows = quality.compare(config, model, ["float32", "int8", "bfloat16", "float16"], holdout)
    base, int8 = rows[:2]
    print(f"\n### {name}: wide_deep dim {dim}, {base.rows:,} held-out rows "
          f"(last {holdout} partitions), {base.ids:,} IDs; {machine()}\n")
    print(quality.table(rows))
    ratio = int8.table_bytes / base.table_bytes
    out.figure(f"{name}: float32 AUC", round(base.auc, 5))
    out.figure(f"{name}: int8 AUC", round(int8.auc, 5))
    out.figure(f"{name}: float32 log loss", round(base.logloss, 5))
    out.figure(f"{name}: int8 log loss", round(int8.logloss, 5))
    out.figure(f"{name}: int8 AUC - float32 AUC (x 1e6)", round((int8.auc - base.auc) * 1e6, 1))
    out.figure(f"{name}: int8 table bytes per ID", round(int8.bytes_per_id, 2))
    out.figure(f"{name}: float32 table bytes per ID", round(base.bytes_per_id, 2))
    out.figure(f"{name}: int8 serving model bytes x float32",
               round(int8.model_bytes / base.model_bytes, 4))
    out.goal(f"{name}: int8 AUC - float32 AUC (>= -{AUC_GOAL})", int8.auc - base.auc,
             -AUC_GOAL)
    out.goal(f"{name}: int8 table bytes x float32 at dim {dim} (<=)", ratio, BYTES_GOAL,
             lower_is_better=True)
    half_precision(name, base, rows[2:], out)


def half_precision(name: str, base, rows, out: report.Report) -> None:
    """The figures and goals of the bfloat16 and float16 models against float32's."""
    for row in rows:
        out.figure(f"{name}: {row.form} AUC", round(row.auc, 5))
        out.figure(f"{name}: {row.form} log loss", round(row.logloss, 5))
        out.figure(f"{name}: {row.form} AUC - float32 AUC (x 1e6)",
                   round((row.auc - base.auc) * 1e6, 1))
        out.figure(f"{name}: {row.form} training row bytes per ID",
                   round(row.train_bytes_per_id, 2))
    out.figure(f"{name}: float32 training row bytes per ID", round(base.train_bytes_per_id, 2))
    # An ID's row and Adagrad slot in each training tier, as the engine lays them out.
    for row in [base, *rows]:
        for tier in ("device", "host", "ssd"):
            out.figure(f"{name}: {row.form} {tier} bytes per ID (row + slot)",
                       round(getattr(row.tiers, tier), 1))
    bf16 = rows[0]
    out.goal(f"{name}: bfloat16 AUC - float32 AUC (>= -{HALF_AUC_GOAL})", bf16.auc - base.auc,
             -HALF_AUC_GOAL)
    out.goal(f"{name}: bfloat16 training row bytes x float32 (<=)",
             bf16.train_bytes_per_id / base.train_bytes_per_id, HALF_BYTES_GOAL,
             lower_is_better=True)


def movielens(args, out: report.Report) -> None:
    work = tempfile.mkdtemp(prefix="bench_quality_movielens_")
    try:
        source = args.movielens_source or movielens_partitions.download(
            os.path.join(tempfile.gettempdir(), "mxrec_recbole"))
    except (OSError, subprocess.CalledProcessError, zipfile.BadZipFile) as error:
        # No network or no wheel: the section says why it did not run.
        print(f"\n### movielens: not run ({type(error).__name__}: {error})")
        out.figure("movielens", f"not run: {type(error).__name__}")
        return
    data = os.path.join(work, "data")
    summary = movielens_partitions.write_partitions(source, data,
                                                    60 if args.quick else None)
    schema = parsers.parse_schema_spec(movielens_partitions.SCHEMA)
    print(f"\nMovieLens-100k: {summary['rows']:,} ratings in {summary['days']} days")
    run("movielens", data, schema, 10 if args.quick else 30, args.dim, 256, 0.3, out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_arguments(parser)
    parser.add_argument("--dim", type=int, default=64, help="embedding width (64)")
    parser.add_argument("--movielens-source", default=None,
                        help="a folder with ml-100k.inter/.user/.item (default: the recbole "
                             "1.2.1 wheel, fetched with pip into the temp folder)")
    parser.add_argument("--sections", default="criteo,movielens",
                        help="criteo, movielens or both (default)")
    args = parser.parse_args(argv)
    out = report.Report()
    sections = set(args.sections.split(","))
    if "criteo" in sections:
        data = tempfile.mkdtemp(prefix="bench_quality_criteo_")
        partitions, rows = (3, 6_000) if args.quick else (5, 40_000)
        criteo_stream(data, partitions, rows)
        run("criteo", data, parsers.CRITEO_TSV, 1, args.dim, 512, 0.05, out)
    if "movielens" in sections:
        movielens(args, out)
    out.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
