"""mxrec.distributed.sharded_state.initialize_once: the initializer of a table's slot on
several ranks (made in a hash optimizer's apply_gradients) carries none of the control
dependencies its caller built it under."""

import numpy as np
import tensorflow as tf

from mxrec.distributed import sharded_state


def test_initializer_ignores_the_callers_control_dependencies():
    with tf.Graph().as_default():
        weight = tf.compat.v1.Variable(np.float32(3.0), name="weight")
        counter = tf.compat.v1.Variable(0, name="counter")
        slot = tf.compat.v1.Variable(np.zeros(4, np.float32), name="slot")
        # The caller's dependency: an op that reads `weight` and bumps `counter`, as a
        # step's gradients read the dense weights
        with tf.control_dependencies([weight.read_value()]):
            step = counter.assign_add(1)
        with tf.control_dependencies([step]):
            sharded_state.initialize_once(slot)
        with tf.compat.v1.Session() as sess:
            sess.run(slot.initializer)  # `weight` uninitialised: no read of it may run
            np.testing.assert_array_equal(sess.run(slot), np.zeros(4, np.float32))
            sess.run(slot.assign([1.0, 2.0, 3.0, 4.0]))
            sess.run(slot.initializer)  # once: a second run keeps the values
            np.testing.assert_array_equal(sess.run(slot), [1.0, 2.0, 3.0, 4.0])
            sess.run(counter.initializer)
            assert sess.run(counter) == 0
