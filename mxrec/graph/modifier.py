"""The graph modifier: moves the host key stage of a user's graph into its input pipeline.

Users keep writing `sparse_lookup(table, ids, modify_graph=True)` with `ids`
computed from a `tf.data` iterator. `modify_graph_and_start_emb_cache` then
rewrites the graph:

    before:  get_next ─► preprocessing ─► key stage ─► rows, restore ─► gather ...
    after:   dataset.map(preprocessing + key stage).prefetch(N) ─► new get_next
                 ├─ element  ─► everything that read the old get_next
                 └─ rows, restore ─► the lookups' gathers and their gradients

The old key-stage ops are left with no consumers and no control edges, so
they never run and every ID is counted once, by the pipeline, up to
`prefetch_batch_number` batches ahead of the step.

Example:
    >>> iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
    >>> features, labels = iterator.get_next()
    >>> emb = sparse_lookup(table, features["ids"], modify_graph=True)  # [B, 26, dim]
    >>> train_op = ...  # loss, minimize, hash optimizer
    >>> modify_graph_and_start_emb_cache()
    >>> sess.run(get_initializer(True))  # instead of iterator.initializer
    >>> sess.run([train_op, rewritten_tensor(labels)])  # labels [B]: the step's own batch

The old `get_next` outputs stay in the graph but are not the batches the step
trains on; fetching one directly fails with an error that names it and
`rewritten_tensor`, which maps it to the output that replaced it.
"""

import os
from typing import Dict, List, Optional

import tensorflow as tf

from mxrec.core import target_batch
from mxrec.core.graph_state import existing_state, graph_state
from mxrec.core.planners import modify_graph_lookups
from mxrec.graph import pipeline, trace
from mxrec.util import registry
from mxrec.util.config import get_config_initializer

DEFAULT_DUMP_DIR = "export_graph"
_REPLACED_GET_NEXT_MESSAGE = (
    "{name} (outputs {outputs}) was replaced by modify_graph_and_start_emb_cache(): its "
    "iterator no longer runs. To fetch one of these tensors directly (labels for a metric "
    "computed outside the graph, say), fetch mxrec.graph.modifier.rewritten_tensor(t), the "
    "output that carries the step's own batch")
_RETIRED_MESSAGE = (
    "the key stage {name} was moved into the input pipeline by "
    "modify_graph_and_start_emb_cache(), but ops built afterwards still read its outputs; "
    "build the whole model, gradients and optimizers included, before calling "
    "modify_graph_and_start_emb_cache()")


class _GraphState:
    """What the modifier did to one graph: the records it rewired, the new iterators."""

    def __init__(self):
        self.done_records: List[object] = []
        self.iterators: List[pipeline.RewrittenIterator] = []
        self.retired: List[tf.Operation] = []
        # Name of an old get_next output -> the new iterator's output that replaced it.
        self.replacements: Dict[str, tf.Tensor] = {}

    def is_done(self, record) -> bool:
        return any(record is done for done in self.done_records)


# Per graph, in the graph's GraphState (mxrec.core.graph_state), dropped with the graph.
# Not a graph collection: collections of Python objects make every meta-graph export
# (Estimator's saver) warn.


def _state(graph: tf.Graph) -> _GraphState:
    state = graph_state(graph)
    if state.modifier is None:
        state.modifier = _GraphState()
    return state.modifier


def _existing(graph: tf.Graph) -> Optional[_GraphState]:
    state = existing_state(graph)
    return None if state is None else state.modifier


def _lookup_name(record) -> str:
    return record.rows.op.name.rpartition("/")[0] or record.rows.op.name


def _replace_uses(old: tf.Tensor, new: tf.Tensor) -> None:
    for consumer in list(old.consumers()):
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer._update_input(index, new)  # pylint: disable=protected-access


