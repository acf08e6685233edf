"""Synthetic TFRecords in the input format of RecSDK's DLRM and Wide&Deep examples.

Each record holds `line_per_sample` samples: `label` int64 [L], `sparse_feature` int64
[26 L] and `dense_feature` [13 L] (float32 for DLRM, int64 bucket ids for Wide&Deep),
written to <dir>/train/part-*.tfrecord and <dir>/test/part-*.tfrecord (the examples read
`<DLRM_CRITEO_DATA_PATH>/{train,test}/*.tfrecord`). Labels follow a logistic model of
per-ID weights and the dense features, so a model that learns reaches an AUC well above
one half. Deterministic for a seed.

    python gen_data.py OUT_DIR --format dlrm --line_per_sample 64 --train 64 --test 16
"""

import argparse
import os

import numpy as np
import tensorflow as tf

FIELDS, DENSE = 26, 13


def _samples(rng, count, ids_per_field, weights, dense_int):
    sparse = rng.integers(0, ids_per_field, (count, FIELDS))
    sparse = sparse + np.arange(FIELDS) * ids_per_field + 1000  # ID ranges per field
    if dense_int:
        dense = rng.integers(0, 50, (count, DENSE))
        dense_signal = (dense[:, 0] - 25) / 12.0
    else:
        dense = rng.exponential(4.0, (count, DENSE)).astype(np.float32)
        dense_signal = ((np.log(dense[:, 0] + 3.0) - np.log(dense[:, 1] + 3.0)) * 5.0)
    logit = weights[sparse - 1000].sum(axis=1) + dense_signal
    labels = (rng.random(count) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return labels, sparse, dense


def write(out_dir, fmt="dlrm", line_per_sample=64, train_records=64, test_records=16,
          ids_per_field=40, files=2, seed=0):
    """Writes the train and test records; returns {split: [paths]}."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0.0, 0.35, FIELDS * ids_per_field)
    written = {}
    for split, records in (("train", train_records), ("test", test_records)):
        os.makedirs(os.path.join(out_dir, split), exist_ok=True)
        paths = [os.path.join(out_dir, split, f"part-{i}.tfrecord") for i in range(files)]
        writers = [tf.io.TFRecordWriter(p) for p in paths]
        for index in range(records):
            labels, sparse, dense = _samples(rng, line_per_sample, ids_per_field, weights,
                                             dense_int=(fmt == "wide_deep"))
            feature = {
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=labels)),
                "sparse_feature": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=sparse.reshape(-1))),
            }
            if fmt == "wide_deep":
                feature["dense_feature"] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=dense.reshape(-1)))
            else:
                feature["dense_feature"] = tf.train.Feature(
                    float_list=tf.train.FloatList(value=dense.reshape(-1)))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writers[index % files].write(example.SerializeToString())
        for writer in writers:
            writer.close()
        written[split] = paths
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--format", choices=["dlrm", "wide_deep"], default="dlrm")
    parser.add_argument("--line_per_sample", type=int, default=64)
    parser.add_argument("--train", type=int, default=64, help="train records")
    parser.add_argument("--test", type=int, default=16, help="test records")
    parser.add_argument("--ids_per_field", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out_dir, args.format, args.line_per_sample, args.train, args.test,
          ids_per_field=args.ids_per_field, seed=args.seed)


if __name__ == "__main__":
    main()
