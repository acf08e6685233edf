"""Exchanges between ranks over MPI, as TensorFlow ops (cc_ops/ops/mpi_ops.cc).

Each op runs its MPI calls on a thread of its own (not TensorFlow's inter-op threads),
nonblocking, with every wait bounded by the collective timeout
(`MXREC_COLLECTIVE_TIMEOUT`): a peer that died or stopped ends the op with
`DeadlineExceededError` naming the exchange. Every op instance gets a *channel*, the MPI
tag of its messages, assigned in graph-construction order: ranks that build the same
graph in the same order (the same script does) give each exchange the same channel, and
exchanges of different channels never mix, even when a step runs them at once.

In TF2 (eager outside functions) a `tf.function` is traced when a rank first sees a new
input signature, which is not the same step on every rank when shapes differ between the
ranks (a step fed `mk.data.plan_ahead`'s plans without an `input_signature`). So there a
trace numbers its exchanges on its own, from a base drawn from the function's name: every
trace of one function gives its n-th exchange the same channel, whenever and however
often each rank traces it, and the ranks meet in the same exchange.

Example:
    >>> received, recv_counts = alltoallv(ids, send_counts)   # ids [n], send_counts [N]
    >>> total = allreduce(dense_grad, "sum")                   # the same bits on every rank
"""

import ctypes
import functools
import itertools
import re
import weakref
import zlib
from typing import Optional, Tuple

import tensorflow as tf

from mxrec._lib import loader
from mxrec.util import env

# MPI guarantees tags up to 32767; Open MPI's and MPICH's upper bound is 2^31 - 1 (an MPI
# with a lower one fails the first exchange above it, naming the channel and the bound).
# Session graphs and eager ops take channels in [1, _FUNCTION_BASE); a TF2 function's
# trace takes _FUNCTION_BASE + slot * _PER_FUNCTION + [1, _PER_FUNCTION), its slot drawn
# from its name.
_FUNCTION_BASE = 1 << 20
_PER_FUNCTION = 1 << 16
_FUNCTION_SLOTS = 256
_CHANNELS = weakref.WeakKeyDictionary()  # graph -> next channel
_EAGER_CHANNELS = itertools.count(1)
_SLOTS = {}  # function name (its stem) -> its slot
_REDUCTIONS = ("sum", "max", "min", "mean")


_ERRORS = {2: tf.errors.DeadlineExceededError, 3: tf.errors.AbortedError}


def library():
    """The loaded MPI op library (ImportError naming what is missing)."""
    return loader.mpi_op_library()


@functools.cache
def _initialize(timeout_seconds: float) -> Tuple[int, int]:
    lib = library()
    native = ctypes.CDLL(str(loader.mpi_op_library_path()))
    native.mxrec_mpi_initialize.restype = ctypes.c_int
    native.mxrec_mpi_initialize.argtypes = [ctypes.c_double, ctypes.POINTER(ctypes.c_int),
                                            ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                            ctypes.c_int]
    rank, size = ctypes.c_int(), ctypes.c_int()
    message = ctypes.create_string_buffer(2048)
    code = native.mxrec_mpi_initialize(timeout_seconds, ctypes.byref(rank), ctypes.byref(size),
                                       message, len(message))
    if code != 0:
        error = _ERRORS.get(code, tf.errors.InternalError)
        raise error(None, None, message.value.decode(errors="replace"))
    del lib
    return rank.value, size.value


def rank_and_size(timeout_seconds: Optional[float] = None) -> Tuple[int, int]:
    """(rank, size) of this process in the MPI job, after mxrec's MPI set-up, which is
    collective: every rank calls it (init() does), within the collective timeout."""
    return _initialize(_timeout(timeout_seconds))


def next_channel() -> int:
    """A new channel of the current graph (the same sequence on every rank).

    Raises:
        ValueError: one trace of a TF2 function builds more than 65535 exchanges.
    """
    if tf.executing_eagerly():
        # Eager ops run one at a time, so a channel can come round again.
        return next(_EAGER_CHANNELS) % (_FUNCTION_BASE - 1) + 1
    graph = _numbering_graph(tf.compat.v1.get_default_graph(),
                             tf.compat.v1.executing_eagerly_outside_functions())
    channel = _CHANNELS.get(graph, 1)
    _CHANNELS[graph] = channel + 1
    if not _is_function(graph):
        return channel
    if channel >= _PER_FUNCTION:
        raise ValueError(
            f"tf.function {graph.name!r}: one trace builds more than {_PER_FUNCTION - 1} "
            "exchanges between ranks (mxrec's MPI channels per function); trace fewer steps "
            "or lookups into one function")
    return _FUNCTION_BASE + _function_slot(graph.name) * _PER_FUNCTION + channel


