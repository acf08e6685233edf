"""WarmStart: initialise chosen mxrec tables and dense variables from earlier checkpoints.

What a warm start of a table loads, from a checkpoint of any mxrec graph: its device
rows (the variable `<table>`), its host state (`<table>/mxrec_host/*`: the ID map,
admission counts, last-seen times, free rows, threshold) and the slots of the hash
optimizers applied to it that the checkpoint holds (e.g. `<table>/LazyAdam`), and,
from a table with a host (or SSD) tier into a table with one, the host-tier rows of the
embedding and its slots. The table is replaced as a whole; tables not chosen are not
touched. A checkpoint with IDs in a host tier cannot warm-start a table without one (an
error says so).

Choosing what to load follows `tf.estimator.WarmStartSettings` (as in mx_rec):

* `vars_to_warm_start` a string: a table name, or a regular expression that matches
  table names in full (`"user_table"`, `"user_.*"`, `".*"`); for dense variables, TF's
  rule: a regex matched (`re.match`) against TRAINABLE_VARIABLES.
* a list of strings: each an exact table name or a full-match regex for tables; for
  dense variables each is matched against GLOBAL_VARIABLES (TF's rule for lists).
* a list of variables: those variables (a table's variable chooses the table).
* Table variables and their optimizer slots are never taken as dense variables.
* An entry that chooses nothing, or a chosen table or variable missing from its
  checkpoint, is an error naming it and the checkpoint.

Checkpoints of mxrec's own Saver (`mxrec.saver.checkpoint.Saver`): `ckpt_to_initialize_from`
may be its directory (the latest version) or one version folder (`<dir>/delta-000000000100`),
written by one process or by N ranks. The chain (full save and deltas) of every rank's files
folds into the whole table, and this process keeps the IDs it owns under its own rank count
(all of them on one process), with rows given anew, their admission counts and last-seen
times, and the slots of the table's hash optimizers that the checkpoint holds (other slots
keep their values); dense variables come from the last version. Tables of
init(use_dynamic_expansion=True) warm-start only from such checkpoints.

    >>> WarmStart("/ckpt/sharded", ".*").run(sess)   # saved by 4 ranks, loaded on 1 or on M

The multi-path form of mx_rec: `ckpt_to_initialize_from` a list of checkpoints and
`vars_to_warm_start` (and `var_name_to_prev_var_name`, when given) lists of the same
length; entries load in order, so later ones override earlier ones.

Session users:

    >>> ws = WarmStart(["./ws_1", "./ws_2"], [".*", ["user_table", "item_table"]])
    >>> sess.run(tf.compat.v1.global_variables_initializer()); ws.run(sess)
    >>> # or MonitoredTrainingSession(scaffold=tf.compat.v1.train.Scaffold(init_fn=ws.init_fn))
    >>> warm_start("./ws_1", "user_table", session=sess)   # build and run at once

Estimator users: `tf.estimator.Estimator(warm_start_from=...)` hands the settings to TF's
own warm start, which cannot take lists and knows nothing of host state. Wrap the model
function instead and do not pass `warm_start_from`:

    >>> settings = tf.estimator.WarmStartSettings(["./ws_1", "./ws_2"], [".*", "user_table"])
    >>> est = tf.estimator.Estimator(warm_start_model_fn(model_fn, settings), model_dir=...)

The wrapper adds the warm start to the TRAIN spec's `Scaffold.init_fn`. A Scaffold's
init_fn runs only when the session initialises its variables, never when it restores
them from model_dir; so, as with TF's warm start, an Estimator that resumes from its own
checkpoint ignores the settings. (A hook's after_create_session cannot tell the two apart,
and TF classes are not patched.) Run the warm start before the input pipeline's key stage
starts (prefetch); the Scaffold's init_fn does, as hooks start after it.
"""

import functools
import inspect
import re
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mxrec._lib import loader
from mxrec.core import dynamic, tiers
from mxrec.core.table import graph_tables
from mxrec.saver import checkpoint as saver_checkpoint
from mxrec.saver import fold, merge, sparse, stream, table_file
from mxrec.util import ranks

