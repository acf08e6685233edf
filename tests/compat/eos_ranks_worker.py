"""A rank of tests/compat/test_mx_rec_zoo_ranks.py::test_eos_map_ends_every_rank_at_the_shortest:
rank R's dataset has 5 + 2R batches (dicts of tensors); with eos_map every rank reads the first
5, in each of two rounds, with the batch shapes kept. Prints one JSON line per round."""

import json

import tensorflow.compat.v1 as tf

from mxrec.constants.constants import LIBREC_EOS_OPS_SO
from mxrec.util.communication.hccl_ops import get_rank_id
from mxrec.util.initialize import init
from mxrec.util.ops import import_host_pipeline_ops

tf.disable_v2_behavior()
init(use_mpi=True)
rank = get_rank_id()
dataset = tf.data.Dataset.range(5 + 2 * rank).map(
    lambda x: {"ids": tf.fill([3], x), "label": tf.cast(x, tf.float32)})
dataset = dataset.eos_map(import_host_pipeline_ops(LIBREC_EOS_OPS_SO), 0).prefetch(4)
iterator = tf.data.make_initializable_iterator(dataset)
batch = iterator.get_next()
with tf.Session() as sess:
    for round_ in range(2):
        sess.run(iterator.initializer)
        seen = []
        try:
            while True:
                seen.append(sess.run(batch)["ids"].tolist())
        except tf.errors.OutOfRangeError:
            pass
        print(json.dumps({"rank": rank, "round": round_, "shape": batch["ids"].shape.as_list(),
                          "seen": seen}), flush=True)
