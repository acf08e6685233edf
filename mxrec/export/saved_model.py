"""Export for serving: a SavedModel whose tables are core TensorFlow lookups.

`export_saved_model` calls the user's model-building function in a fresh graph
marked for serving export. There `sparse_lookup` builds, per table, only core
ops:

    ids [*S] -> int64 -> StaticHashTable (ID -> index, unseen -> K)
             -> gather(embeddings [K + 1, dim]) -> [*S, dim]

The hash table is filled from a variable `mxrec_serving/<table>/ids` [K] by the
SavedModel's main op, after the loader has restored the variables, and
`mxrec_serving/<table>/embeddings` holds the K rows plus a last row of zeros,
which unseen (and padding) IDs look up. Both variables have a dynamic first
dimension, so `apply_delta` can write a new export with more or fewer IDs
without touching the graph. The dense variables keep their names and take their
values from the checkpoint.

The graph is pruned to what the signature and the table initialisers need
before it is written, so the device tables and host-state ops of the training
graph are not in the SavedModel: TensorFlow Serving (or `tf.saved_model.load`)
loads it without mxrec and without mxrec's op library.

Example:
    >>> def build():
    ...     ids = tf.compat.v1.placeholder(tf.int64, [None, 3], name="ids")
    ...     table = create_table(tf.int64, 8, "user_table", init, device_vocabulary_size=1000)
    ...     score = model(sparse_lookup(table, ids, is_train=False))  # [B, 1]
    ...     return {"ids": ids}, {"score": score}
    >>> export_saved_model("/serving/1", "/ckpt/model-100", build)
    >>> apply_delta("/serving/1", {"user_table": {"ids": ..., "embeddings": ...,
    ...                                           "removed": ...}}, "/serving/2")
"""

import functools
import os
import posixpath
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from mxrec.export import quantize as quantizer
from mxrec.saver import finite, fold, merge, sparse, stream
from mxrec.saver import manifest as manifest_io
from mxrec.saver.finite import NonFiniteError
from mxrec.saver.manifest import CheckpointError
from mxrec.util import config, durable, registry

SERVING_SCOPE = "mxrec_serving"
_CONTEXT_COLLECTION = "mxrec_serving_export_context"
_IDS, _EMBEDDINGS = "ids", "embeddings"
_INIT_OP_NAME = "mxrec_serving_init"
_SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def in_serving_export() -> bool:
    """True while a serving graph is being built; sparse_lookup then builds core-op lookups.

    The mark belongs to the graph (a collection), not to the process, so training graphs
    built meanwhile in other threads are not affected.
    """
    return bool(tf.compat.v1.get_default_graph().get_collection(_CONTEXT_COLLECTION))


def serving_variable_name(table_name: str, field: str) -> str:
    """Name of a serving variable of a table: `mxrec_serving/<table>/<field>`, field `ids`,
    `embeddings` (float32 rows) or, in an int8 export, `quantized` and `scale_offset`."""
    return f"{SERVING_SCOPE}/{table_name}/{field}"


def _row_variable(field: str, dtype, width: int):
    """A serving variable of rows [None, width] (a dynamic first dimension, so deltas change
    the row count without touching the graph), one row by default."""
    value = tf.compat.v1.placeholder_with_default(tf.zeros([1, width], dtype), [None, width],
                                                  name=f"{field}_value")
    return tf.compat.v1.Variable(value, name=field, trainable=False, use_resource=True,
                                 validate_shape=False)


