"""The "raw" serving signature: columns as they appear in the data, hashed inside the
SavedModel by the parser's own ops. A raw request to mxrec's predictor and to the same
SavedModel under plain TensorFlow gives the trainer's own evaluation of those rows."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from serving_streams import hashed, publish_copy, raw_instances, read_rows, request, train, write

from mxrec.serving.predictor import Predictor
from mxrec.serving.server import ModelServer
from mxrec.streaming.trainer import RAW_SIGNATURE, StreamingTrainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTITIONS = ["20240101/00", "20240101/01", "20240101/02"]


class _Scoring(StreamingTrainer):
    """Keeps the logits of each partition's scoring pass (the model before that partition)."""

    scored = {}

    def _run_pass(self, sess, feed, fetch, files, partition, counter, collect, counted):
        out = super()._run_pass(sess, feed, fetch, files, partition, counter, collect, counted)
        if feed is self._eval_feed:
            type(self).scored[(self.config.delta_export, partition.name)] = out[2]
        return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    write(root / "data", PARTITIONS, rows=100)
    for mode in ("savedmodel", "delta_only"):
        train(root / "data", root / f"work_{mode}", root / f"export_{mode}",
              trainer_class=_Scoring, validation="partition", delta_export=mode)
    rows = read_rows(str(root / "data" / PARTITIONS[2]))
    return root, rows, _Scoring.scored


_LOADER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    export_dir, use_v2 = sys.argv[1], sys.argv[2] == "1"
    columns = json.loads(sys.stdin.read())
    if use_v2:
        fn = tf.saved_model.load(export_dir).signatures["raw"]
        out = fn(**{k: tf.constant(v, tf.string if isinstance(v[0], str) else tf.float32)
                    for k, v in columns.items()})
        logits = out["logits"].numpy()
        ops = sorted({op.type for op in fn.graph.get_operations()})
    else:
        tf.compat.v1.disable_eager_execution()
        with tf.compat.v1.Session(graph=tf.Graph()) as sess:
            meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], export_dir)
            sig = meta.signature_def["raw"]
            logits = sess.run(sig.outputs["logits"].name,
                              {sig.inputs[k].name: v for k, v in columns.items()})
            ops = sorted({n.op for n in meta.graph_def.node})
    print(json.dumps({"logits": logits.tolist(), "ops": ops,
                      "mxrec": any(m.startswith("mxrec") for m in sys.modules)}))
""")


def _plain_tensorflow(export_dir, columns, use_v2):
    result = subprocess.run([sys.executable, "-c", _LOADER, str(export_dir), "1" if use_v2 else
                             "0"], input=json.dumps(columns), capture_output=True, text=True,
                            timeout=180, cwd=str(export_dir),
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["savedmodel", "delta_only"])
def test_raw_request_gives_the_trainers_own_evaluation(trained, tmp_path, mode):
    root, rows, scored = trained
    # Partition 3 was scored by the model after partition 2: serving version 2.
    expected = scored[(mode, PARTITIONS[2])]
    assert len(expected) == len(rows) == 100
    np.testing.assert_allclose(scored[("savedmodel", PARTITIONS[2])],
                               scored[("delta_only", PARTITIONS[2])], atol=1e-6)
    base = tmp_path / "base"
    base.mkdir()
    predictor = Predictor(str(base))
    server = ModelServer(predictor, "ctr", port=0, poll_interval=None).start()
    try:
        for version in (1, 2):  # version 2 a delta: in place (delta_only) or whole
            publish_copy(root / f"export_{mode}", base, version)
            assert predictor.poll() == version
        instances = raw_instances(rows)
        code, headers, body = request(server.port, "POST", "/v1/models/ctr:predict",
                                      {"signature_name": RAW_SIGNATURE, "instances": instances})
        assert code == 200 and headers["X-Model-Version"] == "2", body
        logits = np.array([p["logits"] for p in body["predictions"]], np.float32)
        np.testing.assert_allclose(logits, expected, atol=1e-6)
        prob = np.array([p["prob"] for p in body["predictions"]], np.float32)
        np.testing.assert_allclose(prob, 1 / (1 + np.exp(-expected)), atol=1e-6)
        columns = {k: [i[k] for i in instances] for k in instances[0]}
        code, _, body = request(server.port, "POST", "/v1/models/ctr:predict",
                                {"signature_name": RAW_SIGNATURE, "inputs": columns})
        assert code == 200
        np.testing.assert_array_equal(np.array(body["outputs"]["logits"], np.float32), logits)
        # The pre-hashed default signature, fed the parser's IDs, answers the same.
        query = hashed(rows)
        code, _, body = request(server.port, "POST", "/v1/models/ctr:predict", {"inputs": {
            "sparse": query["sparse"].tolist(), "dense": query["dense"].tolist()}})
        assert code == 200
        np.testing.assert_array_equal(np.array(body["outputs"]["logits"], np.float32), logits)
    finally:
        server.stop()
    if mode == "delta_only":
        return  # version 2 has no SavedModel (TF Serving cannot load it)
    for use_v2 in (False, True):
        got = _plain_tensorflow(root / "export_savedmodel" / "2", columns, use_v2)
        assert not got["mxrec"]
        assert not [op for op in got["ops"] if op.startswith("Mxrec")], got["ops"]
        assert "StringToHashBucketFast" in got["ops"]
        np.testing.assert_allclose(np.array(got["logits"], np.float32), expected, atol=1e-6)


def test_raw_features_hash_exactly_as_the_parser():
    """features_from_raw on the fields of lines == parse_lines on the lines, bit for bit,
    with empty and non-ASCII values and more than 128 categorical columns (salts with the
    sign bit set)."""
    import tensorflow as tf

    from mxrec.streaming import parsers

    names = [f"c{i}" for i in range(130)]
    schema = parsers.Schema(tuple([parsers.Column("y", "label"), parsers.Column("d", "dense")]
                                  + [parsers.Column(n, "categorical") for n in names]))
    rng = np.random.default_rng(3)
    values = [["", "é", "196", "x" * 300] + [f"v{v}" for v in rng.integers(0, 99, 126)]
              for _ in range(4)]
    values[1] = values[1][::-1]
    lines = ["\t".join(["1", str(i * 2.5)] + row) for i, row in enumerate(values)]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        parsed = parsers.parse_lines(tf.constant(lines), tf.zeros([4], tf.int32),
                                     tf.range(1, 5, dtype=tf.int64), schema)
        raw = parsers.raw_feature_inputs(schema)
        features = parsers.features_from_raw(raw, schema)
        feed = {raw[n]: [row[i] for row in values] for i, n in enumerate(names)}
        feed[raw["d"]] = [i * 2.5 for i in range(4)]
        want, got = sess.run([parsed, features], feed)
    assert sorted(raw) == sorted(["d"] + names)
    assert raw["c0"].dtype == tf.string and raw["d"].dtype == tf.float32
    assert want["bad_line"].size == 0
    np.testing.assert_array_equal(got["sparse"], want["sparse"])
    np.testing.assert_array_equal(got["dense"], want["dense"])
    assert (want["sparse"][:, 129] < 0).all()  # feature index 129: the sign bit
