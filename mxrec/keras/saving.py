"""mxrec's full and delta checkpoints (the Session path's format) for mxrec.keras models.

`KerasSaver(directory, model, optimizer)` is `mxrec.saver.checkpoint.Saver` with the Keras
model's variables in place of a graph's: the same versions (`full-<step>/`, `delta-<step>/`,
one manifest written last, files verified by size and SHA-256 on reading, a save made
visible by one rename), the same table files (host records, device rows of admitted IDs and
their optimizer slots) and the same `dense.npz`. So a Keras model continues from a
checkpoint of the Session path, a Session graph from one of a Keras model, and WarmStart
reads either.

What the names in a version are:

- a table: its name (the Embedding's); its states `embedding` and `<optimizer name>/<slot>`
  (`Adagrad/accumulator`, `LazyAdam/m`, `LazyAdam/v`: the Session path's hash optimizers of
  the same default names);
- dense variables (`dense.npz`): the model's weights (tables left out) and the optimizer's
  variables, by their Keras names (Keras 3's `variable.path`, Keras 2's `variable.name`
  without `:0`); the optimizer's `iterations` as `global_step` (the Session path's global
  step); LazyAdam's table beta powers as `beta1_power` / `beta2_power` (TF1 Adam's). Keras 3's
  learning-rate variable and Keras 2 SGD's momentum variables (unused: momentum is refused)
  are not saved (the Session path saves none: the optimizer keeps the
  rate it was made with). `dense_names={keras name: checkpoint name}` renames, e.g. to the
  names of a Session graph's variables.

Restoring needs every dense variable's name in the checkpoint (extra names are ignored, as
the Session Saver ignores them); a checkpoint without `global_step` sets `iterations` to the
version's step.

    saver = KerasSaver("/ckpt", model, model.optimizer)
    saver.save(kind="full")          # at optimizer.iterations
    saver.save(kind="delta")
    KerasSaver("/ckpt", model2, opt2).restore()   # full + deltas
"""

import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from mxrec.distributed import communication
from mxrec.keras import _compat
from mxrec.keras.layers import embedding_layers
from mxrec.saver import checkpoint as saver_checkpoint
from mxrec.saver import fold, merge, stream, table_file
from mxrec.saver import manifest as manifest_io
from mxrec.saver.manifest import CheckpointError
from mxrec.util.config import get_config_initializer

GLOBAL_STEP = "global_step"


class _KerasTableIO:
    """Reads and writes one Keras table's rows and slot rows (the interface of
    mxrec.saver.checkpoint's _TableIO, eagerly; `session` is unused)."""

    variables_in_graph = True

    def __init__(self, table, optimizer):
        self.table = table
        self.slots: Dict[str, tf.Variable] = {}
        if optimizer is not None:
            # Made now when the optimizer has not applied yet: a restore writes their rows.
            for slot_name, slot in optimizer._slots_of(table).items():  # noqa: SLF001
                self.slots[f"{optimizer.name}/{slot_name}"] = slot
        self.variables = {"embedding": table.variable, **self.slots}

    def state_names(self) -> List[str]:
        return ["embedding", *self.slots]

    def read_rows(self, session, rows: np.ndarray) -> Dict[str, np.ndarray]:
        del session
        indices = tf.constant(rows, tf.int32)
        return {name: tf.gather(var, indices).numpy() for name, var in self.variables.items()}

    def write_rows(self, session, rows: np.ndarray, values: Dict[str, np.ndarray]):
        del session
        indices = tf.constant(rows, tf.int32)
        for name, var in self.variables.items():
            var.scatter_update(tf.IndexedSlices(tf.constant(values[name], var.dtype), indices))


def keras_name(variable) -> str:
    """A Keras weight's name in checkpoints: Keras 3's path, Keras 2's name without `:0`."""
    path = getattr(variable, "path", None)
    name = path if isinstance(path, str) and path else variable.name
    return name[:-2] if name.endswith(":0") else name


def _optimizer_variables(optimizer) -> list:
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer, model) -> None:
    """Makes the optimizer's variables for the model's dense weights now (as its first
    update would, under the same names), so that a restore can write them."""
    variables = [v for v in model.trainable_variables if _compat.table_of(v) is None]
    if _compat.keras_major() >= 3:
        if not optimizer.built:
            import keras  # noqa: PLC0415 (Keras 3 only)

            with keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(variables)
            optimizer.built = True
    elif not getattr(optimizer, "_built", False):
        with tf.name_scope(optimizer.name), tf.init_scope():
            optimizer.build(variables)