def _retire_key_stage(graph: tf.Graph, key_stage: tf.Operation, record) -> None:
    """Makes an old key-stage op unreachable, and harmless if it were run."""
    key_stage._remove_all_control_inputs()  # pylint: disable=protected-access
    for op in graph.get_operations():
        if key_stage in op.control_inputs:
            kept = [c for c in op.control_inputs if c is not key_stage]
            op._remove_all_control_inputs()  # pylint: disable=protected-access
            op._add_control_inputs(kept)  # pylint: disable=protected-access
    # Anything built later on the old rows (gradients, optimizers) would run this op
    # again; make that fail with the reason instead of planning a batch twice.
    with graph.as_default(), tf.name_scope(key_stage.name + "_retired"):
        guard = tf.compat.v1.placeholder_with_default(False, [], name="never_true")
        fail = tf.debugging.Assert(guard, [_RETIRED_MESSAGE.format(name=key_stage.name)])
        for index, tensor in enumerate(list(key_stage.inputs)):
            if tensor.dtype in (tf.int32, tf.int64) and tensor.shape.rank == 1:
                with tf.control_dependencies([fail]):
                    # Unknown length, so it fits an input of any static length.
                    empty = tf.compat.v1.placeholder_with_default(
                        tf.zeros([0], tensor.dtype), shape=[None])
                key_stage._update_input(index, empty)  # pylint: disable=protected-access
    # Later direct lookups of the table must not chain onto the retired op.
    record.table.forget_key_stage(graph, key_stage)


def _guard_old_get_next(graph: tf.Graph, get_next: tf.Operation) -> None:
    """Makes a direct fetch of an old get_next output fail with what to do instead.

    Its iterator is never initialised once rewritten, so TensorFlow would only
    say "iterator has not been initialized".
    """
    outputs = ", ".join(t.name for t in get_next.outputs)
    with graph.as_default(), tf.name_scope(get_next.name + "_replaced"):
        guard = tf.compat.v1.placeholder_with_default(False, [], name="never_true")
        fail = tf.debugging.Assert(guard, [_REPLACED_GET_NEXT_MESSAGE.format(
            name=get_next.name, outputs=outputs)])
        with tf.control_dependencies([fail]):
            check = tf.no_op(name="check")
    get_next._add_control_input(check)  # pylint: disable=protected-access


def rewritten_tensor(tensor, graph: Optional[tf.Graph] = None):
    """The tensor to fetch for `tensor` after `modify_graph_and_start_emb_cache()`.

    An output of a rewritten iterator's `get_next` maps to the new iterator's output
    that replaced it (the batch the step trains on); any other tensor, or a graph not
    rewritten, maps to itself. Ops built on the old outputs before the rewrite were
    rewired already; this is for fetching the outputs themselves.

    Args:
        tensor: a tensor, or a nested structure (dict, tuple, SparseTensor) of tensors.
        graph: the rewritten graph; the tensors' own graph when None.

    Returns:
        The same structure, with each replaced tensor swapped for its replacement.

    Example:
        >>> features, labels = iterator.get_next()     # labels [B]
        >>> ...; modify_graph_and_start_emb_cache()
        >>> _, y = sess.run([train_op, rewritten_tensor(labels)])  # y: this step's labels
    """

    def one(value):
        if not isinstance(value, tf.Tensor):
            raise TypeError(f"rewritten_tensor: expected tensors, got {type(value).__name__}")
        state = _existing(graph if graph is not None else value.graph)
        return value if state is None else state.replacements.get(value.name, value)

    return tf.nest.map_structure(one, tensor, expand_composites=True)


def _dump(graph: tf.Graph, dump_dir: str, name: str) -> None:
    os.makedirs(dump_dir, exist_ok=True)
    tf.io.write_graph(graph.as_graph_def(add_shapes=True), dump_dir, name, as_text=True)


