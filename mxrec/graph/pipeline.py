"""Rebuilds an iterator's input pipeline with the host key stage in it.

    dataset ─► map(plan) ─► prefetch(prefetch_batch_number) ─► new iterator
                 │
                 └ replays each lookup's ID preprocessing on the element and runs
                   the key stage: element -> (element, rows per lookup, restore per lookup)

An iterator of evaluation lookups (is_train=False) keeps only the ID preprocessing in
its map (element -> (element, IDs per lookup, time per lookup)); their key stage runs
in the step that reads the batch, so an evaluation reads the tables as they are when
it runs, however far ahead (or how many training steps before) the iterator read it.

The element passes through in its flat form (the get_next outputs), so any
structure the user's dataset has (dicts, sparse components) comes out of the
new get_next exactly as it came out of the old one. The map is sequential, so
the key stage plans batches in the order the step consumes them, and the
prefetch buffer bounds how far it runs ahead.

A training batch planned here stays *pending* in its tables (deferred key
stage) until the step that reads its planned rows runs the batch's commit:
saves, evaluation and eviction see the tables as at the step boundary
(mxrec/cc_ops/engine/host_table.h, HostTable::Process).
"""

import dataclasses
from typing import List, Optional, Tuple

import tensorflow as tf

from mxrec.core.table import pad_to_send_count
from mxrec.graph import trace
from mxrec.util import ops as mxrec_ops


@dataclasses.dataclass
class PlannedLookup:
    """A lookup to plan in the pipeline.

    Attributes:
        name: the lookup's name scope, for messages.
        record: the LookupRecord from sparse_lookup.
        source: how its IDs come from the iterator.
        send_count: pad the unique rows to this many (static shapes), or None.
    """

    name: str
    record: object
    source: trace.IdsSource
    send_count: Optional[int] = None

    @property
    def key_stage(self) -> tf.Operation:
        """The lookup's MxrecKeyStage op in the user's graph; inputs (ids, timestamp)."""
        return self.record.rows.op


@dataclasses.dataclass
class RewrittenIterator:
    """The new iterator that replaces one of the user's.

    Attributes:
        source: the user's iterator.
        is_train: whether its lookups train (insert and count IDs) or evaluate.
        kind: trace.INITIALIZABLE or trace.ONE_SHOT.
        initializer: op that (re)starts the new iterator; a no-op for one-shot iterators.
        outputs: the new get_next outputs that replace the old ones, index for index.
        rows: the planned unique rows, one per lookup.
        restore: the planned restore indexes, one per lookup.
        reused: the planned rows to re-initialise (handed to new IDs after eviction).
        replacements: (tensor of the user's graph, planned tensor) pairs the modifier also
            rewires: a sharded lookup's routing and exchange
            (mxrec.distributed.sharded_pipeline).
    """

    source: trace.IteratorSource
    is_train: bool
    kind: str
    initializer: tf.Operation
    outputs: List[tf.Tensor]
    rows: List[tf.Tensor]
    restore: List[tf.Tensor]
    reused: List[tf.Tensor]
    replacements: List[Tuple[tf.Tensor, tf.Tensor]] = dataclasses.field(default_factory=list)


def _key_stage_rounds(lookups: List[PlannedLookup]) -> List[List[int]]:
    """Groups lookups into key-stage calls, a table at most once per call.

    The engine plans the tables of one call in parallel, so two lookups of one
    table go into successive calls, in creation order, like the direct path's
    chain of key stages. One call has one is_train and one timestamp.
    """

    def mode(lookup):
        return lookup.record.is_train, lookup.key_stage.inputs[1].name

    rounds: List[List[int]] = []
    last_round = {}
    for index, lookup in enumerate(lookups):
        key = lookup.record.table.table_key
        start = last_round.get(key, -1) + 1
        while start < len(rounds) and mode(lookups[rounds[start][0]]) != mode(lookup):
            start += 1
        if start == len(rounds):
            rounds.append([])
        rounds[start].append(index)
        last_round[key] = start
    return rounds


def _preprocess_fn(source: trace.IteratorSource, lookups: List[PlannedLookup],
                   graph: tf.Graph):
    """The lookups' ID preprocessing replayed on an element: (ids, timestamp) per lookup."""
    get_next_name = source.get_next.name
    graph_defs = [trace.subgraph_def(lookup.source, graph) for lookup in lookups]

    def preprocess(components):
        flat_ids, stamps = [], []
        for index, (lookup, graph_def) in enumerate(zip(lookups, graph_defs)):
            input_map = {f"{get_next_name}:{i}": components[i]
                         for i in lookup.source.used_outputs}
            ids, stamp = tf.compat.v1.import_graph_def(
                graph_def, input_map=input_map,
                return_elements=[t.name for t in lookup.key_stage.inputs[:2]],
                name=f"mxrec_ids_{index}")
            flat_ids.append(ids)
            stamps.append(stamp)
        return flat_ids, stamps

    return preprocess


