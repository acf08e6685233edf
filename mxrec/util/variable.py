"""Variables of a model that uses mxrec tables."""

from typing import List, Tuple

import tensorflow as tf

from mxrec.constants.constants import SPARSE_TABLE_COLLECTION


def get_dense_and_sparse_variable() -> Tuple[List[tf.Variable], List[tf.Variable]]:
    """The dense trainable variables and the sparse table variables of the default graph.

    Table variables are not in TRAINABLE_VARIABLES, so a dense optimizer's
    `minimize(loss)` never touches them; train them with a hash optimizer.

    Example:
        >>> dense, sparse = get_dense_and_sparse_variable()
        >>> sparse_grads = tf.gradients(loss, sparse)
        >>> train_op = hash_opt.apply_gradients(zip(sparse_grads, sparse))
    """
    dense = list(tf.compat.v1.trainable_variables())
    sparse = list(tf.compat.v1.get_collection(SPARSE_TABLE_COLLECTION))
    return dense, sparse
