"""python -m mxrec.quality: float32 and int8 serving of one trained model scored on a
held-out partition, bytes counted; its refusals."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from serving_streams import SCHEMA, write
from test_streaming_trainer import SCHEMA_SPEC

from mxrec.export import saved_model as serving
from mxrec.quality import report
from mxrec.streaming import metrics, models
from mxrec.streaming.trainer import StreamConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTITIONS = [f"20240101/{hour:02d}" for hour in range(3)]
MODEL = models.ModelConfig("wide_deep", dim=16, hidden=(8,), vocabulary=3000,
                           init_stddev=0.05)


@pytest.mark.one_tf
def test_parse_forms_accepts_the_forms_and_refuses_the_rest():
    assert report.parse_forms("float32,int8") == ["float32", "int8"]
    assert report.parse_forms(" int8 ") == ["int8"]
    assert report.parse_forms("float32,bf16,fp16") == ["float32", "bfloat16", "float16"]
    for text, message in (("int4", "unknown form 'int4'; accepted: float32, int8, bfloat16"),
                          ("", "names no form"), ("int8,int8", "names a form twice"),
                          ("bfloat16,bf16", "names a form twice")):
        with pytest.raises(ValueError, match=message):
            report.parse_forms(text)


def test_report_scores_each_form_on_the_held_out_partition(tmp_path):
    write(tmp_path / "data", PARTITIONS, rows=150)
    config = StreamConfig(data=str(tmp_path / "data"), schema=SCHEMA,
                          workdir=str(tmp_path / "model"), batch_size=32, progress=False,
                          tensorboard=False, threads=1, validation="none")
    rows = report.compare(config, MODEL, ["float32", "int8"])
    assert [r.form for r in rows] == ["float32", "int8"]
    assert not [n for n in os.listdir(tmp_path / "model") if n.startswith(".quality")]
    # Trained on the first two partitions only, scored on the third.
    done = [json.loads(line)["partition"] for line in open(tmp_path / "model" /
                                                           "donefile.jsonl")]
    assert done == PARTITIONS[:2]

    # The float32 figures against a reference: the latest checkpoint's export scored here.
    export = str(tmp_path / "ref")
    trainer = report.train(config, MODEL, [], [])
    report._export(trainer, export, None)
    labels, logits = _reference_scores(export, tmp_path / "data" / PARTITIONS[2])
    want = metrics.evaluate(labels, logits)
    assert rows[0].rows == want["rows"] == 150
    assert rows[0].auc == pytest.approx(want["auc"], abs=1e-9)
    assert rows[0].logloss == pytest.approx(want["logloss"], rel=1e-6)
    # Bytes: float32 rows are 4 bytes a value; int8 rows 1 byte plus 8 for scale and offset;
    # both keep an 8-byte ID.
    tables = serving.exported_tables(export)
    ids = sum(len(t["ids"]) for t in tables.values())
    assert rows[0].ids == rows[1].ids == ids
    dims = [(len(t["ids"]), t["embeddings"].shape[1]) for t in tables.values()]
    assert rows[0].bytes_per_id == pytest.approx(sum(k * (8 + 4 * d) for k, d in dims) / ids)
    # (a table narrower than 3 stays float32: int8 would not make it smaller)
    assert rows[1].bytes_per_id == pytest.approx(
        sum(k * (8 + (d + 8 if d >= 3 else 4 * d)) for k, d in dims) / ids)
    assert rows[1].model_bytes < rows[0].model_bytes
    assert abs(rows[1].auc - rows[0].auc) < 0.02
    printed = report.table(rows)
    assert "| int8 |" in printed and "| float32 |" in printed


def _reference_scores(export_dir, partition):
    """(labels, logits) of a partition's records, parsed and fed one file at a time."""
    from mxrec.streaming import parsers

    files = sorted(str(p) for p in partition.iterdir() if p.name.startswith("part-"))
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        batch = tf.compat.v1.data.make_one_shot_iterator(
            parsers.make_dataset(files, SCHEMA, 10_000)).get_next()
        labels, logits = [], []
        for _ in files:  # a batch does not span files
            values = sess.run(batch)
            labels.append(values["label"])
            logits.append(sess.run(signature.outputs["logits"].name, {
                signature.inputs[k].name: values[k] for k in signature.inputs}))
    return np.concatenate(labels), np.concatenate(logits)


def test_cli_prints_the_table_and_refuses_what_is_not_built(tmp_path):
    write(tmp_path / "data", PARTITIONS, rows=60)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    command = [sys.executable, "-m", "mxrec.quality", "--data", str(tmp_path / "data"),
               "--model-dir", str(tmp_path / "m"), "--schema", SCHEMA_SPEC, "--dim", "4",
               "--hidden", "8", "--vocabulary", "3000", "--batch-size", "32"]
    refused = subprocess.run(command + ["--compare", "float32,int4"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "unknown form 'int4'" in refused.stderr
    done = subprocess.run(command + ["--compare", "float32,int8", "--json",
                                     str(tmp_path / "q.json")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| float32 |" in done.stdout and "| int8 |" in done.stdout
    figures = json.load(open(tmp_path / "q.json"))
    assert [f["form"] for f in figures] == ["float32", "int8"]
    assert figures[1]["table_bytes"] < figures[0]["table_bytes"]
    again = subprocess.run(command + ["--holdout", "3"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 1
    assert "needs at least --holdout + 1 = 4" in again.stderr
