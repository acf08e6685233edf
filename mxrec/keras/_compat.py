"""What differs between Keras 2 (TF 2.15's tf.keras) and Keras 3 (TF 2.21's tf.keras)."""

import tensorflow as tf


def keras_major() -> int:
    """2 or 3: the major version of the Keras behind tf.keras."""
    version = getattr(tf.keras, "__version__", None)
    if version is None:  # TF 2.15: tf.keras is keras.api._v2.keras (Keras 2)
        import keras  # noqa: PLC0415 (only to read its version)

        version = keras.__version__
    return int(str(version).split(".")[0])


def tf_variable(variable) -> tf.Variable:
    """The tf.Variable behind a Keras weight (Keras 3 wraps one; Keras 2's is one)."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(f"{variable!r} is not backed by a tf.Variable")


def table_of(variable):
    """The mxrec.keras table of a Keras weight, or None (a dense variable)."""
    table = getattr(variable, "_mxrec_keras_table", None)
    if table is None and not isinstance(variable, tf.Variable):
        table = getattr(getattr(variable, "value", None), "_mxrec_keras_table", None)
    return table


def require_eager(what: str) -> None:
    if not tf.executing_eagerly() and not tf.inside_function():
        raise RuntimeError(
            f"{what}: mxrec.keras needs TensorFlow 2's eager mode (inside it, tf.function and "
            "Model.fit work); this process called tf.compat.v1.disable_eager_execution(). Use "
            "mxrec's Session API (mxrec.core.embedding.create_table / sparse_lookup) there")