_HOST_DTYPES = {
    "keys": tf.int64, "rows": tf.int32, "counts": tf.float32, "last_seen": tf.int64,
    "free_rows": tf.int32, "meta": tf.int64, "threshold": tf.float64,
    "in_host": tf.int32, "lru_rows": tf.int32, "lru_ages": tf.int64,
    "tier_components": tf.string, "tier_present": tf.int64, "tier_values": tf.float32,
}


def _is_variable(value) -> bool:
    return isinstance(value, tf.Variable) or hasattr(value, "_mxrec_table")


def _as_entries(ckpt, vars_to_warm_start, vocab_info, prev_names):
    """[(checkpoint, vars, prev_names)], one per path."""
    if isinstance(ckpt, (list, tuple)):
        count = len(ckpt)
        if count == 0:
            raise ValueError("ckpt_to_initialize_from is an empty list")
        for label, value in (("vars_to_warm_start", vars_to_warm_start),
                             ("var_name_to_prev_var_name", prev_names),
                             ("var_name_to_vocab_info", vocab_info)):
            if value is not None and (not isinstance(value, (list, tuple)) or len(value) != count):
                raise ValueError(f"with {count} checkpoints in ckpt_to_initialize_from, {label} "
                                 f"must be a list of {count} entries (one per checkpoint), "
                                 f"got {value!r}")
        vars_list = list(vars_to_warm_start) if vars_to_warm_start is not None else [".*"] * count
        prev_list = list(prev_names) if prev_names is not None else [None] * count
        vocab_list = list(vocab_info) if vocab_info is not None else [None] * count
    else:
        ckpt, vars_list, prev_list, vocab_list = ([ckpt], [vars_to_warm_start], [prev_names],
                                                  [vocab_info])
    for path, vocab in zip(ckpt, vocab_list):
        if vocab:
            raise ValueError(f"warm start from {path!r}: var_name_to_vocab_info is not "
                             "supported by mxrec's warm start")
        if not isinstance(path, str) or not path:
            raise ValueError(f"ckpt_to_initialize_from entries must be paths, got {path!r}")
    for prev in prev_list:
        if prev is not None and not isinstance(prev, dict):
            raise TypeError(f"var_name_to_prev_var_name must be a dict, got {prev!r}")
    return list(zip(ckpt, vars_list, prev_list))


def _graph_tables(graph: tf.Graph) -> Dict[str, object]:
    """The graph's tables: those with a variable, and those of dynamic expansion (no
    variable, so not in the tables' variable collection)."""
    tables = sparse._graph_tables(graph)  # noqa: SLF001 (one module family)
    for name, table in graph_tables(graph).items():
        if isinstance(table, dynamic.DynamicTable) and name not in tables:
            tables[name] = table
    return tables


def _slots(table) -> Dict[str, tf.Variable]:
    """The table's optimizer slots, by variable name."""
    slots = {}
    for optimizer in table.optimizers:
        for slot_name in optimizer.get_slot_names():
            slot = optimizer.get_slot(table.variable, slot_name)
            if slot is not None:
                slots[slot.op.name] = slot
    return slots


def _matches_table(pattern: str, name: str) -> bool:
    return pattern == name or re.fullmatch(pattern, name) is not None


