"""The quality report: AUC, log loss and bytes of each form of one trained model.

    >>> rows = compare("/data/criteo", "/models/q", ["float32", "int8"], schema, model)
    >>> print(table(rows))

A form is how the model's rows are kept: "float32" (rows as trained), "int8" (serving
rows quantized per row, `mxrec.export.quantize`), or "bfloat16" / "float16" (tables whose
rows rest in half precision while training, `create_table(storage_dtype=...)`: a model of
their own, trained in `<model dir>/storage-<dtype>` on the same partitions, served as its
float32 form). Every form is scored on the same held-out partitions with its own serving
SavedModel, so the comparison is what a predictor would answer.
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
from mxrec.quality import tier_bytes
from mxrec.streaming import donefile, metrics, models, parsers, partitions
from mxrec.streaming.trainer import DEFAULT_SIGNATURE, StreamConfig, StreamingTrainer

# Form -> the serving export's quantize.
FORMS: Dict[str, Optional[str]] = {"float32": None, "int8": quantizer.INT8, "bfloat16": None,
                                   "float16": None}
# Forms that are a storage dtype of the training tables (a model of their own), by alias.
STORAGE_FORMS = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
                 "fp16": "float16", "half": "float16"}
# Bytes of one value of an embedding row at rest in training, by form.
_TRAIN_VALUE_BYTES = {"float32": 4, "int8": 4, "bfloat16": 2, "float16": 2}


def parse_forms(text: str) -> List[str]:
    """"float32,int8" -> ["float32", "int8"].

    Raises:
        ValueError: an empty list, a repeated form, or an unknown name (naming the accepted
            ones).
    """
    forms = [name.strip() for name in text.split(",") if name.strip()]
    if not forms:
        raise ValueError(f"--compare names no form; accepted: {', '.join(FORMS)}")
    forms = [STORAGE_FORMS.get(name.lower(), name) for name in forms]
    for name in forms:
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
    train_row_bytes: int = 0  # the embedding rows at rest in training (device tier), all IDs
    # One ID's row and optimizer slots in each training tier, as the engine lays them out
    # (mxrec.quality.tier_bytes): device variables, host-tier values, SSD record.
    tiers: tier_bytes.TierBytes = tier_bytes.TierBytes(0, 0, 0)

    @property
    def bytes_per_id(self) -> float:
        return self.table_bytes / max(self.ids, 1)

    @property
    def train_bytes_per_id(self) -> float:
        """Bytes of an ID's embedding row at rest while training (slots excluded)."""
        return self.train_row_bytes / max(self.ids, 1)


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


def _sizes(export_dir: str, form: str, checkpoint_dir: str):
    """(bytes of every file of the export, bytes of its tables' serving variables, IDs,
    bytes of the IDs' embedding rows at rest in training in `form`, an ID's bytes in each
    training tier (tier_bytes.per_id: rows in `form`, float32 slots as the streaming
    trainer keeps them, its slots per table from the checkpoint's manifest))."""
    total = sum(os.path.getsize(os.path.join(folder, name))
                for folder, _, names in os.walk(export_dir) for name in names)
    tables = saved_model.exported_tables(export_dir)
    ids = sum(len(t["ids"]) for t in tables.values())
    rows = sum(t["ids"].nbytes + (t[quantizer.QUANTIZED].nbytes
                                  + t[quantizer.SCALE_OFFSET].nbytes
                                  if quantizer.QUANTIZED in t else t["embeddings"].nbytes)
               for t in tables.values())
    dims = [(len(t["ids"]), _dim(t)) for t in tables.values()]
    train_rows = sum(k * d * _TRAIN_VALUE_BYTES[form] for k, d in dims)
    per_tier = tier_bytes.per_id([(name, len(t["ids"]), _dim(t)) for name, t in tables.items()],
                                 form, "float32", tier_bytes.slot_counts(checkpoint_dir))
    return total, rows, ids, train_rows, per_tier


def _dim(arrays) -> int:
    rows = arrays[quantizer.QUANTIZED] if quantizer.QUANTIZED in arrays else arrays["embeddings"]
    return int(rows.shape[1])


def _trainer(config: StreamConfig, model: models.ModelConfig, form: str, train_on, held_out,
             trained: Dict[str, StreamingTrainer]) -> StreamingTrainer:
    """The trained model a form is exported from: the model dir's (float32, int8), or for a
    storage form the one in `<model dir>/storage-<dtype>` (trained once per compare)."""
    storage = form if form in STORAGE_FORMS.values() else model.storage_dtype
    key = "" if form not in STORAGE_FORMS.values() else form
    if key not in trained:
        if key:
            config = dataclasses.replace(config,
                                         workdir=os.path.join(config.workdir, f"storage-{key}"))
            model = dataclasses.replace(model, storage_dtype=storage)
        trained[key] = train(config, model, train_on, held_out)
    return trained[key]


def compare(config: StreamConfig, model: models.ModelConfig, forms: Sequence[str],
            holdout: int = 1) -> List[Row]:
    """Trains (what each model dir lacks), exports each form and scores the held-out
    partitions; returns one Row per form. The exports are written in a temporary folder
    of the model dir and removed."""
    train_on, held_out = split(config.data, holdout, config.done_marker, config.granularity)
    files = [f for p in held_out for f in p.files]
    trained: Dict[str, StreamingTrainer] = {}
    out = []
    for form in forms:
        trainer = _trainer(config, model, form, train_on, held_out, trained)
        scratch = tempfile.mkdtemp(prefix=".quality-", dir=config.workdir)
        try:
            export_dir = _export(trainer, os.path.join(scratch, form), FORMS[form])
            scored = _score(export_dir, files, config.schema, config.batch_size)
            total, table_bytes, ids, train_rows, per_tier = _sizes(
                export_dir, form if form in STORAGE_FORMS.values() else model.storage_dtype,
                trainer.config.checkpoint_dir)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        out.append(Row(form, scored["auc"], scored["logloss"], scored["rows"], total,
                       table_bytes, ids, train_rows, per_tier))
    return out


def table(rows: Sequence[Row]) -> str:
    """A Markdown table of the rows, each against the first (the baseline)."""
    base = rows[0]
    lines = ["| form | AUC | ΔAUC | log loss | serving model bytes | serving table bytes per "
             "ID | x bytes | training row bytes per ID | device bytes per ID (row + slots) | "
             "host tier bytes per ID | SSD record bytes per ID |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row.form} | {row.auc:.5f} | {row.auc - base.auc:+.5f} | "
                     f"{row.logloss:.5f} | {row.model_bytes:,} | {row.bytes_per_id:.1f} | "
                     f"{row.table_bytes / max(base.table_bytes, 1):.3f} | "
                     f"{row.train_bytes_per_id:.1f} | {row.tiers.device:.1f} | "
                     f"{row.tiers.host:.1f} | {row.tiers.ssd:.1f} |")
    return "\n".join(lines)