def check_optimizer(where: str, optimizer) -> None:
    if optimizer is not None and not hasattr(optimizer, "mxrec_tables"):
        raise TypeError(
            f"{where}: the optimizer must be one of mxrec.keras.optimizers (SGD, Adagrad, "
            f"LazyAdam), got {type(optimizer).__name__}: a plain Keras optimizer trains a table "
            "as a dense variable, which mxrec's checkpoints do not hold")


def dense_variables(model, optimizer, tables, dense_names: Optional[Dict[str, str]] = None
                    ) -> Dict[str, tf.Variable]:
    """{name in dense.npz: tf.Variable} of a Keras model and its mxrec.keras optimizer.

    Raises:
        ValueError: two variables of one name, or a dense_names key naming no variable.
    """
    dense_names = dict(dense_names or {})
    skipped = {id(t.variable) for t in tables}
    named: Dict[str, tf.Variable] = {}
    used = set()

    def add(name, variable):
        variable = _compat.tf_variable(variable)
        if id(variable) in skipped:
            return
        skipped.add(id(variable))
        used.add(name)
        name = dense_names.get(name, name)
        if name in named:
            raise ValueError(f"mxrec.keras checkpoint: two variables are named {name!r}; give "
                             "the model's layers distinct names or rename one with dense_names")
        named[name] = variable

    if optimizer is not None:
        skipped.update(id(slot) for table in tables for slot in
                       optimizer._slots_of(table).values())  # noqa: SLF001
        if not getattr(optimizer, "momentum", 0):  # Keras 2's SGD makes them, never used
            skipped.update(id(_compat.tf_variable(v))
                           for v in getattr(optimizer, "momentums", None) or ())
        learning_rate = getattr(optimizer, "_learning_rate", None)
        if learning_rate is not None and not callable(learning_rate):
            try:
                skipped.add(id(_compat.tf_variable(learning_rate)))
            except TypeError:
                pass
    for weight in model.weights:
        if _compat.table_of(weight) is None:
            add(keras_name(weight), weight)
    if optimizer is not None:
        add(GLOBAL_STEP, optimizer.iterations)
        for name in ("beta1_power", "beta2_power"):  # LazyAdam's table beta powers
            power = getattr(optimizer.mxrec_tables, name, None)
            if power is not None:
                add(name, power)
        for variable in _optimizer_variables(optimizer):
            add(keras_name(variable), variable)
    unknown = sorted(set(dense_names) - used)
    if unknown:
        raise ValueError(f"mxrec.keras checkpoint: dense_names names no variable of the model "
                         f"or its optimizer: {unknown}; the names are {sorted(used)}")
    return named


def _keras_tables(model, optimizer):
    layers = sorted(embedding_layers(model), key=lambda layer: layer.table.table_name)
    return [_KerasTableIO(layer.table, optimizer) for layer in layers]