class _Entry:
    """What one checkpoint of a warm start loads."""

    def __init__(self, graph, tables, sparse_owned, checkpoint, vars_to_warm_start, prev_names):
        self.path = sparse.resolve_checkpoint(checkpoint)
        self.prev_names = dict(prev_names or {})
        self.tables: List[object] = []
        self.dense: List[tf.Variable] = []
        self._select(graph, tables, sparse_owned, vars_to_warm_start)
        reader = tf.train.load_checkpoint(self.path)
        self._shapes = reader.get_variable_to_shape_map()
        self._dtypes = reader.get_variable_to_dtype_map()
        for table in self.tables:
            if table.table_name in self.prev_names:
                raise ValueError(f"var_name_to_prev_var_name: table {table.table_name!r} cannot "
                                 "be renamed; mxrec tables warm-start from the same name")
        self.op = self._build(reader)

    def run(self, session) -> None:
        session.run(self.op)

    def _select(self, graph, tables, sparse_owned, vars_to_warm_start):
        def dense_matches(pattern, key):
            # isinstance: on several ranks GLOBAL_VARIABLES also holds the tables' saveables.
            return [v for v in graph.get_collection(key, scope=pattern)
                    if isinstance(v, tf.Variable) and v.op.name not in sparse_owned]

        chosen_tables, chosen_dense = {}, {}
        if vars_to_warm_start is None:
            patterns = []
        elif isinstance(vars_to_warm_start, str):
            patterns = [(vars_to_warm_start, tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)]
        elif isinstance(vars_to_warm_start, (list, tuple)) and all(
                isinstance(v, str) for v in vars_to_warm_start):
            patterns = [(v, tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) for v in vars_to_warm_start]
        elif isinstance(vars_to_warm_start, (list, tuple)) and all(
                _is_variable(v) for v in vars_to_warm_start):
            patterns = []
            for variable in vars_to_warm_start:
                table = getattr(variable, "_mxrec_table", None)
                if table is not None:
                    chosen_tables[table.table_name] = table
                elif variable.op.name not in sparse_owned:
                    chosen_dense[variable.op.name] = variable
        else:
            raise TypeError("vars_to_warm_start must be a str, a list of str or a list of "
                            f"variables, got {vars_to_warm_start!r}")
        for pattern, key in patterns:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"vars_to_warm_start: {pattern!r} is not a valid regular "
                                 f"expression: {err}") from None
            table_hits = [t for n, t in tables.items() if _matches_table(pattern, n)]
            dense_hits = dense_matches(pattern, key)
            if not table_hits and not dense_hits:
                raise ValueError(f"vars_to_warm_start entry {pattern!r} (checkpoint "
                                 f"{self.path!r}) matches no mxrec table and no variable; "
                                 f"tables: {sorted(tables)}")
            chosen_tables.update((t.table_name, t) for t in table_hits)
            chosen_dense.update((v.op.name, v) for v in dense_hits)
        self.tables = [chosen_tables[n] for n in sorted(chosen_tables)]
        self.dense = [chosen_dense[n] for n in sorted(chosen_dense)]

    def _check(self, name, shape, what):
        if name not in self._shapes:
            raise ValueError(f"warm start: {what} is not in checkpoint {self.path!r}")
        if list(self._shapes[name]) != list(shape):
            raise ValueError(f"warm start: {what} has shape {list(shape)} in the graph but "
                             f"{list(self._shapes[name])} in checkpoint {self.path!r}")

    def _build(self, reader):
        loads = []  # (checkpoint name, dtype, consumer(tensor) -> op)
        for table in self.tables:
            name = table.table_name
            if isinstance(table, dynamic.DynamicTable):
                raise ValueError(
                    f"warm start: table {name!r} (init(use_dynamic_expansion=True)) keeps its "
                    f"rows in a dynamic store; warm-start it from a checkpoint of mxrec's Saver "
                    f"(mxrec.saver.checkpoint.Saver), not from the TF checkpoint {self.path!r}")
            if sparse.host_tensor_name(name, "keys") not in self._shapes:
                raise ValueError(f"warm start: table {name!r} is not in checkpoint "
                                 f"{self.path!r} (no host state {name}/mxrec_host; tables "
                                 f"there: {sparse.checkpoint_tables(reader)})")
            self._check(name, table.variable.shape.as_list(), f"table {name!r}")
            loads.append((name, table.variable))
            for slot_name, slot in sorted(_slots(table).items()):
                if slot_name in self._shapes:
                    self._check(slot_name, slot.shape.as_list(), f"slot {slot_name!r}")
                    loads.append((slot_name, slot))
        for variable in self.dense:
            source = self.prev_names.get(variable.op.name, variable.op.name)
            self._check(source, variable.shape.as_list(), f"variable {source!r}")
            loads.append((source, variable))
        host = [(t, self._host_fields(reader, t)) for t in self.tables]
        names = [n for n, _ in loads] + [n for _, fields in host for n in fields]
        with tf.name_scope("mxrec_warm_start"), tf.device("/device:CPU:0"):
            restored = tf.raw_ops.RestoreV2(
                prefix=self.path, tensor_names=names, shape_and_slices=[""] * len(names),
                dtypes=[self._dtypes[n] for n in names])
        ops = [variable.assign(value).op for (_, variable), value in zip(loads, restored)]
        position = len(loads)
        for table, fields in host:
            values = restored[position:position + len(fields)]
            position += len(fields)
            fields = sparse.host_fields() + sparse.tier_fields()
            inputs = [v if _HOST_DTYPES[f] == tf.string else tf.cast(v, _HOST_DTYPES[f])
                      for v, f in zip(values, fields)]
            # A tiered checkpoint into a tiered table: the host-tier rows come along.
            import_op = (loader.op_library().mxrec_import_table_tiered
                         if len(inputs) > len(sparse.host_fields())
                         else loader.op_library().mxrec_import_table)
            with tf.device("/device:CPU:0"):
                ops.append(import_op(*inputs, table_key=table.table_key,
                                     name=f"mxrec_warm_start/{table.table_name}_host"))
        return tf.group(*ops, name="mxrec_warm_start/load")

    def _host_fields(self, reader, table) -> List[str]:
        """Checkpoint names of the host arrays to load into `table`."""
        name = table.table_name
        names = [sparse.host_tensor_name(name, f) for f in sparse.host_fields()]
        in_host = sparse.host_tensor_name(name, "in_host")
        if in_host not in self._shapes:
            return names  # a device-only table's checkpoint
        if tiers.is_tiered(table):
            return names + [sparse.host_tensor_name(name, f) for f in sparse.tier_fields()]
        host_ids = int(np.count_nonzero(reader.get_tensor(in_host)))
        if host_ids:
            raise ValueError(
                f"warm start: table {name!r} holds {host_ids} IDs in the host tier of checkpoint "
                f"{self.path!r}, but the table has no host tier now; give it "
                "host_vocabulary_size (create_table) to load them")
        return names