def modify_graph_and_start_emb_cache(full_graph: Optional[tf.Graph] = None,
                                     dump_graph: bool = False,
                                     dump_dir: str = DEFAULT_DUMP_DIR
                                     ) -> List[pipeline.RewrittenIterator]:
    """Rewrites a graph so that its lookups' key stages run in the input pipeline.

    Every lookup made with `sparse_lookup(..., modify_graph=True)` and not yet
    rewritten is traced back to the tf.data iterator its IDs come from; that
    iterator is replaced by one over the same dataset with the ID
    preprocessing, the key stage and `prefetch(prefetch_batch_number)` added.
    Call it after the whole model is built, the optimizers' `minimize` /
    `apply_gradients` included (gradients built later would still read the
    old key stage; `get_initializer` and running such ops say so), before the
    graph is finalized; then run `get_initializer(is_training)` instead of the
    old iterators' initializers. On several ranks the pipeline holds only the
    rank-local part of the planning; the exchange of IDs and the owners' key stage
    run in a planning subgraph of the step (mxrec.distributed.sharded_pipeline), so every rank
    must run its initializers and steps in the same order.

    Args:
        full_graph: the graph to rewrite; the default graph when None.
        dump_graph: write the graph before and after as pbtxt files into `dump_dir`.
        dump_dir: the folder for `dump_graph`.

    Returns:
        The new iterators, one per rewritten user iterator.

    Raises:
        ValueError: a lookup whose IDs do not come from a supported tf.data
            iterator (a placeholder, a variable, several iterators), an
            iterator kind that cannot be rebuilt, an iterator feeding both
            training and evaluation lookups, or static shapes without send_count.
    """
    graph = full_graph if full_graph is not None else tf.compat.v1.get_default_graph()
    config = get_config_initializer().config
    state = _state(graph)
    records = [r for r in modify_graph_lookups(graph) if not state.is_done(r)]
    if dump_graph:
        _dump(graph, dump_dir, "graph_before_modify.pbtxt")
    if not records:
        return []
    by_iterator, sources = _group_by_iterator(records, config)
    rewritten = _rebuild_iterators(by_iterator, sources, config, graph)
    _rewire(graph, state, rewritten, by_iterator)
    state.iterators.extend(rewritten)
    _register_initializers(graph, rewritten)
    if dump_graph:
        _dump(graph, dump_dir, "graph_after_modify.pbtxt")
    return rewritten


def _group_by_iterator(records, config):
    """The records' lookups by the iterator their IDs come from, and those iterators."""
    by_iterator: Dict[str, List[pipeline.PlannedLookup]] = {}
    sources: Dict[str, trace.IteratorSource] = {}
    for record in records:
        name = _lookup_name(record)
        ids_source = trace.trace_ids(record.traced, name)
        send_count = None
        if not config.use_dynamic:
            if record.send_count is None or int(record.send_count) <= 0:
                raise ValueError(
                    f"sparse_lookup {name!r}: init(use_dynamic=False) pads each batch's unique "
                    f"rows to send_count, so the lookup needs send_count > 0, got "
                    f"{record.send_count!r}")
            send_count = int(record.send_count)
        key = ids_source.get_next.name
        if key not in sources:
            sources[key] = trace.find_iterator(ids_source.get_next)
        by_iterator.setdefault(key, []).append(
            pipeline.PlannedLookup(name=name, record=record, source=ids_source,
                                   send_count=send_count))
    return by_iterator, sources


def _rebuild_iterators(by_iterator, sources, config, graph) -> List:
    """One new iterator per user iterator, with the preprocessing and key stages added."""
    rewritten = []
    for key, lookups in by_iterator.items():
        modes = {lookup.record.is_train for lookup in lookups}
        if len(modes) > 1:
            raise ValueError(
                f"iterator {sources[key].iterator.name!r} feeds lookups with is_train=True and "
                f"is_train=False ({[lookup.name for lookup in lookups]}); use one dataset "
                "iterator for training and another for evaluation")
        build = lookups[0].record.rebuild or pipeline.rebuild
        rewritten.append(build(sources[key], lookups, modes.pop(),
                               config.prefetch_batch_number, graph))
    return rewritten


def _rewire(graph, state: _GraphState, rewritten, by_iterator) -> None:
    """Every consumer of the old get_next outputs and of each record's plan reads the new
    iterator's; the old key stages are retired."""
    for new in rewritten:
        for index, output in enumerate(new.source.get_next.outputs):
            _replace_uses(output, new.outputs[index])
            state.replacements[output.name] = new.outputs[index]
        _guard_old_get_next(graph, new.source.get_next)
    for new, lookups in zip(rewritten, by_iterator.values()):
        for old, planned in new.replacements:
            _replace_uses(old, planned)
        for lookup, rows, restore, reused in zip(lookups, new.rows, new.restore, new.reused):
            record = lookup.record
            _replace_uses(record.rows, rows)
            _replace_uses(record.restore, restore)
            _replace_uses(record.reused, reused)
            _retire_key_stage(graph, record.rows.op, record)
            state.retired.append(record.rows.op)
            state.done_records.append(record)