class KerasSaver(saver_checkpoint.Saver):
    """Full and delta checkpoints of an mxrec.keras model in the Session path's format.

    Args:
        directory: where versions live (any filesystem tf.io.gfile knows).
        model: the Keras model; its mxrec.keras Embedding layers are the tables.
        optimizer: the model's mxrec.keras optimizer (its table slots, dense slots and
            iterations are saved), or None (the model's weights and tables only).
        max_to_keep: full versions kept (with their deltas); None keeps all.
        dense_names: {Keras name: name in the checkpoint} for dense variables.

    On several ranks every rank makes one with the same model and calls save and restore at
    the same steps (they are collective); each writes the shard of every table it owns.

    Raises:
        TypeError: the optimizer is not one of mxrec.keras.optimizers.
    """

    def __init__(self, directory: str, model, optimizer=None, max_to_keep: Optional[int] = 5,
                 dense_names: Optional[Dict[str, str]] = None):
        # Not Saver.__init__: that one collects a graph's tables and variables.
        _compat.require_eager("mxrec.keras checkpoint")
        check_optimizer(f"mxrec.keras checkpoint of {directory!r}", optimizer)
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"mxrec.keras checkpoint: max_to_keep must be >= 1 or None, got "
                             f"{max_to_keep}")
        get_config_initializer()  # init() first: the tables and the ranks are its
        self.directory = directory
        self.max_to_keep = max_to_keep
        self._optimizer = optimizer
        self._tables = _keras_tables(model, optimizer)
        self._dense_by_name = dense_variables(model, optimizer,
                                              [io_.table for io_ in self._tables], dense_names)
        self._dense = list(self._dense_by_name.values())
        self._dense_feeds = None
        self._last_epochs = None
        self._last_step = None
        self._last_full = None
        # Several ranks: each rank writes the shard it owns of every table, rank 0 the dense
        # variables, into one version (the Session path's sharded format); a restore on
        # any rank count keeps the IDs each rank owns.
        self._rank, self._size = communication.get_rank_id(), communication.get_rank_size()
        self._barrier = None
        self._folder_checked = False
        self._step_loaded = True
        if self._rank == 0:
            for name in manifest_io.remove_stale_temporaries(directory):
                tf.get_logger().info("mxrec checkpoint: removed %s/%s, left by a save that "
                                     "died", directory, name)

    def _sum_over_ranks(self, session, value: int) -> int:
        """The sum of `value` over the ranks, once every rank has called it (an eager
        all-reduce: the Session path's Saver runs its graph's barrier instead)."""
        del session
        return int(communication.allreduce(tf.constant(value, tf.int32), "sum").numpy())

    def _current_step(self) -> int:
        if self._optimizer is None:
            raise ValueError("mxrec.keras checkpoint: without an optimizer, save needs step=")
        return int(_compat.tf_variable(self._optimizer.iterations).numpy())

    def save(self, step: Optional[int] = None, kind: str = "full") -> str:  # noqa: D417
        """Writes a version at `step` (the optimizer's iterations by default); returns its
        path. kind: "full" or "delta" (a delta needs a save or restore first)."""
        return super().save(None, self._current_step() if step is None else step, kind)

    def restore(self, version: Optional[int] = None) -> int:
        """Loads the latest version (or the one saved at step `version`): the full save and
        its deltas; returns its step.

        Raises:
            CheckpointError: nothing to restore, a broken chain, a bad file, a table or
                dense variable missing or of another shape, named.
        """
        self._step_loaded = True
        step = super().restore(None, version)
        if not self._step_loaded and self._optimizer is not None:
            _compat.tf_variable(self._optimizer.iterations).assign(step)
        return step

    def _read_dense(self, session) -> Dict[str, np.ndarray]:
        del session
        return {name: variable.numpy() for name, variable in self._dense_by_name.items()}

    def _load_into_graph(self, session, state, dense):
        self._check_dense(dense)  # before any table changes
        super()._load_into_graph(session, state, dense)

    def _check_dense(self, dense: Dict[str, np.ndarray]) -> None:
        where = f"the checkpoint in {self.directory}"
        for name, variable in self._dense_by_name.items():
            if name not in dense:
                if name != GLOBAL_STEP:
                    raise CheckpointError(f"dense variable {name!r} is not in {where} (it "
                                          f"holds {sorted(dense)}); rename with dense_names")
            elif list(dense[name].shape) != variable.shape.as_list():
                raise CheckpointError(f"dense variable {name!r} has shape "
                                      f"{variable.shape.as_list()} in the model but "
                                      f"{list(dense[name].shape)} in {where}")

    def _load_dense(self, session, dense: Dict[str, np.ndarray]) -> None:
        del session
        self._check_dense(dense)
        self._step_loaded = GLOBAL_STEP in dense
        for name, variable in self._dense_by_name.items():
            if name in dense:
                variable.assign(tf.constant(dense[name], variable.dtype))


def warm_start(model, checkpoint: str, vars_to_warm_start: Union[str, Sequence[str]] = ".*",
               optimizer=None, dense_names: Optional[Dict[str, str]] = None) -> List[str]:
    """Initialises chosen tables and weights of `model` from a checkpoint of mxrec's format
    (`checkpoint`: its directory, for the latest version, or one version folder), as the
    Session path's WarmStart does from such a checkpoint.

    vars_to_warm_start: a string or a list of strings. Tables: names matched in full (a
    table's host records, rows and, with `optimizer`, the slots of it that the checkpoint
    holds; the table is replaced as a whole and its IDs get rows 0, 1, ... in ID order).
    Dense weights: TF's rule, `re.match` against the names of the model's trainable weights
    (a string) or of all its weights (a list). Optimizer state other than table slots is
    not loaded. Returns the names loaded (tables, and weights by their checkpoint names).

    Raises:
        ValueError: an entry that chooses nothing; a chosen table or weight missing from
            the checkpoint or of another dim or shape; a path that is not such a checkpoint.
    """
    _compat.require_eager("mxrec.keras.warm_start")
    check_optimizer("mxrec.keras.warm_start", optimizer)
    location = merge.locate(checkpoint)
    if location is None:
        raise ValueError(f"mxrec.keras.warm_start: {checkpoint!r} is not a directory of mxrec "
                         "checkpoint versions (full-*/delta-*) nor one version of it")
    patterns = [vars_to_warm_start] if isinstance(vars_to_warm_start, str) else list(
        vars_to_warm_start)
    ios = _keras_tables(model, optimizer)
    dense = _dense_by_checkpoint_name(
        model.trainable_weights if isinstance(vars_to_warm_start, str) else model.weights,
        dense_names)
    chosen_tables, chosen_dense = _choose(patterns, ios, dense)
    # The manifests and the dense values first: what is missing fails before any load.
    versions = merge.read_chain(*location)
    manifest, dense_values = versions[-1][1], versions[-1][2]["dense.npz"]
    _check_chosen(manifest, dense_values, chosen_tables, chosen_dense, dense,
                  f"checkpoint {checkpoint!r} (step {manifest['step']})")
    if chosen_tables:
        _load_tables(location, chosen_tables)
    for name in chosen_dense:
        dense[name].assign(tf.constant(dense_values[name], dense[name].dtype))
    return [io_.table.table_name for io_ in chosen_tables] + chosen_dense