def _numbering_graph(graph, tf2: bool):
    """The graph whose counter numbers an exchange built in `graph`: in a Session graph
    the outermost graph (cond/while branches and functions share it); in TF2 the
    outermost function being traced, so that its numbering depends on its trace alone."""
    while getattr(graph, "outer_graph", None) is not None:
        outer = graph.outer_graph
        if tf2 and not getattr(outer, "building_function", False):
            return graph  # the function traced from eager code
        graph = outer
    return graph


def _is_function(graph) -> bool:
    return getattr(graph, "outer_graph", None) is not None


def _function_slot(name: str) -> int:
    """The slot of a function's channels, from its name with TF's unique suffixes
    (`__backward_step_123`) dropped: the same on every rank and at every trace. Drawn from
    a hash of the name; a name whose slot another name holds takes the next free one, in
    the order the names are first traced (the same on every rank that runs the same
    script). Two functions of one name share channels, which is sound while they do not run
    at the same time (Keras' train, test and predict functions run one at a time).

    Raises:
        ValueError: more than 256 function names build exchanges in one process.
    """
    stem = re.sub(r"(_\d+)+$", "", name)
    if stem not in _SLOTS:
        if len(_SLOTS) >= _FUNCTION_SLOTS:
            raise ValueError(
                f"tf.function {name!r}: more than {_FUNCTION_SLOTS} functions of different "
                "names build exchanges between ranks in this process (mxrec's MPI channels)")
        taken = set(_SLOTS.values())
        slot = zlib.crc32(stem.encode()) % _FUNCTION_SLOTS
        while slot in taken:
            slot = (slot + 1) % _FUNCTION_SLOTS
        _SLOTS[stem] = slot
    return _SLOTS[stem]


def _timeout(timeout_seconds: Optional[float]) -> float:
    """The given bound, else MXREC_COLLECTIVE_TIMEOUT (communication passes its own: this
    module sits below communication and does not import it)."""
    if timeout_seconds is not None:
        return float(timeout_seconds)
    return env.seconds("MXREC_COLLECTIVE_TIMEOUT", 300.0)


def alltoallv(data, send_counts, name: str = "alltoallv",
              timeout_seconds: Optional[float] = None):
    """Variable-size all-to-all: rows [sum(send_counts[:r]), sum(send_counts[:r+1])) of
    `data` go to rank r.

    Args:
        data: [n, ...] float32/float64/int32/int64.
        send_counts: [N] int32, rows for each rank (adding up to n).
        name: names the exchange in errors.
        timeout_seconds: the bound of every wait (default: MXREC_COLLECTIVE_TIMEOUT).

    Returns:
        (received [m, ...]: the rows each rank sent here, in rank order;
         recv_counts [N] int32: how many came from each rank).

    Gradient: the reverse exchange (the gradient of the received rows goes back to the
    ranks that sent them, with recv_counts as its send counts).
    """
    data = tf.convert_to_tensor(data)
    send_counts = tf.cast(send_counts, tf.int32)
    received, recv_counts = library().mxrec_mpi_alltoallv(
        data=data, send_counts=send_counts, channel=next_channel(), exchange=name,
        timeout_seconds=_timeout(timeout_seconds))
    return received, recv_counts


def allreduce(tensor, reduction: str = "sum", name: str = "allreduce",
              timeout_seconds: Optional[float] = None) -> tf.Tensor:
    """Element-wise sum/max/min/mean of `tensor` over the ranks; every rank reduces the
    same buffers in rank order, so all ranks get the same bits.

    Gradient: for sum and mean, the same reduction of the gradient (every rank's output
    depends on every rank's input); none for max/min.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"allreduce: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    tensor = tf.convert_to_tensor(tensor)
    out = library().mxrec_mpi_allreduce(
        data=tensor, reduction="sum" if reduction == "mean" else reduction,
        channel=next_channel(), exchange=name, timeout_seconds=_timeout(timeout_seconds))
    if reduction == "mean":
        _, size = rank_and_size()
        out = out / tf.cast(size, out.dtype)
    return out


@tf.RegisterGradient("MxrecMpiAlltoallv")
def _alltoallv_grad(op, grad_received, _grad_counts):
    back, _ = library().mxrec_mpi_alltoallv(
        data=tf.convert_to_tensor(grad_received), send_counts=op.outputs[1], channel=next_channel(),
        exchange=op.get_attr("exchange").decode() + "/gradient",
        timeout_seconds=op.get_attr("timeout_seconds"))
    return [back, None]


@tf.RegisterGradient("MxrecMpiAllreduce")
def _allreduce_grad(op, grad):
    if op.get_attr("reduction") != b"sum":
        return [None]
    return [library().mxrec_mpi_allreduce(
        data=grad, reduction="sum", channel=next_channel(),
        exchange=op.get_attr("exchange").decode() + "/gradient",
        timeout_seconds=op.get_attr("timeout_seconds"))]