class _ServingTable:
    """The core-op form of one table in the serving graph: float32 rows, or with
    quantize="int8" uint8 codes and a (scale, offset) pair per row dequantized in the graph."""

    def __init__(self, name: str, dim: int, quantize: Optional[str] = None):
        self.name = name
        self.dim = dim
        self.quantize = quantize
        graph = tf.compat.v1.get_default_graph()
        # Created once per table at the graph's root, whatever scope the first lookup is in.
        with graph.name_scope(None), graph.control_dependencies(None), \
                tf.device("/device:CPU:0"), tf.name_scope(f"{SERVING_SCOPE}/{name}/"):
            ids_value = tf.compat.v1.placeholder_with_default(
                tf.zeros([0], tf.int64), [None], name="ids_value")
            self.ids = tf.compat.v1.Variable(ids_value, name=_IDS, trainable=False,
                                             use_resource=True, validate_shape=False)
            if quantize is None:
                self.embeddings = _row_variable(_EMBEDDINGS, tf.float32, dim)
            else:
                self.quantized = _row_variable(quantizer.QUANTIZED, tf.uint8, dim)
                self.scale_offset = _row_variable(quantizer.SCALE_OFFSET, tf.float32, 2)
            keys = self.ids.value()
            count = tf.size(keys, out_type=tf.int64)
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    keys, tf.range(count, dtype=tf.int64), name="key_index"),
                default_value=tf.constant(-1, tf.int64), name="id_to_index")
            self.zero_row = count

    def fields(self) -> Tuple[str, ...]:
        """The names of the table's serving variables."""
        if self.quantize is None:
            return _IDS, _EMBEDDINGS
        return _IDS, quantizer.QUANTIZED, quantizer.SCALE_OFFSET

    def _rows(self, index: tf.Tensor) -> tf.Tensor:
        """float32 [N, dim] rows at `index` (the zero row's codes, scale and offset are 0)."""
        if self.quantize is None:
            return tf.gather(self.embeddings, index)
        scale_offset = tf.gather(self.scale_offset, index)  # [N, 2]
        return (tf.cast(tf.gather(self.quantized, index), tf.float32) * scale_offset[:, :1]
                + scale_offset[:, 1:])

    def lookup(self, ids: tf.Tensor, default_value=None, padding_keys=()) -> tf.Tensor:
        flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
        index = self.table.lookup(flat)
        missing = index < 0
        index = tf.where(missing, tf.fill(tf.shape(index), self.zero_row), index)
        emb = self._rows(index)
        if default_value is not None:
            if padding_keys:  # padding keys stay zeros
                pads = tf.constant(list(padding_keys), tf.int64)
                is_pad = tf.reduce_any(tf.equal(tf.expand_dims(flat, 1), pads), axis=1)
                missing = tf.logical_and(missing, tf.logical_not(is_pad))
            emb = tf.where(tf.expand_dims(missing, 1),
                           tf.broadcast_to(tf.cast(default_value, emb.dtype), tf.shape(emb)),
                           emb)
        out = tf.reshape(emb, tf.concat([tf.shape(ids, out_type=tf.int32), [self.dim]], axis=0))
        out.set_shape(ids.shape.concatenate([self.dim]))
        return out


class _TfCheckpoint:
    """A checkpoint of a TF Saver (prefix, or directory for its latest) as an export reads it."""

    def __init__(self, checkpoint: str):
        self.name = sparse.resolve_checkpoint(checkpoint)
        self.reader = tf.train.load_checkpoint(self.name)
        self._shapes = self.reader.get_variable_to_shape_map()

    def table_names(self):
        return sparse.checkpoint_tables(self.reader)

    def table_dim(self, name: str) -> Optional[int]:
        if name not in self._shapes or sparse.host_tensor_name(name, "keys") not in self._shapes:
            return None
        return int(self._shapes[name][1])

    def table_arrays(self, name: str) -> sparse.TableArrays:
        return sparse.table_arrays_from_reader(self.reader, name, self.name)

    def table_chunks(self, name: str, rows: int):
        """(ids, embedding rows in chunks of `rows`): `_SaverCheckpoint.table_chunks`'s
        form, from the TF checkpoint's arrays (read whole: TF's reader takes no slice)."""
        arrays = self.table_arrays(name)
        embeddings = arrays["embeddings"]
        return arrays["ids"], lambda: (embeddings[b:b + rows]
                                       for b in range(0, len(embeddings), rows))

    def dense(self, name: str) -> Optional[np.ndarray]:
        return self.reader.get_tensor(name) if self.reader.has_tensor(name) else None


