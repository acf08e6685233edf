"""The quality report: AUC, log loss and bytes of each form of one trained model.

    >>> rows = compare("/data/criteo", "/models/q", ["float32", "int8"], schema, model)
    >>> print(table(rows))

A form is how the model's rows are kept: "float32" (rows as trained) or "int8" (serving
rows quantized per row, `mxrec.export.quantize`). Every form is scored on the same
held-out partitions with its own serving SavedModel, so the comparison is what a predictor
would answer. Tables stored in half precision (bfloat16, float16) train with
`--storage_dtype` (one model dir each, scored here as its float32 form); their columns in
this report are not built yet: naming them is refused.
"""

import dataclasses
import os
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mxrec import initialize
from mxrec.export import quantize as quantizer
from mxrec.export import saved_model
from mxrec.streaming import donefile, metrics, models, parsers, partitions
from mxrec.streaming.trainer import DEFAULT_SIGNATURE, StreamConfig, StreamingTrainer

# Form -> the serving export's quantize.
FORMS: Dict[str, Optional[str]] = {"float32": None, "int8": quantizer.INT8}
# Storage dtypes of the training tables: their columns in this report are not built yet.
NOT_BUILT = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
             "fp16": "float16", "half": "float16"}


def parse_forms(text: str) -> List[str]:
    """"float32,int8" -> ["float32", "int8"].

    Raises:
        ValueError: an empty list, a repeated form, a storage dtype (no column yet), or an
            unknown name (naming the accepted ones).
    """
    forms = [name.strip() for name in text.split(",") if name.strip()]
    if not forms:
        raise ValueError(f"--compare names no form; accepted: {', '.join(FORMS)}")
    for name in forms:
        if name.lower() in NOT_BUILT:
            raise ValueError(f"--compare: the {NOT_BUILT[name.lower()]} storage column is not "
                             f"built yet (train a model dir with --storage_dtype "
                             f"{NOT_BUILT[name.lower()]} and compare its float32 form); "
                             f"accepted: {', '.join(FORMS)}")
        if name not in FORMS:
            raise ValueError(f"--compare: unknown form {name!r}; accepted: {', '.join(FORMS)}")
    if len(set(forms)) != len(forms):
        raise ValueError(f"--compare names a form twice: {text!r}")
    return forms


@dataclasses.dataclass
class Row:
    """One form's figures on the held-out partitions."""

    form: str
    auc: float
    logloss: float
    rows: int
    model_bytes: int  # the serving SavedModel folder, every file
    table_bytes: int  # the tables' serving variables (IDs and rows)
    ids: int

    @property
    def bytes_per_id(self) -> float:
        return self.table_bytes / max(self.ids, 1)


def split(data: str, holdout: int, done_marker: str, granularity: Optional[str]):
    """(partitions to train on, held-out partitions): the last `holdout` ready ones held out.

    Raises:
        ValueError: fewer than holdout + 1 ready partitions.
    """
    if holdout < 1:
        raise ValueError(f"--holdout must be >= 1, got {holdout}")
    ready = partitions.of_granularity(partitions.list_partitions(data, done_marker),
                                      granularity)
    if len(ready) < holdout + 1:
        raise ValueError(f"--data {data!r} has {len(ready)} ready partitions; the report needs "
                         f"at least --holdout + 1 = {holdout + 1} (training, then held out)")
    return ready[:-holdout], ready[-holdout:]


def train(config: StreamConfig, model: models.ModelConfig, train_on, held_out) -> StreamingTrainer:
    """Trains the partitions of `train_on` the model dir's donefile does not list yet.

    Raises:
        ValueError: the model dir was trained on a held-out partition.
    """
    done = {entry["partition"] for entry in donefile.read(config.donefile)}
    seen = sorted(done & {p.name for p in held_out})
    if seen:
        raise ValueError(f"--model-dir {config.workdir!r} was trained on held-out partitions "
                         f"{seen}; use a fresh model dir or a larger --holdout")
    remaining = sum(p.name not in done for p in train_on)
    trainer = StreamingTrainer(dataclasses.replace(config, max_partitions=remaining or None),
                               models.make_model_fn(model))
    if remaining:
        try:
            trainer.run()
        finally:
            initialize.terminate_config_initializer()
            tf.compat.v1.reset_default_graph()
    return trainer


