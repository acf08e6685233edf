"""TensorProto <-> numpy for the gRPC API, with the checks a request's tensors need before
anything is allocated for them.

A TensorProto may declare a shape larger than the values it carries (TensorFlow fills the
rest with its last value), so a message of a few bytes can ask for gigabytes: the shape is
checked against the server's message limit before the array is made.

Example:
    >>> array = to_array("ids", tf.make_tensor_proto([[1, 2, 3]], tf.int64), 64 << 20)
    >>> array.shape                       # (1, 3), int64
    >>> proto = to_proto(np.zeros([2, 1], np.float32))
"""

import math

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from mxrec.serving.requests import RequestError


def to_array(name: str, proto: tensor_pb2.TensorProto, limit: int) -> np.ndarray:
    """The request's tensor `name` as a numpy array (strings as an object array of bytes).

    Args:
        name: the input's name, for the messages.
        proto: its TensorProto.
        limit: the largest array in bytes (the server's message limit).

    Raises:
        RequestError: 400 naming the input: an unknown rank, a negative dimension, a dtype
            TensorFlow does not know, values that do not fill the shape; 413 for a shape
            whose values would be larger than `limit`.
    """
    shape = proto.tensor_shape
    if shape.unknown_rank:
        raise RequestError(f"input {name!r}: the tensor has an unknown rank; give its shape")
    dims = [d.size for d in shape.dim]
    if any(d < 0 for d in dims):
        raise RequestError(f"input {name!r}: the shape {dims} has a negative dimension")
    try:
        dtype = tf.dtypes.as_dtype(proto.dtype)
        item = 1 if dtype == tf.string else dtype.size
    except TypeError:
        raise RequestError(f"input {name!r}: dtype {proto.dtype} is not a TensorFlow "
                           "dtype") from None
    count = math.prod(dims)
    if count * item > limit:
        raise RequestError(f"input {name!r}: the shape {dims} holds {count} values "
                           f"({count * item} bytes), more than this server's limit of "
                           f"{limit} bytes (python -m mxrec.serving --grpc-max-message-bytes)",
                           413)
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError, KeyError) as error:  # KeyError: a handle dtype
        raise RequestError(f"input {name!r}: the tensor's values do not make a "
                           f"{types_pb2.DataType.Name(proto.dtype)} tensor of shape {dims}: "
                           f"{error}") from None


def to_proto(value) -> tensor_pb2.TensorProto:
    """A TensorProto of an output array: numbers as their raw bytes (tensor_content, as
    TF Serving answers), strings through TensorFlow's own conversion."""
    value = np.asarray(value)
    if value.dtype.kind in "OSU":
        return tf.make_tensor_proto(value)
    value = np.ascontiguousarray(value, value.dtype.newbyteorder("<"))
    return tensor_pb2.TensorProto(
        dtype=tf.dtypes.as_dtype(value.dtype).as_datatype_enum,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in value.shape]),
        tensor_content=value.tobytes())


__all__ = ["to_array", "to_proto"]
