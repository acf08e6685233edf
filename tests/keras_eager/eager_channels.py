"""The MPI exchanges' channels in TF2 (mxrec.distributed.mpi_ops.next_channel): every trace
of a tf.function numbers its exchanges alike, whenever it is traced, so ranks that trace a
step anew at different steps still meet in the same exchanges. Run by
tests/test_keras_eager.py in a process of its own (eager mode); the exchanges themselves on
2 ranks: tests/test_keras_ranks.py.
"""

import pytest
import tensorflow as tf

from mxrec.distributed import mpi_ops


def _channels(seen, count):
    seen.append([mpi_ops.next_channel() for _ in range(count)])


def test_every_trace_of_a_function_numbers_its_exchanges_alike():
    seen = []

    @tf.function
    def step(x):
        _channels(seen, 3)
        # A cond branch numbers in its function's sequence, after the exchanges before it.
        return tf.cond(x[0] > 0, lambda: (_channels(seen, 1), x)[1], lambda: x)

    @tf.function
    def evaluate(x):
        _channels(seen, 2)
        return x

    step(tf.ones([1]))         # seen[0:2]
    evaluate(tf.ones([1]))     # seen[2]: another function in between
    mpi_ops.next_channel()     # an eager exchange in between
    step(tf.ones([2]))         # a new shape: a new trace, seen[3:5]
    first, second = seen[0] + seen[1], seen[3] + seen[4]
    assert first == second and len(set(first)) == 4, seen
    assert first == sorted(first), first  # in trace order
    # Another name: another slot, no channel shared.
    assert not set(seen[2]) & set(first), seen
    eager = mpi_ops.next_channel()
    assert 1 <= eager < min(first + seen[2]), eager  # eager ops: below every function's


def test_a_session_graph_numbers_from_one_in_build_order():
    with tf.Graph().as_default():
        assert [mpi_ops.next_channel() for _ in range(3)] == [1, 2, 3]

        @tf.function
        def inner(x):
            return x + mpi_ops.next_channel()

        inner(tf.constant(0))  # a function built in a Session graph continues its sequence
        assert mpi_ops.next_channel() == 5


def test_a_trace_with_too_many_exchanges_is_refused_naming_the_function():
    @tf.function
    def huge():
        graph = tf.compat.v1.get_default_graph()
        mpi_ops._CHANNELS[graph] = mpi_ops._PER_FUNCTION  # as after 65535 exchanges
        return mpi_ops.next_channel()

    with pytest.raises(ValueError, match="tf.function 'huge'.*more than 65535 exchanges"):
        huge.get_concrete_function()


def test_names_whose_hashes_meet_get_slots_of_their_own():
    # crc32 % 256 of these two names is the same: the second one first seen takes the next
    # free slot; a name's slot stays what it was, and TF's unique suffixes do not count.
    first = mpi_ops._function_slot("probe_a")
    second = mpi_ops._function_slot("probe_hn")
    assert second != first
    assert mpi_ops._function_slot("probe_a") == first
    assert mpi_ops._function_slot("probe_hn_17_2") == second