class _SaverCheckpoint:
    """A checkpoint of mxrec's own Saver (its directory: the latest version, or one version),
    written by any number of ranks: every rank's files of the chain fold into whole tables
    (`fold.whole_table`), so the export is the same as from one process's checkpoint."""

    def __init__(self, checkpoint: str, location):
        self.name = checkpoint
        # Every file verified, then mapped: a table is read a chunk of rows at a time and
        # only its embeddings (no slots) are held, as the export's variable needs them.
        self._copies = stream.LocalCopies()
        self._versions = fold.open_chain(*location, self._copies)
        self._names = fold.table_names(self._versions)
        self._dims = {name: meta["dim"] for version in self._versions
                      for name, meta in version.manifest["tables"].items()}
        self._dense = self._versions[-1].dense
        self._tables: Dict[str, sparse.TableArrays] = {}

    def close(self) -> None:
        """Removes the local copies of files of another filesystem."""
        self._copies.close()

    def table_names(self):
        return list(self._names)

    def table_dim(self, name: str) -> Optional[int]:
        return self._dims.get(name) if name in self._names else None

    def table_arrays(self, name: str) -> sparse.TableArrays:
        # Folded once per export (each signature's lookups of a table ask again).
        if name not in self._tables:
            ids, embeddings = fold.admitted(fold.whole_table(self._versions, name),
                                            self._dims[name])
            self._tables[name] = {"ids": ids, "embeddings": embeddings}
        return self._tables[name]

    def table_chunks(self, name: str, rows: int):
        """(ids [K] sorted, a function giving the K embedding rows in chunks of `rows`, read
        from the checkpoint's files as they are asked for)."""
        folded = fold.whole_table(self._versions, name)
        positions = np.flatnonzero((folded.rows >= 0) | (folded.in_host != 0))
        # A fold of one file keeps the file's order: the IDs are sorted here.
        positions = positions[np.argsort(folded.keys[positions], kind="stable")]
        dim = self._dims[name]

        def chunks():
            for begin in range(0, len(positions), rows):
                part = positions[begin:begin + rows]
                values, held = folded.values(part, "embedding", dim)
                if not held.all():
                    raise CheckpointError(f"checkpoint holds no 'embedding' value of ID "
                                          f"{int(folded.keys[part[np.argmin(held)]])}")
                yield values

        return folded.keys[positions], chunks

    def dense(self, name: str) -> Optional[np.ndarray]:
        return self._dense.get(name)


def _open_checkpoint(checkpoint: str):
    location = merge.locate(checkpoint)
    return _TfCheckpoint(checkpoint) if location is None else _SaverCheckpoint(checkpoint,
                                                                              location)


class _ServingContext:
    """What one export knows while the user's function builds the graph."""

    def __init__(self, source, quantize: Optional[str]):
        self.source = source
        self.quantize = quantize
        self.checkpoint = source.name
        self.tables: Dict[str, _ServingTable] = {}

    def table(self, hashtable) -> _ServingTable:
        name = hashtable.table_name
        if name not in self.tables:
            dim = self.source.table_dim(name)
            if dim is None:
                raise ValueError(f"serving export: table {name!r} is not in checkpoint "
                                 f"{self.checkpoint!r}; tables there: "
                                 f"{self.source.table_names()}")
            if dim != hashtable.dim:
                raise ValueError(f"serving export: table {name!r} has dim {hashtable.dim} in "
                                 f"the graph but rows of dim {dim} in checkpoint "
                                 f"{self.checkpoint!r}")
            self.tables[name] = _ServingTable(
                name, hashtable.dim,
                self.quantize if quantizer.quantizes(self.quantize, dim) else None)
        return self.tables[name]


def _context() -> _ServingContext:
    contexts = tf.compat.v1.get_default_graph().get_collection(_CONTEXT_COLLECTION)
    if not contexts:
        raise RuntimeError("serving_lookup outside a serving export")
    return contexts[-1]


def serving_lookup(hashtable, ids: tf.Tensor, scope: str, default_value=None) -> tf.Tensor:
    """The serving form of `sparse_lookup`: core ops only; unseen IDs look up as zeros,
    or as `default_value` ([dim]) when one is given (padding keys stay zeros).

    Args:
        hashtable: the SparseEmbedding the user's function created.
        ids: int32/int64 tensor of rank >= 1.
        scope: name scope of the lookup.

    Returns:
        float32 tensor ids.shape + [dim].
    """
    serving_table = _context().table(hashtable)
    with tf.name_scope(scope):
        return serving_table.lookup(ids, default_value, hashtable.padding_keys)


def _private_runtime():
    """A ConfigInitializer of the export's own, so that the tables the user's function
    creates are new host tables, not the ones a training in this process is using."""
    return config.scoped_config_initializer()


def _input_names(node) -> list:
    return [name.lstrip("^").split(":")[0] for name in node.input]


def _ancestors(nodes: Mapping, roots) -> set:
    seen, stack = set(), list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(_input_names(nodes[name]))
    return seen


def _check_tensors(label: str, tensors, graph) -> Dict[str, tf.Tensor]:
    if not isinstance(tensors, Mapping) or not tensors:
        raise TypeError(f"export_saved_model: build_fn must return two non-empty dicts "
                        f"(inputs, outputs) of tensors; {label} is {tensors!r}")
    for key, tensor in tensors.items():
        if not isinstance(key, str) or not isinstance(tensor, tf.Tensor) or \
                tensor.graph is not graph:
            raise TypeError(f"export_saved_model: {label}[{key!r}] must be a tensor of the "
                            f"graph build_fn built, got {tensor!r}")
    return dict(tensors)


