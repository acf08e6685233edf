"""One rank of tests/test_mpi_ops.py (run under mpirun): MPI exchange ops against NumPy.

Every rank draws every rank's data from seeds of that rank, so each can compute what it
must receive. Prints "OK <case>" per case; any mismatch raises.
"""

import sys
import time

import numpy as np
import tensorflow as tf

from mxrec.distributed import mpi_ops

tf.compat.v1.disable_eager_execution()
RANK, SIZE = mpi_ops.rank_and_size()
DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64}


def counts_of(sender, step, dtype_name):
    rng = np.random.default_rng([sender, step, len(dtype_name)])
    counts = rng.integers(0, 7, SIZE).astype(np.int32)
    if step % 3 == 2:
        counts[(sender + 1) % SIZE] = 0  # some pairs send nothing
    if step == 4 and sender == 0:
        counts[:] = 0  # a rank that sends nothing at all
    return counts


def data_of(sender, step, dtype_name, counts, row):
    rng = np.random.default_rng([sender, step, 99, len(dtype_name)])
    shape = (int(counts.sum()),) + row
    if dtype_name.startswith("float"):
        return rng.standard_normal(shape).astype(DTYPES[dtype_name])
    info = np.iinfo(DTYPES[dtype_name])
    return rng.integers(info.min, info.max, shape, dtype=DTYPES[dtype_name], endpoint=True)


def expected_received(step, dtype_name, row):
    parts, recv = [], []
    for sender in range(SIZE):
        counts = counts_of(sender, step, dtype_name)
        data = data_of(sender, step, dtype_name, counts, row)
        start = int(counts[:RANK].sum())
        parts.append(data[start:start + counts[RANK]])
        recv.append(counts[RANK])
    return np.concatenate(parts), np.array(recv, np.int32)


def case_alltoallv():
    row = (3, 2)
    for dtype_name, dtype in DTYPES.items():
        data_ph = tf.compat.v1.placeholder(dtype, [None, *row])
        counts_ph = tf.compat.v1.placeholder(tf.int32, [SIZE])
        received, recv_counts = mpi_ops.alltoallv(data_ph, counts_ph, name=f"test_{dtype_name}")
        assert received.shape.as_list() == [None, *row], received.shape
        with tf.compat.v1.Session() as sess:
            for step in range(6):  # a different size every step, one op
                counts = counts_of(RANK, step, dtype_name)
                data = data_of(RANK, step, dtype_name, counts, row)
                got, got_counts = sess.run([received, recv_counts],
                                           {data_ph: data, counts_ph: counts})
                want, want_counts = expected_received(step, dtype_name, row)
                np.testing.assert_array_equal(got_counts, want_counts)
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)
    print("OK alltoallv", flush=True)


def case_gradient():
    # loss = sum(received * w): d loss / d data = w's rows sent back to their senders.
    counts = counts_of(RANK, 1, "float32")
    data = data_of(RANK, 1, "float32", counts, (4,))
    x = tf.constant(data)
    received, recv_counts = mpi_ops.alltoallv(x, counts, name="grad_forward")
    weight = tf.reshape(tf.range(tf.size(received), dtype=tf.float32), tf.shape(received)) + \
        tf.cast(100 * RANK, tf.float32)
    (grad,) = tf.gradients(tf.reduce_sum(received * weight), [x])
    with tf.compat.v1.Session() as sess:
        got = sess.run(grad)
    # Rank r's weight rows for sender s: offsets of s's slice in r's received buffer.
    want = np.zeros_like(data)
    for receiver in range(SIZE):
        recv = [counts_of(s, 1, "float32")[receiver] for s in range(SIZE)]
        total = int(sum(recv))
        w = np.arange(total * 4, dtype=np.float32).reshape(total, 4) + 100 * receiver
        start = int(sum(recv[:RANK]))
        mine = w[start:start + recv[RANK]]
        at = int(counts[:receiver].sum())
        want[at:at + counts[receiver]] = mine
    np.testing.assert_array_equal(got, want)
    print("OK gradient", flush=True)


