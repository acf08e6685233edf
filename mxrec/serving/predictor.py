"""A predictor that follows an export base and hot-reloads its versions.

Each version is served by a `ModelInstance`: the version's SavedModel imported into
a graph of its own, with each mxrec table's `StaticHashTable` replaced by a
`MutableHashTable` (same lookups, same zero row for unseen IDs), so that a delta
can be applied in place: changed rows are scattered, new IDs take free rows,
removed IDs are dropped, dense variables assigned. That costs in proportion to
the rows changed, not to the table (a table grows by doubling its capacity).

Atomic switch, double buffered: the `Predictor` keeps two instances, the one
serving and a standby one. A new full version is loaded into fresh instances; a
delta whose base is the serving version is applied to the standby (after its
pending deltas, and once the requests still using it have finished) and the two
swap. A request takes the serving instance once, under a lock, and runs on it
alone: it is answered entirely by the old or entirely by the new version.

A version is verified (`mxrec.serving.versions.verify`: every file against its
SHA-256), its graph checked against an allowlist of op types
(`mxrec.serving.allowed_ops`), its variables or delta values checked finite, and it
is loaded before it serves. A refused version is logged, kept in `status()`, and the
serving version stays. A refusal for a transient reason (a file still missing or
short: a copy under way; an I/O error) is looked at again at the next poll; any other
stands until the version's files change (their names, sizes and mtimes), so a damaged
version is not read again at every poll.

Example:
    >>> predictor = Predictor("/serving/ctr")
    >>> predictor.poll()                       # load the newest valid version
    >>> predictor.predict({"sparse": ids, "dense": dense})["prob"]
"""

import dataclasses
import io
import posixpath
import threading
import time
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple, Union

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from mxrec.export import quantize as quantizer
from mxrec.serving import allowed_ops, requests, versions
from mxrec.serving import runner as runner_module
from mxrec.serving.session_threads import SessionThreads

DELTA_FILE = "mxrec_delta.npz"
_SCOPE = "mxrec_serving"
_PREDICT_METHODS = ("tensorflow/serving/predict",)
_MAX_RUNNERS = 64


def _tensor_info(info) -> Dict:
    shape = info.tensor_shape
    return {"dtype": types_pb2.DataType.Name(info.dtype),
            "tensor_shape": {"dim": [{"size": str(d.size), "name": d.name} for d in shape.dim],
                             "unknown_rank": bool(shape.unknown_rank)},
            "name": info.name}


def write_delta(path: str, tables: Dict[str, Dict[str, np.ndarray]],
                dense: Dict[str, np.ndarray]) -> None:
    """Writes a delta file: per table ids/removed and its rows (embeddings, or an int8
    table's quantized/scale_offset), and dense values."""
    arrays = {}
    for name, delta in tables.items():
        for field in ("ids", "embeddings", "removed", quantizer.QUANTIZED,
                      quantizer.SCALE_OFFSET):
            if field in delta:
                arrays[f"table/{name}/{field}"] = np.asarray(delta[field])
    for name, value in dense.items():
        arrays[f"dense/{name}"] = np.asarray(value)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buffer.getvalue())


def read_delta(path: str):
    """(tables, dense) of a delta file."""
    with tf.io.gfile.GFile(path, "rb") as f:
        data = np.load(io.BytesIO(f.read()))
        tables: Dict[str, Dict[str, np.ndarray]] = {}
        dense = {}
        for key in data.files:
            kind, rest = key.split("/", 1)
            if kind == "table":
                name, field = rest.rsplit("/", 1)
                tables.setdefault(name, {})[field] = data[key]
            else:
                dense[rest] = data[key]
    return tables, dense


class NoVersionError(LookupError):
    """No model version is loaded (yet): nothing can answer."""


