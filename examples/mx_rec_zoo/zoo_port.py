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
    step's ops in a fixed order. The originals read their variables (TF1 ref variables)
    in the same session.run that updates them (the learning rate from the global step, the
    gradients from the dense weights), so with several threads each run resolves those
    races its own way: two runs of one mode differ by up to 0.15 AUC at the tests' sizes
    (the DLRM port orders its step: step_gradient_ops).
    """
    import os

    config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=False,
                            inter_op_parallelism_threads=int(os.getenv("ZOO_INTER_OP_THREADS",
                                                                       "1")))
    config.gpu_options.allow_growth = True
    return config


def step_gradient_ops(grads_and_vars):
    """The ops of a step's gradients, for the control dependency that orders the step.

    RecSDK's DLRM and Wide&Deep run on TF1 ref variables (disable_v2_behavior): an
    optimizer updates a weight in place, and the backward pass reads the same buffer when
    its op runs, as the learning-rate schedule reads the global step that the step's own
    assign increments. The originals add no control dependency, so which value a read sees
    is the scheduler's choice: fixed for one process and one thread, but on ranks it moves
    with the collectives' timing (two 2-rank runs of one setting ended 2.6% apart).
    The ports make every update wait for every gradient and the step counter wait for the
    updates: a step reads the weights and the learning rate of its start, as TF's own
    `Optimizer.minimize(global_step=...)` orders them.
    """
    return [grad.op for grad, _ in grads_and_vars if grad is not None]


class ModelSaver:
    """What a port saves at the end of training and restores when the script's IF_LOAD finds
    a checkpoint (a port addition: the originals build a Saver and never save).

    Every run saves with mxrec's Saver (mxrec.saver.checkpoint.Saver) into
    ./saved-model/mxrec: one version holding every rank's shard of every tier, which the
    tests read alike for one process and for ranks. TF's Saver cannot hold a table with a
    host tier on several ranks (run.sh's DDR and SSD modes, dynamic expansion), so only one
    process also saves with the script's own tf.train.Saver to ./saved-model/model-0 (which
    writes the sparse-model-0 folder the scripts' IF_LOAD looks for) and restores from it.
    Build it where the script builds its Saver (before the session finalizes the graph).
    """

    def __init__(self, tf_saver, rank_size: int, path: str = "./saved-model/model-0"):
        from mxrec.saver.checkpoint import Saver

        self.tf_saver = tf_saver if rank_size == 1 else None
        self.path = path
        self.mxrec_saver = Saver(MXREC_CHECKPOINT, max_to_keep=None)

    @staticmethod
    def _session(sess):  # a MonitoredTrainingSession's own session
        return sess._tf_sess() if hasattr(sess, "_tf_sess") else sess

    def save(self, sess, step: int) -> None:
        self.mxrec_saver.save(self._session(sess), step)
        if self.tf_saver is not None:
            self.tf_saver.save(self._session(sess), self.path)

    def restore(self, sess) -> None:
        if self.tf_saver is not None:
            self.tf_saver.restore(self._session(sess), self.path)
        else:
            self.mxrec_saver.restore(self._session(sess))


MXREC_CHECKPOINT = "./saved-model/mxrec"


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