def case_allreduce():
    for dtype_name, dtype in DTYPES.items():
        values = []
        for r in range(SIZE):
            rng = np.random.default_rng([r, 7])
            if dtype_name.startswith("float"):
                values.append(rng.standard_normal((5, 3)).astype(dtype))
            else:
                values.append(rng.integers(-1000, 1000, (5, 3)).astype(dtype))
        x = tf.constant(values[RANK])
        outs = {red: mpi_ops.allreduce(x, red, name=f"ar_{dtype_name}_{red}")
                for red in ("sum", "max", "min")}
        with tf.compat.v1.Session() as sess:
            got = sess.run(outs)
        total = values[0].copy()
        for v in values[1:]:
            total += v  # rank order, as the op
        np.testing.assert_array_equal(got["sum"], total)
        np.testing.assert_array_equal(got["max"], np.max(values, axis=0))
        np.testing.assert_array_equal(got["min"], np.min(values, axis=0))
    # Gradient of a sum all-reduce: the sum of the ranks' upstream gradients.
    x = tf.constant(np.full((4,), float(RANK + 1), np.float32))
    y = mpi_ops.allreduce(x, "sum", name="ar_grad")
    (g,) = tf.gradients(tf.reduce_sum(y * float(RANK + 1)), [x])
    with tf.compat.v1.Session() as sess:
        np.testing.assert_array_equal(sess.run(g), np.full((4,), SIZE * (SIZE + 1) / 2, np.float32))
    # A scalar and an empty tensor.
    s = mpi_ops.allreduce(tf.constant(RANK, tf.int64), "sum", name="ar_scalar")
    e = mpi_ops.allreduce(tf.zeros([0, 3]), "sum", name="ar_empty")
    with tf.compat.v1.Session() as sess:
        got_s, got_e = sess.run([s, e])
    assert got_s == SIZE * (SIZE - 1) // 2 and got_e.shape == (0, 3)
    print("OK allreduce", flush=True)


def case_concurrent():
    # 24 independent exchanges in one step: the executor starts them in any order on each
    # rank; their channels keep them apart. Each carries its index, to be sure.
    outs, wants = [], []
    for k in range(24):
        counts = np.full(SIZE, k % 4 + 1, np.int32)
        data = np.full((int(counts.sum()), 2), 1000 * k + RANK, np.int64)
        received, _ = mpi_ops.alltoallv(data, counts, name=f"concurrent_{k}")
        outs.append(received)
        wants.append(np.repeat(np.arange(SIZE, dtype=np.int64) + 1000 * k, k % 4 + 1)[:, None]
                     .repeat(2, axis=1))
    with tf.compat.v1.Session() as sess:
        for _ in range(3):
            for got, want in zip(sess.run(outs), wants):
                np.testing.assert_array_equal(got, want)
    print("OK concurrent", flush=True)


def case_errors():
    x = tf.zeros([4, 2])
    bad = mpi_ops.alltoallv(x, tf.constant([1] * (SIZE + 1)), name="bad_counts")[0]
    short = mpi_ops.alltoallv(x, tf.constant([0] * SIZE), name="short_counts")[0]
    with tf.compat.v1.Session() as sess:
        for op, text in ((bad, "send_counts must be"), (short, "add up to 0 rows, data has 4")):
            try:
                sess.run(op)
            except tf.errors.InvalidArgumentError as err:
                assert text in str(err), str(err)
            else:
                raise AssertionError(f"no error for {op.name}")
    # Buffers of different sizes in one all-reduce.
    mismatched = mpi_ops.allreduce(tf.zeros([2 + RANK]), "sum", name="ar_mismatch")
    with tf.compat.v1.Session() as sess:
        try:
            sess.run(mismatched)
        except tf.errors.InvalidArgumentError as err:
            assert "ar_mismatch" in str(err) and "bytes" in str(err), str(err)
        else:
            raise AssertionError("no error for mismatched all-reduce")
    print("OK errors", flush=True)


def case_timeout():
    # Rank 0 runs an exchange that no other rank joins: it must end in DeadlineExceeded
    # naming the exchange and the setting, within the timeout.
    op = mpi_ops.alltoallv(tf.zeros([SIZE, 2]), tf.ones([SIZE], tf.int32), name="lonely",
                           timeout_seconds=2.0)[0]
    if RANK == 0:
        with tf.compat.v1.Session() as sess:
            start, cpu = time.monotonic(), time.process_time()
            try:
                sess.run(op)
            except tf.errors.DeadlineExceededError as err:
                text = str(err)
                assert "lonely" in text and "MXREC_COLLECTIVE_TIMEOUT" in text, text
                assert "waiting for rank" in text, text
            else:
                raise AssertionError("no timeout")
            waited, used = time.monotonic() - start, time.process_time() - cpu
            assert waited < 30
            # A long wait sleeps once its first milliseconds of yielding are over: the 2 s
            # wait takes a small part of a core, not all of it (a waiter that yields or spins
            # to the end takes the whole 2 s).
            assert used < 0.5 * waited, f"waiting used {used:.2f} s of CPU in {waited:.2f} s"
            # Every later exchange fails at once with the first failure.
            again = mpi_ops.allreduce(tf.ones([1]), "sum", name="after")
            try:
                sess.run(again)
            except tf.errors.AbortedError as err:
                assert "lonely" in str(err), str(err)
            else:
                raise AssertionError("no abort after the timeout")
    # Then the others run it, which takes rank 0's message and lets every rank finish
    # normally (rank 0's side of "lonely" was sent eagerly before its deadline).
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    if RANK != 0:
        with tf.compat.v1.Session() as sess:
            sess.run(op)
    print("OK timeout", flush=True)

if __name__ == "__main__":
    for name in sys.argv[1:]:
        globals()[f"case_{name}"]()
