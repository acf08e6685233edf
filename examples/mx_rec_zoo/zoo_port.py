"""What the ports in examples/mx_rec_zoo/ use instead of NPU-only or missing pieces.

mxrec's own code (not a port): RecSDK's examples take roc_auc_score from scikit-learn (not
a dependency of mxrec), build their session config for the NPU, and use TF 1.15's
tf.layers / tf.contrib, which TF 2.21 no longer has. Each use in a port is marked
"mxrec port:".
"""

import numpy as np
import tensorflow.compat.v1 as tf


def roc_auc_score(labels, scores):
    """scikit-learn's roc_auc_score for binary labels: the Mann-Whitney statistic, ties
    counted one half (average ranks)."""
    labels = np.asarray(labels, np.float64).reshape(-1)
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):  # average ranks of ties
        end = start
        while end + 1 < len(scores) and sorted_scores[end + 1] == sorted_scores[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("roc_auc_score: only one class present in the labels")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def session_config():
    """The session config for CPUs/GPUs (RecSDK's sess_config configures the NPU).

    ZOO_INTER_OP_THREADS (default 1) sets inter_op_parallelism_threads: one thread runs the
    step's ops in a fixed order. The examples read their variables (TF1 ref variables)
    in the same session.run that updates them (the learning rate from the global step, the
    gradients from the dense weights), so with several threads each run resolves those
    races its own way: two runs of one mode differ by up to 0.15 AUC at the tests' sizes.
    """
    import os

    config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=False,
                            inter_op_parallelism_threads=int(os.getenv("ZOO_INTER_OP_THREADS",
                                                                       "1")))
    config.gpu_options.allow_growth = True
    return config


def dense(inputs, units, activation=None, name=None, kernel_initializer=None,
          bias_initializer=None):
    """tf.layers.dense (TF 1.15), on tf.get_variable, so that TF 2.21 (no tf_keras) runs
    the ports too: variables `<name>/kernel` and `<name>/bias`, as tf.layers names them."""
    with tf.variable_scope(name, default_name="dense"):
        kernel = tf.get_variable("kernel", [int(inputs.shape[-1]), units],
                                 initializer=kernel_initializer)
        bias = tf.get_variable("bias", [units],
                               initializer=bias_initializer or tf.zeros_initializer())
        out = tf.matmul(inputs, kernel) + bias
    if activation == "relu":
        out = tf.nn.relu(out)
    return out


def binary_crossentropy_from_logits(labels, logits):
    """tf.keras.losses.BinaryCrossentropy(from_logits=True)(labels, logits): the mean over
    the batch."""
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, logits.dtype), logits=logits))