class _VersionsEntry(_Entry):
    """What one checkpoint of mxrec's own Saver loads: its directory (the latest version)
    or one version of it, written by any number of ranks.

    Every rank's files of the chain (full save, then its deltas) fold into the whole table,
    of which this process keeps the IDs it owns (all of them on one process) with rows given
    anew; what it loads per ID is what the Saver restores: record (count, last seen), row,
    and the slots of the table's optimizers that the checkpoint holds (others keep their
    initial values). Dense variables come from the last version's dense.npz.
    """

    def __init__(self, graph, tables, sparse_owned, checkpoint, location, vars_to_warm_start,
                 prev_names):  # pylint: disable=super-init-not-called
        self.path = checkpoint
        self.directory, self.step = location
        self.prev_names = dict(prev_names or {})
        self.tables, self.dense = [], []
        self._select(graph, tables, sparse_owned, vars_to_warm_start)
        for table in self.tables:
            if table.table_name in self.prev_names:
                raise ValueError(f"var_name_to_prev_var_name: table {table.table_name!r} cannot "
                                 "be renamed; mxrec tables warm-start from the same name")
        # The manifests and the dense values now: what is missing fails here, not at run.
        versions = merge.read_chain(self.directory, self.step)
        manifest, dense = versions[-1][1], versions[-1][2]["dense.npz"]
        where = f"checkpoint {self.path!r} (step {manifest['step']})"
        for table in self.tables:
            meta = manifest["tables"].get(table.table_name)
            if meta is None:
                raise ValueError(f"warm start: table {table.table_name!r} is not in {where}; "
                                 f"tables there: {sorted(manifest['tables'])}")
            if meta["dim"] != table.dim:
                raise ValueError(f"warm start: table {table.table_name!r} has dim {table.dim} "
                                 f"in the graph but {meta['dim']} in {where}")
        for variable in self.dense:
            source = self.prev_names.get(variable.op.name, variable.op.name)
            if source not in dense:
                raise ValueError(f"warm start: variable {source!r} is not in {where}")
            if list(dense[source].shape) != variable.shape.as_list():
                raise ValueError(f"warm start: variable {source!r} has shape "
                                 f"{variable.shape.as_list()} in the graph but "
                                 f"{list(dense[source].shape)} in {where}")
        # Built now, while the graph takes ops (a finalized graph is read and written whole).
        self._ios = [saver_checkpoint.table_io(table) for table in self.tables]

    def run(self, session) -> None:
        # Each table folded as columns and loaded a chunk of rows at a time (the Saver's
        # default checkpoint_memory_mb), every file checked before any is read.
        copies = stream.LocalCopies()
        try:
            versions = fold.open_chain(self.directory, self.step, copies)
            rank, size = ranks.get_rank_id(), ranks.get_rank_size()
            for io_ in self._ios:
                table = io_.table
                folded = saver_checkpoint.folded_table(table, versions, rank, size,
                                                       own_files=False,
                                                       directory=self.directory)
                rows = stream.chunk_rows(stream.DEFAULT_MEMORY_MB, table.dim,
                                         len(io_.state_names()))
                table_file.load(session, io_, folded, rows, missing_states="keep")
            dense = versions[-1].dense
        finally:
            copies.close()
        for variable in self.dense:
            source = self.prev_names.get(variable.op.name, variable.op.name)
            saver_checkpoint.load_variable(session, variable, dense[source])


