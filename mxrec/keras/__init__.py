"""mxrec for TensorFlow 2: the same tables in eager code, tf.function and Keras Model.fit.

    import mxrec.keras as mk

    mk.init()                                    # mxrec's init(), same settings
    user = mk.Embedding(dim=16, name="user", device_vocabulary_size=100_000,
                        access_threshold=2)      # create_table's settings
    model.compile(optimizer=mk.optimizers.Adagrad(0.05), loss=...)

docs/KERAS.md says what works and what is not available yet.
"""

from mxrec.keras import callbacks, optimizers
from mxrec.keras._compat import require_eager
from mxrec.keras.layers import Embedding
from mxrec.keras.saving import KerasSaver, warm_start
from mxrec.keras.serving import export_serving
from mxrec.util import initialize


def init(**kwargs):
    """mxrec's init() (mxrec.util.initialize.init, the same settings) for TF2 code.

    Raises:
        RuntimeError: eager execution is off (tf.compat.v1.disable_eager_execution()).
    """
    require_eager("mxrec.keras.init")
    return initialize.init(**kwargs)


terminate = initialize.terminate_config_initializer

__all__ = ["Embedding", "KerasSaver", "callbacks", "export_serving", "init", "optimizers",
           "terminate", "warm_start"]
