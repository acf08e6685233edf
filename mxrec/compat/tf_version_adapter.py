"""mx_rec's `mx_rec.util.tf_version_adapter` (`mxrec.util.tf_version_adapter` is this
module): `hccl_ops` and `npu_ops`.

mx_rec imports these from Ascend's TensorFlow adapter (npu_bridge / npu_device).
Here `hccl_ops` is `mxrec.distributed.hccl_ops` (mx_rec's `util.communication.hccl_ops`)
and `npu_ops` offers the one op mx_rec's examples use, `dropout`, as TensorFlow's own.
"""

import types

import tensorflow as tf

from mxrec.distributed import hccl_ops  # noqa: F401 (mx_rec's name in this module)


def _dropout(x, keep_prob=0.5, noise_shape=None, seed=None, name=None):
    """npu_ops.dropout: `tf.compat.v1.nn.dropout(x, keep_prob=...)` (same semantics:
    elements kept with probability keep_prob and scaled by 1 / keep_prob)."""
    return tf.compat.v1.nn.dropout(x, keep_prob=keep_prob, noise_shape=noise_shape, seed=seed,
                                   name=name)


npu_ops = types.SimpleNamespace(dropout=_dropout)