def _entry(graph, tables, sparse_owned, checkpoint, vars_to_warm_start, prev_names) -> _Entry:
    location = merge.locate(checkpoint)
    if location is not None:
        return _VersionsEntry(graph, tables, sparse_owned, checkpoint, location,
                              vars_to_warm_start, prev_names)
    return _Entry(graph, tables, sparse_owned, checkpoint, vars_to_warm_start, prev_names)


class WarmStart:
    """A warm start built into a graph: run it once the variables are initialised.

    Args:
        ckpt_to_initialize_from: a checkpoint (prefix or directory), or a list of them.
        vars_to_warm_start: what to load (see the module docstring); a list of as many
            entries when ckpt_to_initialize_from is a list. Default ".*": every table and
            every trainable dense variable.
        var_name_to_vocab_info: not supported (None or empty).
        var_name_to_prev_var_name: {variable name: name in the checkpoint} for dense
            variables (a list of dicts for the list form); tables cannot be renamed.
        graph: the graph holding the tables and variables; the default graph if None.

    Attributes:
        entries: per checkpoint, (path, table names, dense variable names) it loads.

    Raises:
        ValueError: an entry chooses nothing, or a chosen table or variable is missing from
            its checkpoint or has another shape there (the message names both).

    Example:
        >>> ws = WarmStart(["./ws_1", "./ws_2", "./ws_3"],
        ...                [".*", ["user_table", "item_table"], "mlp_layer_w"])
        >>> ws.run(sess)
    """

    def __init__(self, ckpt_to_initialize_from, vars_to_warm_start=".*",
                 var_name_to_vocab_info=None, var_name_to_prev_var_name=None,
                 graph: Optional[tf.Graph] = None):
        graph = graph or tf.compat.v1.get_default_graph()
        tables = _graph_tables(graph)
        sparse_owned = set()
        for table in tables.values():
            if not isinstance(table, dynamic.DynamicTable):  # it has no variables
                sparse_owned.add(table.variable.op.name)
                sparse_owned.update(_slots(table))
        self._entries = []
        with graph.as_default():
            for path, chosen, prev in _as_entries(ckpt_to_initialize_from, vars_to_warm_start,
                                                  var_name_to_vocab_info,
                                                  var_name_to_prev_var_name):
                self._entries.append(_entry(graph, tables, sparse_owned, path, chosen, prev))
        self.graph = graph

    @property
    def entries(self):
        return [(e.path, [t.table_name for t in e.tables], [v.op.name for v in e.dense])
                for e in self._entries]

    def run(self, session: tf.compat.v1.Session) -> None:
        """Loads the checkpoints in order (later ones override earlier ones)."""
        if session.graph is not self.graph:
            raise ValueError("WarmStart.run: the session is not on the graph the warm start "
                             "was built in")
        for entry in self._entries:
            entry.run(session)

    def init_fn(self, scaffold, session) -> None:
        """`tf.compat.v1.train.Scaffold(init_fn=...)`: runs only when not restoring."""
        del scaffold
        self.run(session)