def _key_stages(lookups: List[PlannedLookup], flat_ids, stamps, deferred: bool):
    """The key stage of every lookup on its IDs: (rows, restore, reused, batch ids per
    round), padded to send_count where set."""
    rows: List[Optional[tf.Tensor]] = [None] * len(lookups)
    restore: List[Optional[tf.Tensor]] = [None] * len(lookups)
    reused: List[Optional[tf.Tensor]] = [None] * len(lookups)
    batch_ids = []
    previous = []
    for members in _key_stage_rounds(lookups):
        with tf.control_dependencies(previous):
            unique_rows, restore_index, reused_rows, ids_of_round = mxrec_ops.key_stage(
                [flat_ids[i] for i in members],
                [lookups[i].record.table.table_key for i in members],
                lookups[members[0]].record.is_train, timestamp=stamps[members[0]],
                deferred=deferred)
        batch_ids.append(ids_of_round)
        previous = [unique_rows[0].op]
        for slot, i in enumerate(members):
            rows[i], restore[i] = unique_rows[slot], restore_index[slot]
            reused[i] = reused_rows[slot]
    for i, lookup in enumerate(lookups):
        if lookup.send_count is not None:
            rows[i], restore[i] = pad_to_send_count(lookup.record.table, rows[i],
                                                    restore[i], lookup.send_count,
                                                    lookup.name)
        restore[i].set_shape(lookup.record.restore.shape)
    return rows, restore, reused, batch_ids


def _plan_fn(source: trace.IteratorSource, lookups: List[PlannedLookup], graph: tf.Graph):
    preprocess = _preprocess_fn(source, lookups, graph)

    def plan(*components):
        flat_ids, stamps = preprocess(components)
        rows, restore, reused, batch_ids = _key_stages(lookups, flat_ids, stamps, True)
        return tuple(components), tuple(rows), tuple(restore), tuple(reused), tuple(batch_ids)

    return plan


def _ids_fn(source: trace.IteratorSource, lookups: List[PlannedLookup], graph: tf.Graph):
    preprocess = _preprocess_fn(source, lookups, graph)

    def ids(*components):
        flat_ids, stamps = preprocess(components)
        return tuple(components), tuple(flat_ids), tuple(stamps)

    return ids


def make_dataset_iterator(source: trace.IteratorSource, specs, map_fn, prefetch: int):
    """The user's dataset (of `source`) mapped by `map_fn` and prefetched, and an iterator
    of the same kind over it: (dataset, initializer, iterator); the initializer of a one-shot
    iterator is a no-op."""
    if source.kind == trace.ONE_SHOT:
        # Stateful, so that grappler does not fold the dataset into a constant.
        variant = tf.raw_ops.StatefulPartitionedCall(
            args=[], Tout=[tf.variant], f=source.dataset_factory)[0]
    else:
        variant = source.dataset_variant
    dataset = tf.data.experimental.from_variant(variant, specs)
    dataset = dataset.map(map_fn)
    if prefetch > 0:
        dataset = dataset.prefetch(prefetch)
    if source.kind == trace.ONE_SHOT:
        iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
        initializer = tf.no_op(name="one_shot_initializer")
    else:
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        initializer = iterator.initializer
    return dataset, initializer, iterator


def rebuild(source: trace.IteratorSource, lookups: List[PlannedLookup], is_train: bool,
            prefetch: int, graph: tf.Graph) -> RewrittenIterator:
    """Builds the new dataset and iterator for `source`, planning `lookups`."""
    specs = trace.output_specs(source.get_next)
    scope = source.get_next.name.replace(":", "_") + "_mxrec"
    with graph.as_default(), tf.name_scope(scope), tf.device("/device:CPU:0"):
        if not is_train:
            # Evaluation: the pipeline prepares the IDs, the step plans them, so the
            # batch reads the tables as they are when it runs, however long ago the
            # iterator read it (evaluation inserts and counts nothing: nothing to defer).
            _, initializer, iterator = make_dataset_iterator(
                source, specs, _ids_fn(source, lookups, graph), prefetch)
            outputs, flat_ids, stamps = iterator.get_next()
            rows, restore, reused, _ = _key_stages(lookups, flat_ids, stamps, False)
            return RewrittenIterator(source=source, is_train=False, kind=source.kind,
                                     initializer=initializer, outputs=list(outputs),
                                     rows=list(rows), restore=list(restore),
                                     reused=list(reused))
        _, initializer, iterator = make_dataset_iterator(
            source, specs, _plan_fn(source, lookups, graph), prefetch)
        outputs, rows, restore, reused, batch_ids = iterator.get_next()
        # The step that reads a batch's planned rows trains it: commit there.
        commits = [mxrec_ops.commit_batches(
            ids, [lookups[i].record.table.table_key for i in members])
            for ids, members in zip(batch_ids, _key_stage_rounds(lookups))]
        with tf.control_dependencies(commits):
            rows = [tf.identity(r) for r in rows]
            reused = [tf.identity(r) for r in reused]
    return RewrittenIterator(source=source, is_train=True, kind=source.kind,
                             initializer=initializer, outputs=list(outputs), rows=list(rows),
                             restore=list(restore), reused=list(reused))
