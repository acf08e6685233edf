"""The Keras path's serving export: a SavedModel of core ops, as the Session path's export.

`mxrec.keras.export_serving(model, export_dir)` is the user's call: it gathers what only the
Keras layer knows (the model's mxrec Embedding layers, its dense weights under their checkpoint
names, how to save the model as it is) and hands it to `export_model` here, below the Keras
layer, so no import runs from the export up to `mxrec.keras`.

The export is `mxrec.export.saved_model.export_saved_model` itself: the same graph form (per
table a `StaticHashTable` ID -> index filled from `mxrec_serving/<table>/ids` by the main
op, `mxrec_serving/<table>/embeddings` with a last row of zeros for unseen IDs), the same
pruning and check that no mxrec op is left, the same files; so `mxrec.serving`'s REST
predictor, `apply_delta` and TensorFlow Serving take it as they take a Session export.
What differs is how the serving graph's model is built:

1. the Keras model is traced once (`model(inputs, training=False)` in a tf.function) with
   each `Embedding` looking up through core ops instead of the key stage: the same lookup
   as the Session export's (`_ServingTable.lookup`) over stand-in eager resources;
2. that function's graph is imported into the export's graph, its captured resources
   mapped onto the export's: each table's stand-ins onto the table's serving variables and
   hash table, each dense weight onto a variable of its checkpoint name (the names of
   `mxrec.keras.saving`), whose value the export reads from the checkpoint.

The rows come from an mxrec checkpoint: `checkpoint` (a directory of full/delta versions
of either path, or one version folder), or, by default, a full version of the model as it
is, written to a temporary directory.
"""

import shutil
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from mxrec.export import quantize as quantizer
from mxrec.export import saved_model


class _StandIn:
    """The eager resources a table's serving lookup reads while the model is traced; the
    attributes `_ServingTable.lookup` uses."""

    def __init__(self, table, quantize: Optional[str] = None):
        self.name, self.dim = table.table_name, table.dim
        # as the export's _ServingTable of this table: int8 where it makes the rows smaller
        self.quantize = quantize if quantizer.quantizes(quantize, self.dim) else None
        self.ids = tf.Variable(tf.zeros([0], tf.int64), shape=[None], trainable=False,
                               name=f"{self.name}_serving_ids")
        if self.quantize is None:
            self.embeddings = tf.Variable(tf.zeros([1, self.dim], tf.float32),
                                          shape=[None, self.dim], trainable=False,
                                          name=f"{self.name}_serving_embeddings")
        else:
            self.quantized = tf.Variable(tf.zeros([1, self.dim], tf.uint8),
                                         shape=[None, self.dim], trainable=False,
                                         name=f"{self.name}_serving_quantized")
            self.scale_offset = tf.Variable(tf.zeros([1, 2], tf.float32), shape=[None, 2],
                                            trainable=False,
                                            name=f"{self.name}_serving_scale_offset")
        self.table = tf.lookup.StaticHashTable(  # its contents are never read
            tf.lookup.KeyValueTensorInitializer(tf.zeros([1], tf.int64),
                                                tf.zeros([1], tf.int64)),
            default_value=tf.constant(-1, tf.int64))

    @property
    def zero_row(self):
        return tf.size(self.ids.value(), out_type=tf.int64)

    def variables(self):
        """{field: the stand-in variable} of the rows (`_ServingTable.fields` but the IDs)."""
        if self.quantize is None:
            return {"embeddings": self.embeddings}
        return {quantizer.QUANTIZED: self.quantized, quantizer.SCALE_OFFSET: self.scale_offset}

    def _rows(self, index):
        return saved_model._ServingTable._rows(self, index)  # noqa: SLF001

    def lookup(self, ids, default_value, padding_keys):
        return saved_model._ServingTable.lookup(self, ids, default_value,  # noqa: SLF001
                                                  padding_keys)


def _name(tensor, index: int, prefix: str) -> str:
    name = getattr(tensor, "name", None) or f"{prefix}_{index}"
    return name.split(":")[0].replace("/", "_")


def _trace(model, layers, stand_ins):
    """The model's inference as a ConcreteFunction over core ops, and its input names."""
    inputs = list(model.inputs)
    names = [_name(t, i, "input") for i, t in enumerate(inputs)]
    if len(set(names)) != len(names):
        raise ValueError(f"mxrec.keras.export_serving: the model's inputs need distinct "
                         f"names, got {names}")
    specs = [tf.TensorSpec(t.shape, t.dtype, name=n) for t, n in zip(inputs, names)]

    def infer(*args):
        out = model(list(args) if len(args) > 1 else args[0], training=False)
        return out

    for layer in layers:  # not Keras' __setattr__: nothing of this is tracked
        object.__setattr__(layer, "_serving", stand_ins[layer.table.table_name])
    try:
        concrete = tf.function(infer).get_concrete_function(*specs)
    finally:
        for layer in layers:
            object.__setattr__(layer, "_serving", None)
    return concrete, names


def _output_names(model, count: int):
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != count or len(set(names)) != count:
        names = [f"output_{i}" for i in range(count)]
    return names