class _Rows:
    """One row variable of a table [capacity + 1, width]: float32 embeddings, or an int8
    export's uint8 codes and float32 (scale, offset) pairs. The last row is zeros."""

    def __init__(self, var: tf.Tensor, dtype: tf.DType, width: int, rows: tf.Tensor):
        self.dtype, self.width = dtype, width
        self.updates = tf.compat.v1.placeholder(dtype, [None, width])
        self.new = tf.compat.v1.placeholder(dtype, [None, width])
        self.scatter = tf.raw_ops.ResourceScatterUpdate(resource=var, indices=rows,
                                                        updates=self.updates)
        self.assign = tf.raw_ops.AssignVariableOp(resource=var, value=self.new,
                                                  validate_shape=False)
        self.read = tf.raw_ops.ReadVariableOp(resource=var, dtype=dtype)


def _row_fields(graph: tf.Graph, nodes: Dict, table: str) -> Dict[str, Tuple]:
    """{field: (variable, dtype, width)} of a table's rows in an export's graph."""
    def width(field: str) -> int:
        return nodes[f"{_SCOPE}/{table}/{field}_value"].attr["shape"].shape.dim[1].size

    def variable(field: str) -> tf.Tensor:
        return graph.get_tensor_by_name(f"{_SCOPE}/{table}/{field}:0")

    if f"{_SCOPE}/{table}/{quantizer.QUANTIZED}" in nodes:
        return {field: (variable(field), dtype, width(field)) for field, dtype in (
            (quantizer.QUANTIZED, tf.uint8), (quantizer.SCALE_OFFSET, tf.float32))}
    return {"embeddings": (variable("embeddings"), tf.float32, width("embeddings"))}


