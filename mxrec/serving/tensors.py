"""TensorProto <-> numpy for the gRPC API, with the checks a request's tensors need before
anything is allocated for them.

A TensorProto may declare a shape larger than the values it carries (TensorFlow fills the
rest with its last value), so a message of a few bytes can ask for gigabytes: the shape is
checked against the server's message limit before the array is made.

Numbers sent as raw bytes (`tensor_content`, as `tf.make_tensor_proto` and TF Serving's
clients send them) become an array over those bytes, read-only and not copied, and
outputs are written as raw bytes straight into the response's map: the same values
`tf.make_ndarray` and `tf.make_tensor_proto` give, without their per-call work. Other
encodings (the typed value fields, strings) go through TensorFlow's own conversion.

Example:
    >>> array = to_array("ids", tf.make_tensor_proto([[1, 2, 3]], tf.int64), 64 << 20)
    >>> array.shape                       # (1, 3), int64
    >>> proto = to_proto(np.zeros([2, 1], np.float32))
"""

import math
import sys

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2

from mxrec.serving.requests import RequestError

# The numeric dtypes a TensorProto carries as little-endian bytes in tensor_content.
_RAW = {types_pb2.DT_FLOAT: np.dtype("<f4"), types_pb2.DT_DOUBLE: np.dtype("<f8"),
        types_pb2.DT_HALF: np.dtype("<f2"), types_pb2.DT_INT8: np.dtype("i1"),
        types_pb2.DT_INT16: np.dtype("<i2"), types_pb2.DT_INT32: np.dtype("<i4"),
        types_pb2.DT_INT64: np.dtype("<i8"), types_pb2.DT_UINT8: np.dtype("u1"),
        types_pb2.DT_UINT16: np.dtype("<u2"), types_pb2.DT_UINT32: np.dtype("<u4"),
        types_pb2.DT_UINT64: np.dtype("<u8"), types_pb2.DT_BOOL: np.dtype("?")}
_ENUM = {dtype.newbyteorder("="): enum for enum, dtype in _RAW.items()}
_LITTLE = sys.byteorder == "little"


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
    if dims and min(dims) < 0:
        raise RequestError(f"input {name!r}: the shape {dims} has a negative dimension")
    raw = _RAW.get(proto.dtype)
    item = _item_size(name, proto.dtype) if raw is None else raw.itemsize
    count = math.prod(dims)
    if count * item > limit:
        raise RequestError(f"input {name!r}: the shape {dims} holds {count} values "
                           f"({count * item} bytes), more than this server's limit of "
                           f"{limit} bytes (python -m mxrec.serving --grpc-max-message-bytes)",
                           413)
    content = proto.tensor_content
    if raw is not None and content:
        if len(content) != count * item:
            raise RequestError(f"input {name!r}: tensor_content has {len(content)} bytes; a "
                               f"{types_pb2.DataType.Name(proto.dtype)} tensor of shape "
                               f"{dims} has {count * item}")
        return np.frombuffer(content, raw).reshape(dims)
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError, KeyError) as error:  # KeyError: a handle dtype
        raise RequestError(f"input {name!r}: the tensor's values do not make a "
                           f"{types_pb2.DataType.Name(proto.dtype)} tensor of shape {dims}: "
                           f"{error}") from None


def _item_size(name: str, dtype: int) -> int:
    try:
        tf_dtype = tf.dtypes.as_dtype(dtype)
    except TypeError:
        raise RequestError(f"input {name!r}: dtype {dtype} is not a TensorFlow "
                           "dtype") from None
    return 1 if tf_dtype == tf.string else tf_dtype.size


def fill(proto: tensor_pb2.TensorProto, value) -> None:
    """Writes an output array into an empty TensorProto (a response's map entry): numbers
    as their raw bytes (tensor_content, as TF Serving answers), other dtypes through
    TensorFlow's own conversion."""
    value = np.asarray(value)
    dtype = value.dtype
    enum = _ENUM.get(dtype)
    if enum is None:
        enum = _ENUM.get(dtype.newbyteorder("="))
    if enum is None:
        proto.CopyFrom(tf.make_tensor_proto(value))
        return
    proto.dtype = enum
    dims = proto.tensor_shape.dim
    for size in value.shape:
        dims.add(size=size)
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not _LITTLE):
        value = value.astype(dtype.newbyteorder("<"))
    proto.tensor_content = value.tobytes()  # C order, whatever the array's strides


def to_proto(value) -> tensor_pb2.TensorProto:
    """A TensorProto of an array (as `fill`)."""
    proto = tensor_pb2.TensorProto()
    fill(proto, value)
    return proto


__all__ = ["to_array", "to_proto", "fill"]