def _export(trainer: StreamingTrainer, export_dir: str, quantize: Optional[str]) -> str:
    """A serving SavedModel of the model dir's latest checkpoint, as the trainer exports."""
    schema = trainer.config.schema

    def build():
        inputs = {"sparse": tf.compat.v1.placeholder(tf.int64, [None, schema.num_sparse],
                                                     name="sparse")}
        if schema.num_dense:
            inputs["dense"] = tf.compat.v1.placeholder(tf.float32, [None, schema.num_dense],
                                                       name="dense")
        logits = trainer.model_fn(dict(inputs), False)
        return inputs, {"logits": logits}

    return saved_model.export_saved_model(export_dir, trainer.config.checkpoint_dir, build,
                                          signature_name=DEFAULT_SIGNATURE, quantize=quantize)


def _score(export_dir: str, files: Sequence[str], schema, batch_size: int) -> Dict[str, float]:
    """AUC and log loss of the SavedModel's logits over the files' records."""
    labels, logits = [], []
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, [tf.saved_model.SERVING], export_dir)
        signature = meta.signature_def[DEFAULT_SIGNATURE]
        batch = tf.compat.v1.data.make_one_shot_iterator(
            parsers.make_dataset(list(files), schema, batch_size)).get_next()
        wanted = {k: batch[k] for k in signature.inputs}
        while True:
            try:
                values = sess.run({"label": batch["label"], **wanted})
            except tf.errors.OutOfRangeError:
                break
            feed = {signature.inputs[k].name: values[k] for k in wanted}
            logits.append(sess.run(signature.outputs["logits"].name, feed))
            labels.append(values["label"])
    return metrics.evaluate(np.concatenate(labels), np.concatenate(logits))


def _sizes(export_dir: str):
    """(bytes of every file of the export, bytes of its tables' serving variables, IDs)."""
    total = sum(os.path.getsize(os.path.join(folder, name))
                for folder, _, names in os.walk(export_dir) for name in names)
    tables = saved_model.exported_tables(export_dir)
    ids = sum(len(t["ids"]) for t in tables.values())
    rows = sum(t["ids"].nbytes + (t[quantizer.QUANTIZED].nbytes
                                  + t[quantizer.SCALE_OFFSET].nbytes
                                  if quantizer.QUANTIZED in t else t["embeddings"].nbytes)
               for t in tables.values())
    return total, rows, ids


def compare(config: StreamConfig, model: models.ModelConfig, forms: Sequence[str],
            holdout: int = 1) -> List[Row]:
    """Trains (what the model dir lacks), exports each form and scores the held-out
    partitions; returns one Row per form. The exports are written in a temporary folder
    of the model dir and removed."""
    train_on, held_out = split(config.data, holdout, config.done_marker, config.granularity)
    trainer = train(config, model, train_on, held_out)
    files = [f for p in held_out for f in p.files]
    scratch = tempfile.mkdtemp(prefix=".quality-", dir=config.workdir)
    out = []
    try:
        for form in forms:
            export_dir = _export(trainer, os.path.join(scratch, form), FORMS[form])
            scored = _score(export_dir, files, config.schema, config.batch_size)
            total, table_bytes, ids = _sizes(export_dir)
            out.append(Row(form, scored["auc"], scored["logloss"], scored["rows"], total,
                           table_bytes, ids))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def table(rows: Sequence[Row]) -> str:
    """A Markdown table of the rows, each against the first (the baseline)."""
    base = rows[0]
    lines = ["| form | AUC | ΔAUC | log loss | serving model bytes | table bytes per ID | "
             "x bytes |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row.form} | {row.auc:.5f} | {row.auc - base.auc:+.5f} | "
                     f"{row.logloss:.5f} | {row.model_bytes:,} | {row.bytes_per_id:.1f} | "
                     f"{row.table_bytes / max(base.table_bytes, 1):.3f} |")
    return "\n".join(lines)
