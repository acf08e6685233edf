"""Helpers of the serving tests: a small trained stream, HTTP requests, hashed queries."""

import http.client
import json
import os
import shutil

import numpy as np
import tensorflow as tf
from test_streaming_trainer import SCHEMA_SPEC, write_stream

from mxrec.streaming import models, parsers
from mxrec.streaming.trainer import StreamConfig, StreamingTrainer
from mxrec.util import initialize

SCHEMA = parsers.parse_schema_spec(SCHEMA_SPEC)
MODEL = models.ModelConfig("wide_deep", dim=4, hidden=(8,), vocabulary=3000, init_stddev=0.05)


def train(data, work, export, trainer_class=StreamingTrainer, model=MODEL, **overrides):
    """Trains every ready partition of `data` in this process; returns (trainer, entries)."""
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    settings = dict(batch_size=32, validation="batch", progress=False, tensorboard=False,
                    threads=1)
    settings.update(overrides)
    config = StreamConfig(data=str(data), schema=SCHEMA, workdir=str(work),
                          export_base=str(export), **settings)
    trainer = trainer_class(config, models.make_model_fn(model))
    try:
        entries = trainer.run()
    finally:
        initialize.terminate_config_initializer()
        tf.compat.v1.reset_default_graph()
    return trainer, entries


def write(root, partitions, rows=120, seed=0):
    write_stream(str(root), partitions, rows=rows, seed=seed)


def read_rows(folder):
    """The records of a partition folder, in the parser's order (files by name, lines)."""
    rows = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("part-"):
            with open(os.path.join(folder, name)) as f:
                rows.extend(line.rstrip("\n").split("\t") for line in f if line.strip())
    return rows


def raw_instances(rows):
    """Row-format raw-feature instances of records y, d0, d1, c0, c1, c2 (empty dense: 0)."""
    return [{"d0": float(r[1] or 0), "d1": float(r[2] or 0), "c0": r[3], "c1": r[4],
             "c2": r[5]} for r in rows]


def hashed(rows):
    """{"sparse": int64 [B, 3], "dense": float32 [B, 2]} of records, hashed by the parser."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sparse = sess.run(parsers.hash_categorical(tf.constant([r[3:6] for r in rows]),
                                                   [0, 1, 2]))
    dense = np.array([[float(r[1] or 0), float(r[2] or 0)] for r in rows], np.float32)
    return {"sparse": sparse, "dense": dense}


def publish_copy(src_base, dst_base, version):
    """Copies a version in and renames it into place, as a trainer would."""
    tmp = os.path.join(str(dst_base), f".tmp-{version}")
    shutil.copytree(os.path.join(str(src_base), str(version)), tmp)
    os.rename(tmp, os.path.join(str(dst_base), str(version)))


def truncate(version_dir):
    """Damages a version as a half-copied file would: its variables data (or, in a delta-only
    version, its delta file) cut to 100 bytes."""
    if os.path.isdir(os.path.join(version_dir, "variables")):
        data = sorted(p for p in os.listdir(os.path.join(version_dir, "variables"))
                      if p.startswith("variables.data-"))[0]
        path = os.path.join(version_dir, "variables", data)
    else:
        path = os.path.join(version_dir, "mxrec_delta.npz")
    with open(path, "rb") as f:
        head = f.read(100)
    with open(path, "wb") as f:
        f.write(head)


def request(port, method, path, body=None, headers=None, raw=None, timeout=60):
    """(status, headers, parsed JSON or None) of one request on a fresh connection.

    body: an object sent as JSON (NaN allowed: it is what a careless client writes);
    raw: bytes sent as they are."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        connection.request(method, path, body=data,
                           headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), strict_json(response.read())
    finally:
        connection.close()


def strict_json(data: bytes):
    """JSON as a strict parser reads it (NaN/Infinity are an error)."""
    def refuse(name):
        raise ValueError(f"{name} in a response")

    return json.loads(data, parse_constant=refuse)