def _register_initializers(graph, rewritten) -> None:
    runtime = get_config_initializer()
    for new in rewritten:
        target = (runtime.train_iterator_initializers if new.is_train
                  else runtime.eval_iterator_initializers)
        # Those of the latest graph only (an Estimator's next graph replaces them, as
        # init()'s `tables`): an initializer of an older graph would keep that graph alive.
        target[:] = [op for op in target if op.graph is graph] + [new.initializer]


def _check_retired(state: _GraphState) -> None:
    for key_stage in state.retired:
        for output in key_stage.outputs:
            if output.consumers():
                raise RuntimeError(_RETIRED_MESSAGE.format(name=key_stage.name) +
                                   f" (op {output.consumers()[0].name!r} reads {output.name})")


def get_initializer(is_training: bool, graph: Optional[tf.Graph] = None) -> tf.Operation:
    """The initializer of the rewritten training (True) or evaluation (False) iterator.

    Run it where the user's code ran `iterator.initializer`. One-shot
    iterators need none; for them this is a no-op.

    Raises:
        RuntimeError: the graph was not rewritten yet, or has no iterator of that kind.
    """
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    state = _existing(graph)
    iterators = state.iterators if state else []
    if not iterators:
        raise RuntimeError(
            "get_initializer: the graph has no rewritten iterator; call "
            "modify_graph_and_start_emb_cache() after building the model with "
            "sparse_lookup(..., modify_graph=True)")
    _check_retired(state)
    chosen = [it.initializer for it in iterators if it.is_train == bool(is_training)]
    if not chosen:
        kind = "training (is_train=True)" if is_training else "evaluation (is_train=False)"
        raise RuntimeError(
            f"get_initializer({is_training}): no rewritten iterator feeds {kind} lookups in "
            "this graph")
    if len(chosen) == 1:
        return chosen[0]
    with graph.as_default():
        return tf.group(*chosen, name="mxrec_train_initializers" if is_training
                        else "mxrec_eval_initializers")


def rewritten_initializers(graph: tf.Graph) -> List[tf.Operation]:
    """The initializers of every rewritten iterator of `graph` (none before the rewrite).

    Raises:
        RuntimeError: an op built after the rewrite reads a key stage it retired.
    """
    state = _existing(graph)
    if state is None:
        return []
    _check_retired(state)
    return [it.initializer for it in state.iterators]


def replacements(graph: tf.Graph) -> Dict[str, tf.Tensor]:
    """{name of a replaced get_next output: the output that carries the step's own batch}."""
    state = _existing(graph)
    return {} if state is None else state.replacements


def get_target_batch(is_training: bool):
    """mx_rec's `train_params_config.get_target_batch(is_training)`: the `batch=` of this
    mode's modify_graph lookups, its tensors swapped for the rewritten iterator's outputs.

    Raises:
        RuntimeError: the default graph was not rewritten for that mode, or its lookups
            were given no `batch=`.
    """
    graph = tf.compat.v1.get_default_graph()
    get_initializer(is_training, graph)  # raises unless that mode was rewritten
    batch = target_batch.batch_of(graph, is_training)
    if batch is None:
        raise RuntimeError(
            f"get_target_batch({is_training}): no sparse_lookup(..., modify_graph=True, "
            f"is_train={is_training}) of this graph was given batch=; pass the iterator's "
            "get_next() as batch=, or fetch mxrec.graph.modifier.rewritten_tensor(tensor)")
    return rewritten_tensor(batch, graph)


# mxrec.util.config.get_initializer (mx_rec's `mxrec.util.initialize.get_initializer`) and
# train_params_config.get_target_batch answer with this module's.
registry.provide(registry.ITERATOR_INITIALIZER, get_initializer)
registry.provide(registry.TARGET_BATCH, get_target_batch)