def _captures(concrete, stand_ins, dense) -> List[Tuple[tuple, str]]:
    """What the traced function reads from outside, in its order: (what it is, the name of
    its placeholder inside the function). What it is: (table, field) of a table's
    stand-in, ("dense", checkpoint name, variable) of a dense weight, ("constant", value)
    of an eager constant.

    Raises:
        ValueError: the function reads a resource that is neither a weight nor a table.
    """
    resources = {}
    for name, stand_in in stand_ins.items():
        resources[id(stand_in.ids.handle)] = (name, "ids")
        for field, variable in stand_in.variables().items():
            resources[id(variable.handle)] = (name, field)
        resources[id(stand_in.table.resource_handle)] = (name, "table")
    for name, variable in dense:
        resources[id(variable.handle)] = ("dense", name, variable)
    captures = []
    for external, internal in concrete.graph.captures:
        found = resources.get(id(external))
        if found is None and external.dtype != tf.resource:  # an eager constant: its value
            found = ("constant", external.numpy())
        if found is None:
            raise ValueError(f"mxrec.keras.export_serving: the model's inference reads "
                             f"{external!r}, which is neither a weight of the model nor a "
                             "table; the export holds weights and tables only")
        captures.append((found, internal.name))
    return captures


def _serving_input(found: tuple, tables, context, dense_variables):
    """The export graph's tensor for one capture (see `_captures`); a dense weight's
    variable is made once, under its checkpoint name, in `dense_variables`."""
    if found[0] == "constant":
        return tf.constant(found[1])
    if found[0] == "dense":
        _, name, variable = found
        if name not in dense_variables:
            dense_variables[name] = tf.compat.v1.Variable(
                tf.zeros(variable.shape, variable.dtype), name=name,
                trainable=variable.trainable, use_resource=True)
            if dense_variables[name].op.name != name:
                raise ValueError(f"mxrec.keras.export_serving: weight name {name!r} "
                                 "is taken in the serving graph; rename it with "
                                 "dense_names")
        return dense_variables[name].handle
    table_name, field = found
    serving_table = context.table(tables[table_name])
    if field == "table":
        return serving_table.table.resource_handle
    return getattr(serving_table, field).handle  # ids, embeddings, quantized, scale_offset


def _builder(concrete, input_names, output_names, captures, tables) -> Callable:
    """The export's model-building function: the traced function's graph imported into the
    export's graph over placeholders of the model's input names, with its captures mapped
    onto the serving tables, dense variables and constants."""
    graph_def = concrete.graph.as_graph_def()
    input_tensors = [t.name for t in concrete.inputs[:len(input_names)]]
    output_tensors = [t.name for t in tf.nest.flatten(concrete.structured_outputs)]

    def build():
        context = saved_model._context()  # noqa: SLF001
        placeholders = {name: tf.compat.v1.placeholder(spec.dtype, spec.shape, name=name)
                        for name, spec in zip(input_names, concrete.structured_input_signature[0])}
        input_map = {tensor: placeholders[name]
                     for tensor, name in zip(input_tensors, input_names)}
        dense_variables = {}
        for found, internal in captures:
            input_map[internal] = _serving_input(found, tables, context, dense_variables)
        results = tf.graph_util.import_graph_def(graph_def, input_map=input_map,
                                                 return_elements=output_tensors, name="model")
        return placeholders, {name: tf.identity(t, name=name)
                              for name, t in zip(output_names, results)}

    return build


def export_model(model, export_dir: str, layers: Sequence, dense: List[Tuple[str, tf.Variable]],
                 save_model: Callable[[str], None], checkpoint: Optional[str] = None,
                 signature_name: str = "serving_default", as_text: bool = False,
                 quantize: Optional[str] = None) -> str:
    """Writes a SavedModel (tag "serve") of core ops that predicts as `model(x,
    training=False)`: IDs without a row look up zeros (or the layer's
    serving_default_value), padding keys zeros. `mxrec.keras.export_serving` documents it
    for users and calls it.

    Args:
        model: a Keras model; its inputs (by their names) and outputs (by the model's output
            names) are the signature's.
        export_dir: a directory that does not exist yet (TF Serving: `<base>/<version>`).
        layers: the model's mxrec.keras Embedding layers; while the model is traced each
            looks up through the stand-in put in its `_serving` attribute.
        dense: (name in the checkpoint, tf.Variable) of each dense weight of the model.
        save_model: writes a full version of the model as it is into a directory (used when
            `checkpoint` is None).
        checkpoint: the rows and weights to serve: an mxrec checkpoint directory (either
            path's) or one version folder; by default the model as it is now.
        signature_name, as_text, quantize: as in mxrec.export.saved_model.export_saved_model
            (quantize="int8": each table's rows as uint8 codes with a scale and offset per
            row, dequantized in the graph).

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists; a table or weight missing from the checkpoint or of
            another shape; the model's inference needs a resource other than its weights
            (e.g. a tf.lookup table of its own) or an mxrec op.
    """
    if tf.io.gfile.exists(export_dir):
        raise ValueError(f"mxrec.keras.export_serving: export_dir {export_dir!r} already exists")
    tables = {layer.table.table_name: layer.table for layer in layers}
    if not tables:
        raise ValueError("mxrec.keras.export_serving: the model has no mxrec.keras Embedding")
    quantize = quantizer.check_quantize(quantize, "mxrec.keras.export_serving")
    stand_ins = {name: _StandIn(table, quantize) for name, table in tables.items()}
    concrete, input_names = _trace(model, layers, stand_ins)
    output_names = _output_names(model, len(tf.nest.flatten(concrete.structured_outputs)))
    build = _builder(concrete, input_names, output_names,
                     _captures(concrete, stand_ins, dense), tables)
    temporary = None
    try:
        if checkpoint is None:
            temporary = tempfile.mkdtemp(prefix="mxrec_keras_export_")
            save_model(temporary)
            checkpoint = temporary
        return saved_model.export_saved_model(export_dir, checkpoint, build,
                                                signature_name=signature_name, as_text=as_text,
                                                quantize=quantize)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