def _signatures(result, graph, signature_name: str) -> Dict[str, Tuple[dict, dict]]:
    """build_fn's result as {signature name: (inputs, outputs)}."""
    if isinstance(result, Mapping):
        if not result or not all(isinstance(k, str) for k in result):
            raise TypeError("export_saved_model: build_fn's dict of signatures must map "
                            f"names to (inputs, outputs); got {result!r}")
        items = list(result.items())
    else:
        items = [(signature_name, result)]
    out = {}
    for name, pair in items:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError("export_saved_model: build_fn must return (inputs, outputs), two "
                            "dicts of tensors, or {signature name: (inputs, outputs)}; got "
                            f"{type(pair).__name__} for signature {name!r}")
        out[name] = (_check_tensors("inputs", pair[0], graph),
                     _check_tensors("outputs", pair[1], graph))
    return out


def _build(build_fn, source, signature_name: str, quantize: Optional[str]):
    """Runs build_fn in a serving graph; returns what the pruned graph keeps."""
    graph = tf.Graph()
    context = _ServingContext(source, quantize)
    with graph.as_default(), _private_runtime():
        graph.add_to_collection(_CONTEXT_COLLECTION, context)
        # sparse_lookup in this graph builds core-op lookups, and its tables save nothing.
        registry.provide(registry.LOOKUP_OVERRIDE, serving_lookup, graph=graph)
        signatures = _signatures(build_fn(), graph, signature_name)
        graph_def = graph.as_graph_def()
        nodes = {node.name: node for node in graph_def.node}
        roots = [t.op.name for inputs, outputs in signatures.values()
                 for t in list(inputs.values()) + list(outputs.values())]
        reached = _ancestors(nodes, roots)
        variables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                     if v.op.name in reached]
        table_inits = [op for op in graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
                       if op.inputs[0].op.name in reached]
        var_defs = [v.to_proto() for v in variables]
        trainable = {v.op.name for v in graph.get_collection(
            tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
        for var_def in var_defs:
            roots += [var_def.initializer_name.split(":")[0],
                      var_def.snapshot_name.split(":")[0]]
        roots += [op.name for op in table_inits]
        kept = _ancestors(nodes, roots)
        serving_vars = {serving_variable_name(name, field)
                        for name, table in context.tables.items() for field in table.fields()}
    pruned = tf.compat.v1.GraphDef()
    pruned.versions.CopyFrom(graph_def.versions)
    pruned.library.CopyFrom(graph_def.library)
    pruned.node.extend(node for node in graph_def.node if node.name in kept)
    custom = sorted({n.op for n in pruned.node if n.op.startswith("Mxrec")})
    if custom:
        raise ValueError(f"export_saved_model: the serving graph still needs mxrec ops {custom}; "
                         "build the outputs from sparse_lookup results and core ops only")
    signature = {name: ({k: t.name for k, t in inputs.items()},
                        {k: t.name for k, t in outputs.items()})
                 for name, (inputs, outputs) in signatures.items()}
    return (pruned, var_defs, [op.name for op in table_inits], signature,
            {"trainable": trainable, "serving": serving_vars})


def _dense_value(source, name, shape):
    value = source.dense(name)
    if value is None:
        raise ValueError(f"export_saved_model: variable {name!r} of the serving graph is not in "
                         f"checkpoint {source.name!r}")
    if not tf.TensorShape(shape).is_compatible_with(value.shape):
        raise ValueError(f"export_saved_model: variable {name!r} has shape {shape} in the "
                         f"serving graph but {list(value.shape)} in checkpoint {source.name!r}")
    return value


def _staging_beside(target: str) -> str:
    """A fresh temporary folder's path beside `target`, naming this process as its writer
    (`manifest.remove_stale_temporaries` of the folder holding `target` removes it only
    once this process is gone)."""
    target = target.rstrip("/")
    return posixpath.join(posixpath.dirname(target),
                          manifest_io.temporary_name(posixpath.basename(target)))


def _publish(staging: str, target: str, write: Callable[[str], None]) -> None:
    """Runs write(staging), flushes what it wrote and renames it to `target`: a reader sees
    no `target`, or all of it. The staging folder does not outlive a failure."""
    try:
        write(staging)
        durable.fsync_tree(staging)
        durable.rename_durably(staging, target)
    except BaseException:
        if tf.io.gfile.exists(staging):
            tf.io.gfile.rmtree(staging)
        raise


def export_saved_model(export_dir: str, checkpoint: str,
                       build_fn: Callable[[], Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]],
                       signature_name: str = "serving_default", as_text: bool = False,
                       check_finite: bool = True, quantize: Optional[str] = None) -> str:
    """Writes a SavedModel (tag "serve") that serves without mxrec.

    It is written into a temporary folder beside export_dir, flushed to the disk, and
    renamed to export_dir: a reader (TF Serving's poll) never sees a part of it.

    Args:
        export_dir: a directory that does not exist yet (TF Serving: `<base>/<version>`).
        checkpoint: a checkpoint of the trained model: a TF checkpoint (prefix, or directory
            for its latest), or one of mxrec's Saver (its directory for the latest version,
            or a version folder `<dir>/delta-000000000100`), written by any number of ranks.
        build_fn: builds the serving graph and returns (inputs, outputs), dicts of tensors:
            inputs are its placeholders, outputs the predictions; or a dict {signature name:
            (inputs, outputs)} for several predict signatures over one set of tables and
            variables (e.g. pre-hashed IDs and raw features). It calls `create_table` and
            `sparse_lookup` as in training (the tables' names must be those of the checkpoint);
            lookups become core-op lookups whatever their is_train.
        signature_name: key of the predict signature when build_fn returns one pair.
        as_text: write saved_model.pbtxt instead of saved_model.pb.
        check_finite: refuse a model whose exported table rows or dense values hold a NaN
            or an infinity (NonFiniteError, before anything is written).
        quantize: None (rows served as float32) or "int8": each row stored as uint8 codes
            with its own float32 scale and offset and dequantized by core ops in the graph
            (mxrec.export.quantize; about (dim + 8) / (4 dim) of the float32 rows' bytes);
            tables of dim < 3, which int8 would not make smaller, stay float32.
            `apply_delta` keeps an export's form.

    Returns:
        export_dir.

    Raises:
        NonFiniteError: with check_finite, a value to export is not finite (a ValueError).
        ValueError: export_dir exists, a table or variable of the graph is not in the
            checkpoint or has another shape, the outputs need mxrec ops, or quantize is
            not None or "int8".
    """
    if not isinstance(check_finite, bool):
        raise TypeError(f"export_saved_model: check_finite must be True or False, got "
                        f"{check_finite!r}")
    quantize = quantizer.check_quantize(quantize, "export_saved_model")
    if tf.io.gfile.exists(export_dir):
        raise ValueError(f"export_saved_model: export_dir {export_dir!r} already exists")
    source = _open_checkpoint(checkpoint)
    try:
        graph_def, var_defs, table_init_names, signature, names = _build(
            build_fn, source, signature_name, quantize)
        _publish(_staging_beside(export_dir), export_dir, functools.partial(
            _write_saved_model, source, graph_def, var_defs, table_init_names, signature,
            names, as_text, f"export_saved_model: {checkpoint} to {export_dir}"
            if check_finite else None))
    finally:
        if isinstance(source, _SaverCheckpoint):
            source.close()
    return export_dir


# Rows of a table's exported embeddings read, checked and written at a time.
EXPORT_CHUNK_ROWS = 1 << 16


def _write_saved_model(source, graph_def, var_defs, table_init_names, signature, names,
                       as_text: bool, check: Optional[str], export_dir: str) -> None:
    """Writes the pruned serving graph with the checkpoint's values as a SavedModel;
    `check` (what is refused, for the message) refuses non-finite values before.

    The tables' embeddings never pass through the session: `_ChunkedSaver` writes them into
    the SavedModel's variables a chunk of rows at a time."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        variables = []
        for var_def in var_defs:
            variable = tf.compat.v1.Variable(variable_def=var_def, use_resource=True)
            graph.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, variable)
            if variable.op.name in names["trainable"]:
                graph.add_to_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, variable)
            variables.append(variable)
        main_op = tf.group(*[graph.get_operation_by_name(n) for n in table_init_names],
                           name=_INIT_OP_NAME)
        signature_defs = {
            name: tf.compat.v1.saved_model.predict_signature_def(
                {k: graph.get_tensor_by_name(n) for k, n in inputs.items()},
                {k: graph.get_tensor_by_name(n) for k, n in outputs.items()})
            for name, (inputs, outputs) in signature.items()}
        feeds, chunked, faults = _export_values(source, variables, names, check is not None)
        if check is not None:
            finite.raise_if_any(faults, check)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run([v.initializer for v in variables if v.op.name not in chunked], feeds)
            builder = tf.compat.v1.saved_model.Builder(export_dir)
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING],
                signature_def_map=signature_defs,
                main_op=main_op, clear_devices=True, strip_default_attrs=True,
                saver=_ChunkedSaver(variables, chunked))
            builder.save(as_text=as_text)


def _export_values(source, variables, names, check: bool):
    """(feeds of the variables the session holds, {embeddings variable: (rows, dim, chunks)}
    written by `_ChunkedSaver`, non-finite faults when `check`, the embeddings read a chunk
    at a time for it)."""
    feeds, chunked, faults = {}, {}, []
    for variable in variables:
        name = variable.op.name
        if name in names["serving"]:
            table, field = name[len(SERVING_SCOPE) + 1:].rsplit("/", 1)
            ids, chunks = source.table_chunks(table, EXPORT_CHUNK_ROWS)
            if field == _IDS:
                feeds[variable.initializer.inputs[1]] = ids
                continue
            if field == quantizer.SCALE_OFFSET:  # [K + 1, 2]: small, held whole
                feeds[variable.initializer.inputs[1]] = np.concatenate(
                    [quantizer.quantize_rows(rows)[1] for rows in chunks()]
                    + [np.zeros([1, 2], np.float32)])
                continue
            dim = source.table_dim(table)
            if check:
                for begin, rows in zip(range(0, len(ids), EXPORT_CHUNK_ROWS), chunks()):
                    faults += finite.table_faults(table, "embedding",
                                                  ids[begin:begin + len(rows)], rows)
            if field == quantizer.QUANTIZED:
                chunks = functools.partial(_codes, chunks)
            # The last row is the zero row that IDs not in the table look up.
            chunked[name] = (len(ids) + 1, dim, functools.partial(
                _with_zero_row, chunks, dim, variable.dtype.base_dtype.as_numpy_dtype))
            continue
        value = _dense_value(source, name, variable.shape)
        if check:
            faults += finite.dense_faults(name, value)
        feeds[variable.initializer.inputs[1]] = value
    return feeds, chunked, faults


def _with_zero_row(chunks, dim: int, dtype):
    for rows in chunks():
        yield np.asarray(rows, dtype)
    yield np.zeros([1, dim], dtype)


def _codes(chunks):
    """The uint8 codes of each chunk of float32 rows."""
    for rows in chunks():
        yield quantizer.quantize_rows(rows)[0]


class _ChunkedSaver(tf.compat.v1.train.Saver):
    """The SavedModel's saver: its restore is the default sharded Saver's, and its save
    writes the variables the session holds in one part, then each chunked variable's rows
    a chunk at a time as slices of the whole (one part each, in a graph of its own), and
    merges the parts into the checkpoint every TensorFlow reads whole."""

    def __init__(self, variables, chunked: Dict[str, Tuple[int, int, Callable]]):
        super().__init__(variables, sharded=True, allow_empty=True,
                         write_version=tf.compat.v1.train.SaverDef.V2)
        self._held = [v for v in variables if v.op.name not in chunked]
        self._chunked = chunked

    def save(self, sess, save_path, *args, **kwargs):  # noqa: D102 (tf Saver's)
        del args, kwargs
        held = dict(zip([v.op.name for v in self._held], sess.run(self._held)))
        graph = tf.Graph()
        with graph.as_default():
            prefix = tf.compat.v1.placeholder(tf.string, [])
            names = tf.compat.v1.placeholder(tf.string, [None])
            slices = tf.compat.v1.placeholder(tf.string, [None])
            # One save op per row dtype (float32 rows, an int8 export's uint8 codes).
            chunk = {dtype: tf.compat.v1.placeholder(dtype, [None, None])
                     for dtype in (np.float32, np.uint8)}
            save_chunk = {dtype: tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                                                   shape_and_slices=slices, tensors=[holder])
                          for dtype, holder in chunk.items()}
            parts = tf.compat.v1.placeholder(tf.string, [None])
            merge_parts = tf.raw_ops.MergeV2Checkpoints(
                checkpoint_prefixes=parts, destination_prefix=prefix, delete_old_dirs=True)
            with tf.compat.v1.Session(graph=graph) as chunks_session:
                written = [f"{save_path}_temp_part-0"]
                _write_checkpoint(written[0], held)
                for name, (rows, dim, chunks) in sorted(self._chunked.items()):
                    begin = 0
                    for values in chunks():
                        written.append(f"{save_path}_temp_part-{len(written)}")
                        chunks_session.run(save_chunk[values.dtype.type], {
                            prefix: written[-1], names: [name], chunk[values.dtype.type]: values,
                            slices: [f"{rows} {dim} {begin},{len(values)}:-"]})
                        begin += len(values)
                chunks_session.run(merge_parts, {parts: written, prefix: save_path})
        return save_path


def exported_tables(export_dir: str) -> Dict[str, sparse.TableArrays]:
    """The tables of an export: {name: {"ids": [K], "embeddings": [K, dim]}} (no zero row).

    A table of an int8 export also has its "quantized" codes (uint8 [K, dim]) and
    "scale_offset" (float32 [K, 2]); its "embeddings" are those dequantized as the serving
    graph does."""
    reader = tf.train.load_checkpoint(_variables_prefix(export_dir))
    names = reader.get_variable_to_shape_map()
    out = {}
    suffix = f"/{_IDS}"
    for name in names:
        if name.startswith(SERVING_SCOPE + "/") and name.endswith(suffix):
            table = name[len(SERVING_SCOPE) + 1: -len(suffix)]
            arrays = {"ids": reader.get_tensor(name)}
            if serving_variable_name(table, quantizer.QUANTIZED) in names:
                for field in (quantizer.QUANTIZED, quantizer.SCALE_OFFSET):
                    arrays[field] = reader.get_tensor(serving_variable_name(table, field))[:-1]
                arrays["embeddings"] = quantizer.dequantize_rows(
                    arrays[quantizer.QUANTIZED], arrays[quantizer.SCALE_OFFSET])
            else:
                arrays["embeddings"] = reader.get_tensor(
                    serving_variable_name(table, _EMBEDDINGS))[:-1]
            out[table] = arrays
    return out


def _variables_prefix(export_dir: str) -> str:
    prefix = os.path.join(export_dir, "variables", "variables")
    if not tf.io.gfile.exists(prefix + ".index"):
        raise ValueError(f"{export_dir!r} is not a SavedModel with variables "
                         f"(no {prefix}.index)")
    return prefix


def _write_checkpoint(prefix: str, tensors: Dict[str, np.ndarray]):
    graph = tf.Graph()
    with graph.as_default():
        names = sorted(tensors)
        holders = [tf.compat.v1.placeholder(tf.as_dtype(tensors[n].dtype)) for n in names]
        save = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                                 shape_and_slices=[""] * len(names), tensors=holders)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(save, dict(zip(holders, (tensors[n] for n in names))))


def _copy_tree(src: str, dst: str, skip: str):
    tf.io.gfile.makedirs(dst)
    for entry in tf.io.gfile.listdir(src):
        entry = entry.rstrip("/")
        source, target = os.path.join(src, entry), os.path.join(dst, entry)
        if source == skip:
            continue
        if tf.io.gfile.isdir(source):
            _copy_tree(source, target, skip)
        else:
            tf.io.gfile.copy(source, target)


def apply_delta(export_dir: str, delta: Mapping[str, Mapping[str, np.ndarray]],
                output_dir: str, dense: Optional[Mapping[str, np.ndarray]] = None,
                check_finite: bool = True) -> str:
    """Writes a new export: `export_dir` with a delta of its tables applied.

    The graph is copied as it is; only the variables change. Per table, the rows of the
    delta's `ids` replace (or are added to) the export's, the `removed` IDs are dropped and
    look up as zeros afterwards. An int8 export stays int8: the delta's float32 rows are
    quantized as `export_saved_model(..., quantize="int8")` quantizes them. Other tables
    and the dense variables are copied. The new export is written into a temporary folder
    beside `output_dir`, flushed to the disk and renamed into place when complete.

    Args:
        export_dir: an export from `export_saved_model` (or `apply_delta`).
        delta: {table_name: {"ids": int64 [D], "embeddings": float32 [D, dim],
            "removed": int64 [R]}}; each key of a table optional.
        output_dir: a directory that does not exist yet.
        dense: new values of dense variables of the export, by name (a delta checkpoint's
            `dense.npz`); names the export does not have are ignored (optimizer slots).
        check_finite: refuse a delta whose rows or applied dense values hold a NaN or an
            infinity (NonFiniteError, before anything is written).

    Returns:
        output_dir.

    Raises:
        NonFiniteError: with check_finite, a value of the delta is not finite.
        ValueError: a table of the delta not in the export, a malformed delta, a dense value
            of another shape, or output_dir exists.
    """
    if not isinstance(check_finite, bool):
        raise TypeError(f"apply_delta: check_finite must be True or False, got "
                        f"{check_finite!r}")
    if tf.io.gfile.exists(output_dir):
        raise ValueError(f"apply_delta: output_dir {output_dir!r} already exists")
    if not isinstance(delta, Mapping):
        raise TypeError(f"apply_delta: delta must be a dict table_name -> arrays, got "
                        f"{type(delta).__name__}")
    reader = tf.train.load_checkpoint(_variables_prefix(export_dir))
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    faults = _apply_table_deltas(export_dir, delta, tensors, check_finite)
    faults += _apply_dense(dense or {}, tensors, check_finite)
    finite.raise_if_any(faults, f"apply_delta: {export_dir} to {output_dir}")
    variables_dir = os.path.join(export_dir, "variables")

    def write(staging: str) -> None:
        _copy_tree(export_dir, staging, skip=variables_dir)
        tf.io.gfile.makedirs(os.path.join(staging, "variables"))
        _write_checkpoint(os.path.join(staging, "variables", "variables"), tensors)

    _publish(_staging_beside(output_dir), output_dir, write)
    return output_dir


def _apply_table_deltas(export_dir: str, delta, tensors: Dict[str, np.ndarray],
                        check_finite: bool) -> List[finite.Fault]:
    """Each table's delta applied to its serving variables in `tensors`; the non-finite
    rows of the deltas (with check_finite)."""
    tables = exported_tables(export_dir)
    faults = []
    for name, table_delta in delta.items():
        if name not in tables:
            raise ValueError(f"apply_delta: table {name!r} is not in export {export_dir!r}; "
                             f"tables there: {sorted(tables)}")
        if not isinstance(table_delta, Mapping):
            raise TypeError(f"apply_delta: delta[{name!r}] must be a dict of arrays")
        if check_finite and "embeddings" in table_delta:
            bad = finite.table_faults(name, "embedding", table_delta.get("ids", ()),
                                      table_delta["embeddings"])
            faults += bad
            if bad:
                continue  # the whole delta is refused: nothing to quantize
        if quantizer.QUANTIZED in tables[name]:
            _apply_quantized(name, tables[name], table_delta, tensors)
            continue
        updated = sparse.apply_delta_arrays(tables[name], table_delta, name)
        dim = updated["embeddings"].shape[1]
        tensors[serving_variable_name(name, _IDS)] = updated["ids"]
        tensors[serving_variable_name(name, _EMBEDDINGS)] = np.concatenate(
            [updated["embeddings"], np.zeros([1, dim], np.float32)])
    return faults


def _apply_quantized(name: str, table: sparse.TableArrays, delta, tensors) -> None:
    """A float32 delta applied to an int8 table's serving variables in `tensors`: its rows
    quantized, then merged with the table's codes and scales as one packed array each."""
    dim = table[quantizer.QUANTIZED].shape[1]
    base = {"ids": table["ids"], "embeddings": quantizer.pack(
        table[quantizer.QUANTIZED], table[quantizer.SCALE_OFFSET])}
    packed = dict(delta)
    if "embeddings" in delta:
        rows = np.asarray(delta["embeddings"], np.float32)
        if rows.ndim != 2 or rows.shape[1] != dim:
            raise ValueError(f"apply_delta: delta of table {name!r}: embeddings must be "
                             f"[{len(np.ravel(delta.get('ids', ())))}, {dim}], got "
                             f"{list(rows.shape)}")
        packed["embeddings"] = quantizer.pack(*quantizer.quantize_rows(rows))
    updated = sparse.apply_delta_arrays(base, packed, name)
    codes, scale_offset = quantizer.unpack(updated["embeddings"])
    tensors[serving_variable_name(name, _IDS)] = updated["ids"]
    tensors[serving_variable_name(name, quantizer.QUANTIZED)] = np.concatenate(
        [codes, np.zeros([1, dim], np.uint8)])
    tensors[serving_variable_name(name, quantizer.SCALE_OFFSET)] = np.concatenate(
        [scale_offset, np.zeros([1, 2], np.float32)])


def _apply_dense(dense: Mapping[str, np.ndarray], tensors: Dict[str, np.ndarray],
                 check_finite: bool) -> List[finite.Fault]:
    """The export's dense variables among `dense` replaced in `tensors` (other names, such as
    optimizer slots, ignored); the non-finite ones (with check_finite)."""
    faults = []
    for name, value in dense.items():
        if name in tensors and not name.startswith(SERVING_SCOPE + "/"):
            if np.shape(value) != tensors[name].shape:
                raise ValueError(f"apply_delta: dense variable {name!r} has shape "
                                 f"{list(tensors[name].shape)} in the export, "
                                 f"{list(np.shape(value))} in the delta")
            tensors[name] = np.asarray(value, tensors[name].dtype)
            if check_finite:
                faults += finite.dense_faults(name, tensors[name])
    return faults


__all__ = ["NonFiniteError", "in_serving_export", "serving_lookup", "export_saved_model",
           "apply_delta", "exported_tables", "serving_variable_name", "SERVING_SCOPE"]