def warm_start(ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_vocab_info=None,
               var_name_to_prev_var_name=None,
               session: Optional[tf.compat.v1.Session] = None) -> WarmStart:
    """Builds a WarmStart in the session's graph and runs it now.

    Args:
        ckpt_to_initialize_from, vars_to_warm_start, var_name_to_vocab_info,
        var_name_to_prev_var_name: as `tf.estimator.WarmStartSettings`, or lists of them
            (see `WarmStart`).
        session: an initialised session; the default session if None. Its graph must not
            be finalized (the warm start adds its restore ops).

    Returns:
        The WarmStart (run it again in another session of the same graph if needed).

    Example:
        >>> sess.run(tf.compat.v1.global_variables_initializer())
        >>> warm_start("./warm_start", "user_table", session=sess)
    """
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise ValueError("warm_start: give a session (no default session is set)")
    ws = WarmStart(ckpt_to_initialize_from, vars_to_warm_start, var_name_to_vocab_info,
                   var_name_to_prev_var_name, graph=session.graph)
    ws.run(session)
    return ws


def _settings_fields(settings):
    # WarmStartSettings is a namedtuple: look for its fields before taking a tuple as paths.
    if hasattr(settings, "ckpt_to_initialize_from"):
        return (settings.ckpt_to_initialize_from, getattr(settings, "vars_to_warm_start", ".*"),
                getattr(settings, "var_name_to_vocab_info", None),
                getattr(settings, "var_name_to_prev_var_name", None))
    if isinstance(settings, (str, list, tuple)):
        return settings, ".*", None, None
    raise TypeError("warm_start_settings must be a tf.estimator.WarmStartSettings or a "
                    f"checkpoint path (or list of paths), got {settings!r}")


def from_settings(warm_start_settings, graph: Optional[tf.Graph] = None) -> WarmStart:
    """A WarmStart from `tf.estimator.WarmStartSettings` (single or list form) or a path."""
    ckpt, chosen, vocab, prev = _settings_fields(warm_start_settings)
    if not vocab:
        vocab = None
    return WarmStart(ckpt, chosen, vocab, prev or None, graph=graph)


def _model_fn_args(model_fn) -> Sequence[str]:
    target = model_fn.func if isinstance(model_fn, functools.partial) else model_fn
    names = list(inspect.signature(target).parameters)
    if isinstance(model_fn, functools.partial):
        names = [n for n in names if n not in model_fn.keywords][len(model_fn.args):]
    return names


def warm_start_model_fn(model_fn, warm_start_settings):
    """An Estimator model_fn that warm-starts its TRAIN graph from `warm_start_settings`.

    Args:
        model_fn: the Estimator model function (any of TF's allowed signatures).
        warm_start_settings: `tf.estimator.WarmStartSettings` (its fields may be lists, the
            multi-path form), or a checkpoint path.

    Returns:
        A model_fn(features, labels, mode, params, config) to give to the Estimator in place
        of model_fn, without warm_start_from.

    Example:
        >>> settings = tf.estimator.WarmStartSettings("./warm_start", "user_table")
        >>> est = tf.estimator.Estimator(warm_start_model_fn(model_fn, settings), model_dir)
    """
    _settings_fields(warm_start_settings)  # type errors now, not at train time
    accepted = set(_model_fn_args(model_fn))
    if "features" not in accepted:
        raise ValueError("warm_start_model_fn: model_fn must take a features argument")

    def wrapped(features, labels, mode, params, config):
        given = {"features": features, "labels": labels, "mode": mode, "params": params,
                 "config": config}
        spec = model_fn(**{k: v for k, v in given.items() if k in accepted})
        if mode != tf.estimator.ModeKeys.TRAIN:
            return spec
        ws = from_settings(warm_start_settings)
        previous = spec.scaffold

        def init_fn(scaffold, session):
            if previous is not None and previous.init_fn is not None:
                previous.init_fn(session)
            ws.init_fn(scaffold, session)

        scaffold = tf.compat.v1.train.Scaffold(init_fn=init_fn, copy_from_scaffold=previous)
        return spec._replace(scaffold=scaffold)

    return wrapped
