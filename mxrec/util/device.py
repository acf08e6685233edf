"""Where the dense model and the device tables run."""

import functools

import tensorflow as tf


@functools.cache
def accelerator_device() -> str:
    """The accelerator: the first GPU when one is visible, otherwise the CPU."""
    if tf.config.list_physical_devices("GPU"):
        return "/device:GPU:0"
    return "/device:CPU:0"