def _load_tables(location: Tuple[str, Optional[int]], ios) -> None:
    """Loads the chosen tables from the chain at `location` (directory, step) as the
    Session path's WarmStart does: every file verified, then mapped, each table folded as
    columns (all ranks' files, the IDs given rows anew) and loaded a chunk of rows at a
    time, so that no per-ID object is made and no file is read whole."""
    copies = stream.LocalCopies()
    try:
        versions = fold.open_chain(*location, copies)
        for io_ in ios:
            folded = saver_checkpoint.folded_table(io_.table, versions, 0, 1, own_files=False,
                                                   directory=location[0])
            rows = stream.chunk_rows(stream.DEFAULT_MEMORY_MB, io_.table.dim,
                                     len(io_.state_names()))
            table_file.load(None, io_, folded, rows, missing_states="keep")
    finally:
        copies.close()


def _dense_by_checkpoint_name(weights, dense_names: Optional[Dict[str, str]]) -> Dict:
    """The variables of the dense `weights` (tables left out) by their checkpoint names."""
    dense = {}
    for weight in weights:
        if _compat.table_of(weight) is None:
            name = keras_name(weight)
            dense[dict(dense_names or {}).get(name, name)] = _compat.tf_variable(weight)
    return dense


def _choose(patterns: List[str], ios, dense: Dict) -> Tuple[List, List[str]]:
    """(the tables' TableIOs, the dense names) that warm_start's patterns choose, each once
    in the order first chosen.

    Raises:
        ValueError: a pattern that chooses nothing.
    """
    chosen_tables, chosen_dense = [], []
    for pattern in patterns:
        tables = [io_ for io_ in ios if re.fullmatch(pattern, io_.table.table_name)]
        names = [name for name in dense if re.match(pattern, name)]
        if not tables and not names:
            raise ValueError(f"mxrec.keras.warm_start: {pattern!r} chooses no table (tables: "
                             f"{sorted(io_.table.table_name for io_ in ios)}) and no weight "
                             f"(weights: {sorted(dense)})")
        chosen_tables += [io_ for io_ in tables if io_ not in chosen_tables]
        chosen_dense += [name for name in names if name not in chosen_dense]
    return chosen_tables, chosen_dense


def _check_chosen(manifest: Dict, dense_values, chosen_tables, chosen_dense: List[str],
                  dense: Dict, where: str) -> None:
    """Refuses, before anything loads, a chosen table or weight that the checkpoint's last
    version lacks or holds with another dim or shape.

    Raises:
        ValueError: naming the table or weight.
    """
    for io_ in chosen_tables:
        meta = manifest["tables"].get(io_.table.table_name)
        if meta is None:
            raise ValueError(f"mxrec.keras.warm_start: table {io_.table.table_name!r} is not in "
                             f"{where}; tables there: {sorted(manifest['tables'])}")
        if meta["dim"] != io_.table.dim:
            raise ValueError(f"mxrec.keras.warm_start: table {io_.table.table_name!r} has dim "
                             f"{io_.table.dim} in the model but {meta['dim']} in {where}")
    for name in chosen_dense:
        if name not in dense_values:
            raise ValueError(f"mxrec.keras.warm_start: weight {name!r} is not in {where}")
        if list(dense_values[name].shape) != dense[name].shape.as_list():
            raise ValueError(f"mxrec.keras.warm_start: weight {name!r} has shape "
                             f"{dense[name].shape.as_list()} in the model but "
                             f"{list(dense_values[name].shape)} in {where}")