class _Table:
    """One table of an instance: a MutableHashTable ID -> row, rows in row variables
    (`_row_fields`), a delta's rows scattered into each."""

    def __init__(self, name: str, handle: tf.Tensor, ids_var: tf.Tensor, fields: Dict):
        self.name = name
        self.keys = tf.compat.v1.placeholder(tf.int64, [None])
        self.values = tf.compat.v1.placeholder(tf.int64, [None])
        self.rows = tf.compat.v1.placeholder(tf.int64, [None])
        self.new_ids = tf.compat.v1.placeholder(tf.int64, [None])
        self.fields = {field: _Rows(var, dtype, width, self.rows)
                       for field, (var, dtype, width) in fields.items()}
        self.dim = next(iter(fields.values()))[2]  # the embedding width (its codes')
        self.find = tf.raw_ops.LookupTableFindV2(table_handle=handle, keys=self.keys,
                                                 default_value=tf.constant(-1, tf.int64))
        self.insert = tf.raw_ops.LookupTableInsertV2(table_handle=handle, keys=self.keys,
                                                     values=self.values)
        self.remove = tf.raw_ops.LookupTableRemoveV2(table_handle=handle, keys=self.keys)
        self.assign_ids = tf.raw_ops.AssignVariableOp(resource=ids_var, value=self.new_ids,
                                                      validate_shape=False)
        self.read_ids = tf.raw_ops.ReadVariableOp(resource=ids_var, dtype=tf.int64)
        self.capacity = 0
        self.free: List[int] = []

    def load(self, sess):
        """Fills the hash table from the restored variables (row i holds ids[i])."""
        ids = sess.run(self.read_ids)
        self.capacity = len(ids)
        self.free = []
        if len(ids):
            sess.run(self.insert, {self.keys: ids, self.values: np.arange(len(ids))})
        # Headroom, so that deltas add IDs without copying the table (loading copies it anyway)
        self._grow(sess, len(ids) // 4 + 1024, double=False)

    def _grow(self, sess, needed: int, double: bool = True):
        capacity = max(2 * self.capacity if double else 0, self.capacity + needed, 16)
        # The ids variable's size is the zero row's index; its contents are not read.
        feed = {self.new_ids: np.zeros([capacity], np.int64)}
        for rows in self.fields.values():
            grown = np.zeros([capacity + 1, rows.width], rows.dtype.as_numpy_dtype)
            grown[:self.capacity] = sess.run(rows.read)[:self.capacity]  # last row: zeros
            feed[rows.new] = grown
        sess.run([self.assign_ids] + [rows.assign for rows in self.fields.values()], feed)
        self.free.extend(range(capacity - 1, self.capacity - 1, -1))
        self.capacity = capacity

    def apply(self, sess, delta: Dict[str, np.ndarray]):
        removed = np.asarray(delta.get("removed", np.zeros([0], np.int64)), np.int64)
        ids = np.asarray(delta.get("ids", np.zeros([0], np.int64)), np.int64)
        if len(removed):
            rows = sess.run(self.find, {self.keys: removed})
            present = rows >= 0
            sess.run(self.remove, {self.keys: removed[present]})
            self.free.extend(rows[present].tolist())
        if not len(ids):
            return
        rows = sess.run(self.find, {self.keys: ids})
        new = rows < 0
        count = int(new.sum())
        if count > len(self.free):
            self._grow(sess, count - len(self.free))
        if count:
            taken = np.array([self.free.pop() for _ in range(count)], np.int64)
            rows[new] = taken
            sess.run(self.insert, {self.keys: ids[new], self.values: taken})
        feed = {self.rows: rows}
        for field, variable in self.fields.items():
            feed[variable.updates] = np.asarray(delta[field], variable.dtype.as_numpy_dtype
                                                ).reshape(len(ids), variable.width)
        sess.run([variable.scatter for variable in self.fields.values()], feed)


def _first_bad(values: np.ndarray) -> Optional[int]:
    """The flat index of the first value that is not finite (None: all are)."""
    bad = ~np.isfinite(values)
    return int(np.argmax(bad.reshape(-1))) if bad.any() else None


class ModelInstance:
    """One loaded model (a version plus the deltas applied to it since).

    A version is refused (versions.DamagedVersionError) when its graph holds an op type
    outside `ops` (allowed_ops.ForbiddenOpError), or when a variable (a table's rows, a
    dense weight) holds a value that is not finite.
    """

    def __init__(self, export_dir: str, signature: str = "serving_default",
                 threads: Union[int, SessionThreads] = 0,
                 ops: FrozenSet[str] = allowed_ops.ALLOWED_OPS):
        self.version = int(posixpath.basename(export_dir.rstrip("/")))
        self.readers = 0
        meta = self._read_meta(export_dir, signature)
        allowed_ops.check_graph(meta, export_dir, ops)
        self.graph = tf.Graph()
        with self.graph.as_default():
            saver = self._import(meta)
            self._bind_signatures(signature)
            self.session = tf.compat.v1.Session(graph=self.graph,
                                                config=SessionThreads.of(threads).config())
            try:
                saver.restore(self.session, posixpath.join(export_dir, "variables",
                                                           "variables"))
                self._check_finite(export_dir)
                for table in self.tables.values():
                    table.load(self.session)
            except BaseException:
                self.session.close()
                raise
            self.graph.finalize()
        self._runners: Dict[Tuple[str, Tuple[str, ...]], runner_module.SignatureRunner] = {}

    def _read_meta(self, export_dir: str, signature: str):
        proto = saved_model_pb2.SavedModel()
        with tf.io.gfile.GFile(posixpath.join(export_dir, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        meta = next((m for m in proto.meta_graphs
                     if tf.saved_model.SERVING in m.meta_info_def.tags), None)
        if meta is None or signature not in meta.signature_def:
            raise versions.DamagedVersionError(f"{export_dir}: no serving signature "
                                               f"{signature!r}")
        # Every predict signature is served; `signature` is the one requests get by default.
        self.signature_defs = {name: sig for name, sig in meta.signature_def.items()
                               if sig.method_name in _PREDICT_METHODS or name == signature}
        self.default_signature = signature
        return meta

    def _import(self, meta):
        """Imports the graph with each export table mapped onto a MutableHashTable; returns
        the saver."""
        nodes = {n.name: n for n in meta.graph_def.node}
        static = [n for n in nodes.values() if n.op == "HashTableV2"
                  and n.name.startswith(_SCOPE + "/") and n.name.endswith("/id_to_index")]
        handles = {n.name: tf.raw_ops.MutableHashTableV2(
            key_dtype=tf.int64, value_dtype=tf.int64, name=n.name.replace("/", "_") + "_mut")
            for n in static}
        saver = tf.compat.v1.train.import_meta_graph(
            meta, clear_devices=True, input_map={f"{k}:0": v for k, v in handles.items()})
        self.tables: Dict[str, _Table] = {}
        for node_name, handle in handles.items():
            table = node_name[len(_SCOPE) + 1: -len("/id_to_index")]
            ids = self.graph.get_tensor_by_name(f"{_SCOPE}/{table}/ids:0")
            self.tables[table] = _Table(table, handle, ids,
                                        _row_fields(self.graph, nodes, table))
        self.dense = {}
        self._reads = {}
        for var in self.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
            name = var.op.name
            if var.dtype.base_dtype.is_floating:
                self._reads[name] = tf.raw_ops.ReadVariableOp(resource=var.handle,
                                                              dtype=var.dtype.base_dtype)
            if not name.startswith(_SCOPE + "/"):
                holder = tf.compat.v1.placeholder(var.dtype.base_dtype)
                self.dense[name] = (holder, tf.raw_ops.AssignVariableOp(
                    resource=var.handle, value=holder, validate_shape=False), var.shape)
        return saver

    def _bind_signatures(self, signature: str):
        self.signatures = {}
        for name, sig in self.signature_defs.items():
            self.signatures[name] = (
                {k: self.graph.get_tensor_by_name(v.name) for k, v in sig.inputs.items()},
                {k: self.graph.get_tensor_by_name(v.name) for k, v in sig.outputs.items()})
        self.inputs, self.outputs = self.signatures[signature]
        self.input_specs = {
            name: {k: requests.InputSpec(k, t.dtype.as_numpy_dtype if t.dtype != tf.string
                                         else object, None if t.shape.rank is None
                                         else t.shape.as_list())
                   for k, t in inputs.items()}
            for name, (inputs, _) in self.signatures.items()}

    def _check_finite(self, export_dir: str):
        """Refuses restored variables holding NaN or Infinity, naming the first one."""
        values = self.session.run(self._reads)
        for name, value in sorted(values.items()):
            index = _first_bad(value)
            if index is None:
                continue
            count = int((~np.isfinite(value)).sum())
            table = name[len(_SCOPE) + 1:].rsplit("/", 1)[0] if name.startswith(
                _SCOPE + "/") else None
            if table in self.tables and value.ndim == 2:
                row = index // value.shape[1]
                ids = self.session.run(self.tables[table].read_ids)
                at = f"row {row} (ID {ids[row]})" if row < len(ids) else f"row {row}"
                raise NonFiniteVersionError(f"{export_dir}: table {table!r} has {count} "
                                            f"values that are not finite, first in {at}")
            raise NonFiniteVersionError(f"{export_dir}: variable {name!r} has {count} values "
                                        f"that are not finite (first at flat index {index})")

    def predict(self, inputs: Dict[str, np.ndarray], signature: Optional[str] = None,
                timeout: Optional[float] = None,
                outputs: Optional[Iterable[str]] = None) -> Dict[str, np.ndarray]:
        """Runs a signature (the default one when None) on inputs {name: array}; the run is
        cancelled with tf.errors.DeadlineExceededError after `timeout` seconds (None: no
        limit). `outputs` names the outputs to compute (None or empty: all of them; TF
        Serving's output_filter)."""
        name = self.default_signature if signature is None else signature
        if name not in self.signatures:
            raise ValueError(f"unknown signature {name!r}; this model has "
                             f"{sorted(self.signatures)}")
        wanted, every = self.signatures[name]
        chosen = tuple(sorted(set(outputs))) if outputs else ()
        runner = self._runners.get((name, chosen))
        if runner is None:
            runner = runner_module.SignatureRunner(self.session, wanted,
                                                   _chosen(every, chosen))
            # Kept per signature and output filter, up to a bound that clients naming
            # every subset of many outputs cannot pass.
            if len(self._runners) < _MAX_RUNNERS:
                self._runners[(name, chosen)] = runner
        if inputs.keys() != wanted.keys():
            missing = sorted(set(wanted) - set(inputs))
            unknown = sorted(set(inputs) - set(wanted))
            raise ValueError(f"inputs must be {sorted(wanted)}; missing {missing}, "
                             f"unknown {unknown}")
        return runner(inputs, timeout)

    def metadata(self) -> Dict:
        """TF Serving's signature-def map: {"signature_def": {name: {inputs, outputs,
        method_name}}}, each tensor with its dtype, shape and name."""
        return {"signature_def": {name: {
            "inputs": {k: _tensor_info(v) for k, v in sorted(sig.inputs.items())},
            "outputs": {k: _tensor_info(v) for k, v in sorted(sig.outputs.items())},
            "method_name": sig.method_name} for name, sig in sorted(self.signature_defs.items())}}

    def check_delta(self, version: int, tables: Dict, dense: Dict) -> None:
        """Refuses a delta this instance cannot take whole: unknown tables, arrays of the
        wrong shape or dtype, values that are not finite. Nothing is changed.

        Raises:
            versions.DamagedVersionError: naming the table or variable (NonFiniteVersionError
                for values that are not finite).
        """
        unknown = sorted(set(tables) - set(self.tables))
        if unknown:
            raise versions.DamagedVersionError(f"delta {version} names tables {unknown} the "
                                               f"model does not have ({sorted(self.tables)})")
        for name, delta in sorted(tables.items()):
            _check_table_delta(version, name, self.tables[name], delta)
        for name, value in sorted(dense.items()):
            if name not in self.dense:
                continue  # optimizer slots and other training state: not served
            value = np.asarray(value)
            shape = self.dense[name][2]
            if not shape.is_compatible_with(value.shape):
                raise versions.DamagedVersionError(
                    f"delta {version}: dense variable {name!r} has shape {list(value.shape)}, "
                    f"the model's is {shape}")
            if value.dtype.kind == "f" and _first_bad(value) is not None:
                raise NonFiniteVersionError(
                    f"delta {version}: dense variable {name!r} has "
                    f"{int((~np.isfinite(value)).sum())} values that are not finite")

    def apply_delta(self, version: int, tables: Dict, dense: Dict) -> None:
        """Applies a delta in place, after `check_delta`."""
        self.check_delta(version, tables, dense)
        for name, delta in tables.items():
            self.tables[name].apply(self.session, delta)
        for name, value in dense.items():
            if name in self.dense:
                holder, assign, _ = self.dense[name]
                self.session.run(assign, {holder: value})
        self.version = version

    def close(self):
        self.session.close()


def _check_table_delta(version: int, name: str, table: _Table, delta: Dict) -> None:
    ids = np.asarray(delta.get("ids", np.zeros([0], np.int64)))
    removed = np.asarray(delta.get("removed", np.zeros([0], np.int64)))
    for field, array in (("ids", ids), ("removed", removed)):
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise versions.DamagedVersionError(
                f"delta {version}: table {name!r}: {field} must be integers [N], got "
                f"{array.dtype} {list(array.shape)}")
    # A delta's rows are in the form of the version it builds on (float32, or int8 codes).
    unknown = sorted(set(delta) - {"ids", "removed"} - set(table.fields))
    if unknown:
        raise versions.DamagedVersionError(
            f"delta {version}: table {name!r} is served with rows {sorted(table.fields)}; "
            f"the delta has {unknown} (a delta of another serving_quantize form)")
    for field, rows in table.fields.items():
        _check_rows(version, name, field, rows, ids, delta)


def _check_rows(version: int, name: str, field: str, rows: _Rows, ids: np.ndarray,
                delta: Dict) -> None:
    """A delta's rows of one row variable: [len(ids), width] of its kind, finite floats,
    codes of 0..255."""
    values = np.asarray(delta.get(field, np.zeros([0, rows.width], rows.dtype.as_numpy_dtype)))
    kind = "floats" if rows.dtype.is_floating else "integers 0..255"
    if values.shape != (len(ids), rows.width) or values.dtype.kind != (
            "f" if rows.dtype.is_floating else "u"):
        raise versions.DamagedVersionError(
            f"delta {version}: table {name!r}: {field} must be {kind} [{len(ids)}, "
            f"{rows.width}] (one row per ID), got {values.dtype} {list(values.shape)}")
    index = _first_bad(values) if rows.dtype.is_floating else None
    if index is not None:
        raise NonFiniteVersionError(
            f"delta {version}: table {name!r} has {int((~np.isfinite(values)).sum())} values "
            f"that are not finite, first in the row of ID {ids[index // rows.width]}")


def _chosen(every: Dict[str, tf.Tensor], names: Optional[Iterable[str]]) -> Dict:
    names = sorted(set(names or ()))
    unknown = [n for n in names if n not in every]
    if unknown:
        raise requests.RequestError(f"output tensor alias not found in signature: "
                                    f"{unknown[0]}; the outputs are {sorted(every)}")
    return {n: every[n] for n in names} if names else every


class NonFiniteVersionError(versions.DamagedVersionError):
    """A version (or delta) holding NaN or Infinity in a table row or a dense weight."""


class _BaseNotServingError(versions.DamagedVersionError):
    """A delta without a SavedModel whose base is not the serving version: it may apply
    once the serving version changes (to its base), so it is looked at again then."""


# Refusals worth another look at the next poll: a copy under way, an I/O error, a file
# that went away. Any other refusal stands until the version's files change (or, for a
# delta waiting for its base, the serving version).
_TRANSIENT = (versions.IncompleteVersionError, OSError,
              tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.NotFoundError,
              tf.errors.DeadlineExceededError, tf.errors.PermissionDeniedError,
              tf.errors.CancelledError)
_REFUSABLE = (versions.DamagedVersionError, tf.errors.OpError, ValueError, OSError, KeyError)


@dataclasses.dataclass
class _Refusal:
    message: str
    transient: bool
    code: str  # TF Serving's error_code in the model status
    fingerprint: Optional[Tuple] = None  # the files when refused (damaged versions)
    serving: Optional[int] = None  # a waiting delta: the serving version when refused


class _Held:
    """A request's hold on the serving instance (`Predictor.serving`): a class of its own,
    not a generator, as it is taken and released on every request."""

    __slots__ = ("predictor", "instance")

    def __init__(self, predictor: "Predictor"):
        self.predictor = predictor
        self.instance: Optional[ModelInstance] = None

    def __enter__(self) -> ModelInstance:
        lock = self.predictor._lock  # pylint: disable=protected-access (its owner's lock)
        with lock:
            instance = self.predictor._current  # pylint: disable=protected-access
            if instance is None:
                raise NoVersionError("no model version is loaded")
            instance.readers += 1
        self.instance = instance
        return instance

    def __exit__(self, *_):
        lock = self.predictor._lock  # pylint: disable=protected-access
        with lock:
            self.instance.readers -= 1
            if not self.instance.readers:  # only a switch waits, for the count to reach 0
                lock.notify_all()
        return False


class Predictor:
    """Serves the newest valid version of an export base; see the module docstring.

    Args:
        export_base: the folder of numeric version folders.
        signature: the SavedModel signature to serve.
        threads: TensorFlow's threads for each version's session: a SessionThreads
            (TF Serving's --tensorflow_intra_op_parallelism and
            --tensorflow_inter_op_parallelism), or an integer for both (0: TensorFlow's
            defaults).
        allow_ops: op types to accept beyond `allowed_ops.ALLOWED_OPS` (a custom model's);
            no op that does I/O.

    Raises:
        ValueError: `allow_ops` names no TensorFlow op, or one that does I/O; a thread
            setting out of range (named).
    """

    def __init__(self, export_base: str, signature: str = "serving_default",
                 threads: Union[int, SessionThreads] = 0, allow_ops: Iterable[str] = ()):
        self.export_base = export_base
        self.signature = signature
        self.threads = SessionThreads.of(threads)
        self.ops = allowed_ops.allowed(allow_ops)
        self._lock = threading.Condition()
        self._current: Optional[ModelInstance] = None
        self._standby: Optional[ModelInstance] = None
        self._pending: List = []  # deltas the standby still needs: (version, tables, dense)
        self._refusals: Dict[int, _Refusal] = {}
        self._loading: Optional[int] = None
        self.loaded: List[int] = []

    # ---------------------------------------------------------------- requests

    @property
    def version(self) -> Optional[int]:
        current = self._current
        return None if current is None else current.version

    @property
    def refused(self) -> Dict[int, str]:
        """{version: why} of the versions refused (and not loaded since)."""
        with self._lock:
            return {v: r.message for v, r in self._refusals.items()}

    def serving(self) -> "_Held":
        """The serving instance, held (a context manager): a version switch waits until it
        is released.

        Raises:
            NoVersionError: (on entering) no version is loaded.
        """
        return _Held(self)

    def predict(self, inputs: Dict[str, np.ndarray], signature: Optional[str] = None,
                timeout: Optional[float] = None):
        """(outputs, version) from the serving instance, all of one version."""
        with self.serving() as instance:
            return instance.predict(inputs, signature, timeout), instance.version

    def follow(self, interval: float, stop: threading.Event) -> None:
        """Polls the export base every `interval` seconds until `stop` is set (a server's
        background thread); a failed poll is logged and the next one tried."""
        while not stop.is_set():
            try:
                self.poll()
            except Exception as error:  # noqa: BLE001 (a bad poll must not end serving)
                logging.error("predictor: poll failed: %s", error)
            stop.wait(interval)

    # ---------------------------------------------------------------- versions

    def _dir(self, version: int) -> str:
        return posixpath.join(self.export_base, str(version))

    def _instance(self, version: int) -> ModelInstance:
        return ModelInstance(self._dir(version), self.signature, self.threads, self.ops)

    def _load_full(self, version: int) -> None:
        fresh = self._instance(version)
        try:
            standby = self._instance(version)
        except BaseException:
            fresh.close()
            raise
        self._swap(fresh, standby, [])

    def _swap(self, serving: ModelInstance, standby: ModelInstance, pending: List):
        with self._lock:
            old = [i for i in (self._current, self._standby)
                   if i is not None and i is not serving and i is not standby]
            self._current, self._standby, self._pending = serving, standby, pending
            for instance in old:  # close once no request uses it
                while instance.readers:
                    self._lock.wait()
        for instance in old:
            instance.close()

    def _apply_delta(self, version: int) -> None:
        tables, dense = read_delta(posixpath.join(self._dir(version), DELTA_FILE))
        standby = self._standby
        # Checked before the standby changes: a refused delta leaves both instances whole,
        # so the next good delta still applies in place.
        standby.check_delta(version, tables, dense)
        with self._lock:  # requests that took it while it was serving finish first
            while standby.readers:
                self._lock.wait()
        try:
            for pending_version, pending_tables, pending_dense in self._pending:
                standby.apply_delta(pending_version, pending_tables, pending_dense)
            standby.apply_delta(version, tables, dense)
        except BaseException:
            # Half applied: the standby is dropped; the next version must be a SavedModel.
            with self._lock:
                self._standby = None
            standby.close()
            raise
        previous = self._current
        with self._lock:
            self._current, self._standby = standby, previous
            self._pending = [(version, tables, dense)]

    def _load(self, version: int) -> str:
        """Verifies and loads a version; returns how ("delta in place", "SavedModel")."""
        folder = self._dir(version)
        manifest = versions.verify(folder)
        current = self.version
        in_place = (manifest.get("kind") == "delta" and manifest.get("base") == current
                    and self._standby is not None and DELTA_FILE in manifest["files"])
        if not in_place and "saved_model.pb" not in manifest["files"]:
            why = (f"version {current} is serving" if manifest.get("base") != current else
                   "the standby instance was dropped after a delta failed half way")
            raise _BaseNotServingError(
                f"version {version} is a delta of version {manifest.get('base')} without a "
                f"SavedModel, and {why}")
        if in_place:
            self._apply_delta(version)
            return f"delta of version {current}, applied in place"
        self._load_full(version)
        return f"SavedModel of a {manifest.get('kind', 'full')} version, loaded whole"

    def _refuse(self, version: int, error: Exception, previous: Optional[int]) -> None:
        transient = isinstance(error, _TRANSIENT)
        message = f"{type(error).__name__}: {error}"
        waits = isinstance(error, _BaseNotServingError)
        code = ("UNAVAILABLE" if transient else "FAILED_PRECONDITION" if waits else
                "PERMISSION_DENIED" if isinstance(error, allowed_ops.ForbiddenOpError)
                else "DATA_LOSS")
        try:
            files = None if transient else versions.fingerprint(self._dir(version))
        except (tf.errors.OpError, OSError):
            files = None  # looked at again next time
        with self._lock:
            before = self._refusals.get(version)
            self._refusals[version] = _Refusal(message, transient, code, files,
                                               self.version if waits else None)
        if before is not None and before.message == message:
            return  # said once; a version retried at every poll does not flood the log
        logging.error("predictor: refused version %d (%s): %s; %s", version,
                      "nothing serves yet" if previous is None
                      else f"version {previous} keeps serving", error,
                      "looked at again at the next poll" if transient else
                      "looked at again when the serving version changes" if waits
                      else "refused until its files change")

    def _try(self, version: int) -> bool:
        start = time.monotonic()
        previous = self.version
        with self._lock:
            self._loading = version
        try:
            how = self._load(version)
        except _REFUSABLE as error:
            self._refuse(version, error, previous)
            return False
        finally:
            with self._lock:
                self._loading = None
        with self._lock:
            self._refusals.pop(version, None)
        self.loaded.append(version)
        logging.info("predictor: serving version %d (was %s): %s in %.3f s", version,
                     previous, how, time.monotonic() - start)
        return True

    def _worth_trying(self, version: int) -> bool:
        """A version never refused, refused for a transient reason, or whose files changed
        since it was refused (sizes and mtimes: nothing is read)."""
        refusal = self._refusals.get(version)
        if refusal is None or refusal.transient or refusal.fingerprint is None:
            return True
        if refusal.code == "FAILED_PRECONDITION" and refusal.serving != self.version:
            return True  # a delta that waited for its base
        try:
            return versions.fingerprint(self._dir(version)) != refusal.fingerprint
        except (tf.errors.OpError, OSError):
            return False  # gone or unreadable: the next listing says which

    def poll(self) -> Optional[int]:
        """Loads versions newer than the serving one, oldest first (so deltas chain);
        refuses damaged ones. Returns the serving version.

        With nothing serving yet, it starts from the newest version with a SavedModel that
        loads (a refused one is skipped and the one before it tried, at once), then chains
        the versions after it. A version refused for a transient reason (a copy under way,
        an I/O error) is tried again at each poll; any other refusal stands until the
        version's files change."""
        listed = versions.list_versions(self.export_base)
        with self._lock:
            for version in set(self._refusals) - set(listed):
                del self._refusals[version]  # removed: nothing to report any more
        if self.version is None:
            with_model = [v for v in listed if tf.io.gfile.exists(
                posixpath.join(self._dir(v), "saved_model.pb"))]
            for start in reversed(with_model):
                if self._worth_trying(start) and self._try(start):
                    break
            if self.version is None:
                return None
        for version in listed:
            if version > self.version and self._worth_trying(version):
                self._try(version)
        return self.version

    def status(self) -> Dict:
        """TF Serving's GetModelStatus shape: the serving version AVAILABLE, a version being
        loaded LOADING, refused ones END with their error (UNAVAILABLE: looked at again at
        the next poll; FAILED_PRECONDITION: a delta waiting for its base to serve;
        DATA_LOSS, PERMISSION_DENIED: refused until its files change)."""
        ok = {"error_code": "OK", "error_message": ""}
        with self._lock:
            current, loading = self.version, self._loading
            refusals = sorted(self._refusals.items())
        out = []
        if current is not None:
            out.append({"version": str(current), "state": "AVAILABLE", "status": dict(ok)})
        if loading is not None:
            out.append({"version": str(loading), "state": "LOADING", "status": dict(ok)})
        for version, refusal in refusals:
            if version != loading:
                out.append({"version": str(version), "state": "END", "status": {
                    "error_code": refusal.code, "error_message": refusal.message}})
        return {"model_version_status": out}

    def close(self):
        for instance in (self._current, self._standby):
            if instance is not None:
                instance.close()
        self._current = self._standby = None


__all__ = ["Predictor", "ModelInstance", "NoVersionError", "NonFiniteVersionError",
           "write_delta", "read_delta", "DELTA_FILE"]
