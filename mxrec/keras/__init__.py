"""mxrec for TensorFlow 2: the same tables in eager code, tf.function and Keras Model.fit.

    import mxrec.keras as mk

    mk.init()                                    # mxrec's init(), same settings
    user = mk.Embedding(dim=16, name="user", device_vocabulary_size=100_000,
                        access_threshold=2)      # create_table's settings
    model.compile(optimizer=mk.optimizers.Adagrad(0.05), loss=...)
    model.fit(mk.data.plan_ahead(dataset, model, prefetch=2))  # optional: the key stage
                                                                # in tf.data, ahead of the step
docs/KERAS.md says what works and what is not available yet.
"""

from typing import Dict, Optional

import tensorflow as tf

from mxrec import initialize
from mxrec.distributed import communication
from mxrec.export import keras_model
from mxrec.export import quantize as quantizer
from mxrec.keras import _compat, callbacks, data, metrics, optimizers
from mxrec.keras._compat import require_eager
from mxrec.keras.group import EmbeddingGroup
from mxrec.keras.layers import Embedding, embedding_layers
from mxrec.keras.ranks import broadcast_weights, rank_and_size
from mxrec.keras.saving import KerasSaver, keras_name, warm_start


def init(**kwargs):
    """mxrec's init() (mxrec.initialize.init, the same settings) for TF2 code.

    Raises:
        RuntimeError: eager execution is off (tf.compat.v1.disable_eager_execution()).
    """
    require_eager("mxrec.keras.init")
    return initialize.init(**kwargs)


terminate = initialize.terminate_config_initializer


def export_serving(model, export_dir: str, checkpoint: Optional[str] = None,
                   dense_names: Optional[Dict[str, str]] = None,
                   signature_name: str = "serving_default", as_text: bool = False,
                   quantize: Optional[str] = None) -> str:
    """Writes a SavedModel (tag "serve") of core ops that predicts as `model(x,
    training=False)`: IDs without a row look up zeros (or the layer's
    serving_default_value), padding keys zeros (mxrec.export.keras_model).

    On several ranks every rank calls it (it is collective) and rank 0 writes the whole
    model: without `checkpoint` each rank first saves its shard of the tables into
    `<export_dir>.mxrec-rows` (removed after; export_dir must be on a filesystem every rank
    sees, as checkpoints are).

    Args:
        model: a Keras model with mxrec.keras Embedding layers; its inputs (by their names)
            and outputs (by the model's output names) are the signature's.
        export_dir: a directory that does not exist yet (TF Serving: `<base>/<version>`).
        checkpoint: the rows and weights to serve: an mxrec checkpoint directory (either
            path's) or one version folder; by default the model as it is now.
        dense_names: {Keras name: name in the checkpoint} (mxrec.keras.saving), for a
            checkpoint whose dense names differ from the model's.
        signature_name, as_text: as in mxrec.export.saved_model.export_saved_model.
        quantize: None (rows served as float32) or "int8": each row as uint8 codes with its
            own scale and offset, dequantized by core ops in the graph, as the Session
            path's export_saved_model(quantize="int8") (docs/QUANTIZATION.md).

    Returns:
        export_dir.

    Raises:
        RuntimeError: eager execution is off; on several ranks, rank 0's export failed.
        ValueError: export_dir exists; a table or weight missing from the checkpoint or of
            another shape; the model's inference needs a resource other than its weights
            (e.g. a tf.lookup table of its own) or an mxrec op.

    Example:
        >>> mk.export_serving(model, "/serving/user_model/1")  # predicts as model(x)
    """
    require_eager("mxrec.keras.export_serving")
    # checked before any rank saves its rows
    quantize = quantizer.check_quantize(quantize, "mxrec.keras.export_serving")
    dense_names = dict(dense_names or {})
    dense = [(dense_names.get(keras_name(weight), keras_name(weight)),
              _compat.tf_variable(weight))
             for weight in model.weights if _compat.table_of(weight) is None]

    def save_model(directory: str) -> None:
        KerasSaver(directory, model, None, max_to_keep=None,
                   dense_names=dense_names).save(step=0, kind="full")

    def export(source: Optional[str]) -> str:
        return keras_model.export_model(model, export_dir, embedding_layers(model), dense,
                                        save_model, source, signature_name, as_text, quantize)

    rank, size = rank_and_size()
    if size == 1:
        return export(checkpoint)
    return _export_on_ranks(export, save_model, export_dir, checkpoint, rank)


def _export_on_ranks(export, save_model, export_dir: str, checkpoint: Optional[str],
                     rank: int) -> str:
    """export_serving on several ranks (collective): without `checkpoint` every rank first
    saves its shard of the tables beside export_dir (one shared folder, as checkpoints
    need); rank 0 then writes the whole model, the other ranks wait for it."""
    rows = export_dir.rstrip("/") + ".mxrec-rows" if checkpoint is None else None
    # Every rank looks before any rank writes, and all refuse alike.
    found = [tf.io.gfile.exists(export_dir), rows is not None and tf.io.gfile.exists(rows)]
    found = communication.allreduce(tf.constant(found, tf.int32), "max").numpy()
    if found[0]:
        raise ValueError(f"mxrec.keras.export_serving: export_dir {export_dir!r} already exists")
    if found[1]:
        raise ValueError(f"mxrec.keras.export_serving: {rows!r} exists; on several ranks "
                         "the ranks' rows are saved there first: remove it")
    if rows is not None:
        save_model(rows)
    failed = 1
    try:
        if rank == 0:
            export(rows if checkpoint is None else checkpoint)
        failed = 0
    finally:
        # The others wait for rank 0's export, and learn whether it failed.
        failures = int(communication.allreduce(tf.constant(failed, tf.int32), "sum").numpy())
        if rows is not None and rank == 0:
            tf.io.gfile.rmtree(rows)
    if failures:
        raise RuntimeError(f"mxrec.keras.export_serving: rank 0's export to {export_dir!r} "
                           "failed (its error is in rank 0's output)")
    return export_dir


__all__ = ["Embedding", "EmbeddingGroup", "KerasSaver", "broadcast_weights", "callbacks", "data",
           "export_serving", "init", "metrics", "optimizers", "rank_and_size", "terminate",
           "warm_start"]
