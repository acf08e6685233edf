"""The graph modifier on several ranks: what runs in the input pipeline, and what in the step.

TensorFlow's collectives cannot run inside a tf.data function in the session runtime (the
function has no CollectiveExecutor), so the ID exchange of a sharded lookup
(mxrec.distributed.id_exchange) cannot join the one-process pipeline's `dataset.map`. The
planning is split in three:

    dataset ─► map(route) ─► prefetch(prefetch_batch_number) ─► local iterator
                 │   replays each lookup's ID preprocessing and runs `routing.route`:
                 │   local unique IDs, occurrence counts, owner buckets (no collective)
    planning subgraph (in the step's session.run, the same collectives on every rank):
        the element held since the previous planning, and the next local element
        (get_next_as_optional) ─► `id_exchange.exchange_all` for all the element's lookups:
        ONE agreement all-reduce (every lookup's largest bucket and fingerprint, the batch
        times, "every rank has one more") and ONE ID all-to-all ─► the owners' deferred key
        stages ─► enqueue the element, its routing and its plan into a FIFOQueue (capacity
        prefetch + 1) ─► every rank has one more: hold it; else mark the end of the data
    step: dequeue ─► commit the batch ─► the owners' device lookups from the planned rows
          ─► ONE embedding all-to-all back for all lookups, ONE gradient all-to-all per
          backward pass (`send_back.send_back_all` replaces the lookups' own send-backs)

With prefetch p > 0 the queue holds p planned batches between steps: the step trains batch
k while it plans batch k + p (that planning is a control input of the step's backward
pass only, so it overlaps the forward pass). The first step after an initialisation (or any
step that finds fewer than p batches planned: a step that fetched no gradient did not plan)
first plans up to p batches, one chained copy of the planning subgraph per missing batch,
each copy with its own collective instance keys. With p = 0 the step plans its own batch
first. Once every planned batch is consumed after the end of the data, the step's dequeue
ends with OutOfRangeError, at the same step as one process; since the end is known one
element ahead, that step runs no collective (a step that fails after a collective may tear
down buffers a peer still reads, which aborts the collectives of every rank). The
initializer restarts the local iterator, drops the planned batches (the engine retires their
pending state at the next commit: docs/ARCHITECTURE.md, "The step boundary") and pulls the
first element, so every rank must run it at the same point, as the steps.

Every rank runs the same sequence of collectives in every step (the decisions that choose a
branch, "has every rank a batch" and the queue's fill, are the same on every rank), so the
ranks stay in lockstep. An evaluation iterator works the same way, without commits. A
step that ends in OutOfRangeError leaves its step id to the next step of its kind; the
initializer's all-reduce (and every other kind of step's) keeps the ranks from reusing it
while a peer still finishes the failed step (communication.allreduce,
docs/design/multiworker.md).
"""

import dataclasses
import re
from typing import List, Optional, Tuple

import tensorflow as tf

from mxrec.distributed import communication, id_exchange, routing, send_back
from mxrec.graph import pipeline, trace
from mxrec.util import ops as mxrec_ops

# The rank-local routing of one lookup, as the dataset's map returns it.
_ROUTE_FIELDS = ("pairs", "counts", "where", "order", "index")
# What the step reads of one lookup's plan, in queue order, and their dtypes.
_PLAN_FIELDS = ("where", "order", "index", "chunk", "valid", "first", "owned",
                "rows", "restore", "reused")
_PLAN_DTYPES = (tf.int32, tf.int32, tf.int32, tf.int32, tf.int32, tf.int32, tf.int64,
                tf.int32, tf.int32, tf.int32)
# Then per key-stage round its batch ids (int64), per send group its SendPlan (int32).


@dataclasses.dataclass
class _Element:
    """One dataset element after the map: the flat components, and per lookup its routing
    and its local batch time (or None)."""

    components: Tuple[tf.Tensor, ...]
    routes: List[routing.Route]
    stamps: List[Optional[tf.Tensor]]


def _route_fn(source: trace.IteratorSource, lookups, graph: tf.Graph):
    get_next_name = source.get_next.name
    size = communication.get_rank_size()
    graph_defs = [trace.subgraph_def(lookup.source, graph) for lookup in lookups]

    times = _time_names(lookups)

    def route(*components):
        routes, stamps = [], []
        for index, (lookup, graph_def) in enumerate(zip(lookups, graph_defs)):
            parts = lookup.record.sharded
            outputs = {f"{get_next_name}:{i}": components[i]
                       for i in lookup.source.used_outputs}
            wanted = [lookup.record.ids]
            # A batch time read by several lookups is computed (and agreed) once.
            if parts.local_time is not None and times.index(parts.local_time.name) == len(stamps):
                wanted.append(parts.local_time)
            values = _replay(graph_def, outputs, wanted, f"mxrec_ids_{index}")
            routed = parts.router(values[0], size)  # routing.route, or replicated.route
            routes.append(tuple(getattr(routed, field) for field in _ROUTE_FIELDS))
            if len(values) > 1:
                stamps.append(tf.cast(values[1], tf.int64))
        return tuple(components), tuple(routes), tuple(stamps)

    return route


def _replay(graph_def, outputs, wanted: List[tf.Tensor], name: str) -> List[tf.Tensor]:
    """`wanted` computed from the element's get_next `outputs` by the replayed ops; a
    get_next output itself is taken as it is."""
    read = {ref if ":" in ref else ref + ":0"
            for node in graph_def.node for ref in node.input}
    input_map = {key: value for key, value in outputs.items() if key in read}
    names = [t.name for t in wanted if t.name not in outputs]
    imported = iter(tf.compat.v1.import_graph_def(
        graph_def, input_map=input_map, return_elements=names, name=name) if names else [])
    return [outputs[t.name] if t.name in outputs else next(imported) for t in wanted]


def _time_names(lookups) -> List[str]:
    """The distinct local batch time tensors of `lookups`, by name, in order."""
    names = []
    for lookup in lookups:
        local_time = lookup.record.sharded.local_time
        if local_time is not None and local_time.name not in names:
            names.append(local_time.name)
    return names


def _unpack(value, lookups) -> _Element:
    components, routes, stamps = value
    by_name = dict(zip(_time_names(lookups), stamps))
    element_stamps = [None if lookup.record.sharded.local_time is None
                      else by_name[lookup.record.sharded.local_time.name]
                      for lookup in lookups]
    return _Element(components=tuple(components),
                    routes=[routing.Route(*route) for route in routes],
                    stamps=element_stamps)


@dataclasses.dataclass
class _Layout:
    """How one step's lookups are planned together (the same on every rank: it depends on
    the graph only).

    Attributes:
        rounds: lists of lookup indices, each a batch of one MxrecKeyStage call and one
            commit: distinct tables of one batch time, a table's repeated lookups in later
            rounds (the rounds run in order, so a table's lookups keep creation order).
        groups: the send groups of the sharded lookups (id_exchange.send_groups).
    """

    rounds: List[List[int]]
    groups: List[List[int]]

    def width(self, lookups: int) -> int:
        """Entries of the queue after the components."""
        return (lookups * len(_PLAN_FIELDS) + len(self.rounds)
                + len(self.groups) * len(send_back.SendPlan.FIELDS))


def _key_rounds(lookups) -> List[List[int]]:
    """_Layout.rounds: a lookup goes into the first round after its table's previous lookup
    whose lookups read the same batch time."""
    rounds, last = [], {}  # rounds: (time name, table keys, lookup indices)
    for index, lookup in enumerate(lookups):
        key = lookup.record.table.table_key
        local_time = lookup.record.sharded.local_time
        name = None if local_time is None else local_time.name
        start = last.get(key, -1) + 1
        chosen = next((n for n in range(start, len(rounds))
                       if rounds[n][0] == name and key not in rounds[n][1]), None)
        if chosen is None:
            rounds.append((name, set(), []))
            chosen = len(rounds) - 1
        rounds[chosen][1].add(key)
        rounds[chosen][2].append(index)
        last[key] = chosen
    return [members for _, _, members in rounds]


def _layout(lookups) -> _Layout:
    keys = [None if lookup.record.table.is_dp else
            (lookup.record.sharded.exchange.emb.dtype, lookup.record.table.dim,
             _grad_scale(lookup.record.table))
            for lookup in lookups]
    return _Layout(rounds=_key_rounds(lookups), groups=id_exchange.send_groups(keys))


def _plan(element: _Element, lookups, layout: _Layout, is_train: bool, has_next: tf.Tensor):
    """The exchange and the owners' key stages of one element: (the queue's flat entry,
    whether every rank has a next element).

    Every lookup of the element shares one agreement all-reduce and one ID all-to-all
    (id_exchange.exchange_all); the agreement also tells whether every rank has a next element
    (`has_next`, this rank's). The key stages run in `layout.rounds`, and the send-back of
    each send group is planned (send_back.plan_send_backs)."""
    flat = list(element.components)
    planned = [id_exchange.PlannedLookup(lookup.name, lookup.record.table, lookup.send_count)
               for lookup in lookups]
    with tf.name_scope("exchange"):
        exchanges, timestamps, (missing,) = id_exchange.exchange_all(
            planned, element.routes, element.stamps, is_train,
            also=[-tf.cast(has_next, tf.int64)], groups=layout.groups)
    stages = [None] * len(lookups)
    batch_ids, previous = [], []
    for number, members in enumerate(layout.rounds):
        with tf.name_scope(f"key_stage_{number}"), tf.control_dependencies(previous):
            # The rounds run in order: a table's lookups are planned in creation order, as
            # the direct path chains them.
            rows, restore, reused, ids = mxrec_ops.key_stage(
                [exchanges[i].owned for i in members],
                [lookups[i].record.table.table_key for i in members], is_train,
                timestamp=timestamps[members[0]], deferred=True,
                weights=[exchanges[i].weights for i in members] if is_train else None)
        previous = [rows[0].op]
        batch_ids.append(ids)
        for n, i in enumerate(members):
            stages[i] = (rows[n], restore[n], reused[n])
    for routed, exchanged, stage in zip(element.routes, exchanges, stages):
        # A replicated lookup reads its exchange and routing in the step (its own send_back).
        flat += [routed.where, routed.order, routed.index, exchanged.chunk, exchanged.valid,
                 exchanged.first, exchanged.owned, *stage]
    flat += batch_ids
    if layout.groups:
        for plan in send_back.plan_send_backs(exchanges, element.routes, layout.groups):
            flat += [getattr(plan, field) for field in send_back.SendPlan.FIELDS]
    return flat, missing < 0  # the largest of -has_next: -1 when every rank has one


@dataclasses.dataclass
class _Planner:
    """The queue of planned batches and the subgraphs that fill it.

    The agreement "every rank has a next element" is reached one element ahead: the
    element is pulled from the local iterator into `held` (capacity 1) by the step (or
    initializer) that plans the one before it. So the step that ends with OutOfRangeError
    runs no collective: a step that fails after a collective can tear down buffers a peer
    is still reading, which aborts the ranks' collectives for good.
    """

    iterator: object
    queue: tf.queue.FIFOQueue
    ended: tf.queue.FIFOQueue  # one mark once the data ran out
    held: tf.queue.FIFOQueue  # the next element, once every rank has one
    lookups: list
    layout: _Layout
    is_train: bool

    def is_ended(self) -> tf.Tensor:
        return self.ended.size() > 0

    def pull_next(self) -> tf.Tensor:
        """Takes the next local element into `held` if every rank has one, else marks the
        end of the data (an all-reduce); returns a scalar to depend on."""
        optional = self.iterator.get_next_as_optional()
        everyone = communication.allreduce(tf.cast(optional.has_value(), tf.int32), "min")
        return self._hold_or_end(optional, everyone > 0)

    def _hold_or_end(self, optional, everyone: tf.Tensor) -> tf.Tensor:
        """Holds `optional`'s element when `everyone` (every rank has one), else marks the
        end of the data."""

        def hold():
            value = tf.nest.flatten(optional.get_value())
            with tf.control_dependencies([self.held.enqueue(value)]):
                return tf.constant(True)

        def finish():
            with tf.control_dependencies([self.ended.enqueue(tf.constant(0, tf.int32))]):
                return tf.constant(False)

        return tf.cond(everyone, hold, finish)

    def _plan_held(self) -> tf.Tensor:
        flat = self.held.dequeue()
        flat = flat if isinstance(flat, list) else [flat]
        value = tf.nest.pack_sequence_as(self.iterator.element_spec, flat)
        # The next local element is taken first: whether every rank has one is agreed in
        # the planning's own agreement all-reduce.
        optional = self.iterator.get_next_as_optional()
        entry, everyone = _plan(_unpack(value, self.lookups), self.lookups, self.layout,
                                self.is_train, optional.has_value())
        with tf.control_dependencies([self.queue.enqueue(entry)]):
            return self._hold_or_end(optional, everyone)

    def plan_once(self) -> tf.Tensor:
        """One planning subgraph (its own collectives and instance keys): plans the held
        element and pulls the one after it. Before the first (a one-shot iterator whose
        initializer was not run) it pulls one first."""
        primed = tf.cond(self.held.size() > 0, lambda: tf.constant(True), self.pull_next)
        with tf.control_dependencies([primed]):
            return tf.cond(self.is_ended(), lambda: tf.constant(False), self._plan_held)

    def plan_if(self, wanted: tf.Tensor) -> tf.Tensor:
        """plan_once when `wanted` and the data has not ended (the same on every rank)."""
        go = tf.logical_and(wanted, tf.logical_not(self.is_ended()))
        return tf.cond(go, self.plan_once, lambda: tf.constant(False))


def _drain(queue: tf.queue.FIFOQueue) -> tf.Operation:
    """Dequeues everything `queue` holds."""
    def body(remaining):
        del remaining
        taken = queue.dequeue()
        with tf.control_dependencies(taken if isinstance(taken, list) else [taken]):
            # The size after the dequeue (a loop-invariant size op would be read once).
            return queue.size()

    return tf.group(tf.while_loop(lambda remaining: remaining > 0, body, [queue.size()]))


def _end_of_data():
    """A function whose op fails with OutOfRangeError ("End of sequence"), as the user's
    iterator would: get_next of an iterator over no element."""
    nothing = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.range(0))
    return lambda: tf.cast(nothing.get_next(), tf.int32)


_GRADIENT_SCOPE = re.compile(r"gradients(_\d+)?$")


def _gradient_scope(tensor: tf.Tensor) -> str:
    """The name scope of the tf.gradients call that built `tensor` ("" if none)."""
    parts = tensor.op.name.split("/")
    for index, part in enumerate(parts):
        if _GRADIENT_SCOPE.match(part):
            return "/".join(parts[:index + 1])
    return ""


def _grad_scale(table) -> Optional[float]:
    if table.all2all_gradients_op == "sum_gradients_and_div_by_ranksize":
        return 1.0 / communication.get_rank_size()
    return None


def _gradient_consumers(tensor: tf.Tensor) -> List[tf.Operation]:
    """The ops of a tf.gradients backward pass that read `tensor`."""
    return [op for op in tensor.consumers()
            if any(_GRADIENT_SCOPE.match(part) for part in op.name.split("/"))]


def rebuild(source: trace.IteratorSource, lookups, is_train: bool, prefetch: int,
            graph: tf.Graph):
    """The rewritten iterator of `source` for lookups of sharded tables.

    Returns:
        pipeline.RewrittenIterator, whose `replacements` map each lookup's routing and
        exchange tensors in the user's graph to the planned ones.
    """
    specs = trace.output_specs(source.get_next)
    scope = source.get_next.name.replace(":", "_") + "_mxrec"
    with graph.as_default(), tf.name_scope(scope), tf.device("/device:CPU:0"):
        kind_initializer, planner = _make_planner(source, specs, lookups, is_train, prefetch,
                                                  graph)
        entry, planned_next = _dequeue_planned(planner, prefetch)
        outputs, planned, round_ids, plans = _unpack_entry(entry, specs, len(lookups),
                                                           planner.layout)
        if is_train:
            _commit_rounds(planned, round_ids, planner.layout, lookups)
        replacements = _lookup_replacements(lookups, planned)
        replacements += _fused_send_backs(lookups, planner.layout, plans, planned_next,
                                          prefetch, replacements)
        initializer = _initializer(kind_initializer, planner)
    return pipeline.RewrittenIterator(
        source=source, is_train=is_train, kind=source.kind, initializer=initializer,
        outputs=outputs, rows=[p["rows"] for p in planned],
        restore=[p["restore"] for p in planned], reused=[p["reused"] for p in planned],
        replacements=replacements)


def _make_planner(source: trace.IteratorSource, specs, lookups, is_train: bool, prefetch: int,
                  graph: tf.Graph) -> Tuple[tf.Operation, _Planner]:
    """(the local iterator's initializer, the planner): the dataset mapped through the
    routing, its local iterator, and the queues of planned batches, of the end mark and of
    the next element."""
    _, kind_initializer, iterator = pipeline.make_dataset_iterator(
        source, specs, _route_fn(source, lookups, graph), prefetch)
    component_dtypes = [spec.dtype for spec in specs]
    layout = _layout(lookups)
    queue = tf.queue.FIFOQueue(
        prefetch + 1, component_dtypes + list(_PLAN_DTYPES) * len(lookups)
        + [tf.int64] * len(layout.rounds)
        + [tf.int32] * (len(layout.groups) * len(send_back.SendPlan.FIELDS)),
        name="planned_batches")
    ended = tf.queue.FIFOQueue(1, [tf.int32], shapes=[[]], name="data_ended")
    held = tf.queue.FIFOQueue(
        1, [spec.dtype for spec in tf.nest.flatten(iterator.element_spec)],
        name="next_element")
    return kind_initializer, _Planner(iterator=iterator, queue=queue, ended=ended, held=held,
                                      lookups=lookups, layout=layout, is_train=is_train)


def _dequeue_planned(planner: _Planner, prefetch: int) -> Tuple[List[tf.Tensor], tf.Tensor]:
    """(the step's planned entry, the planning of the next batch): the queue topped up to
    `prefetch` planned batches, one copy of the planning per missing batch, then one batch
    planned ahead; the dequeue fails with OutOfRangeError once the data ended and the queue
    is empty."""
    queue = planner.queue
    filled = []
    for copy in range(prefetch):
        with tf.name_scope(f"fill_{copy}"), tf.control_dependencies(filled):
            filled = [planner.plan_if(queue.size() < prefetch)]
    with tf.name_scope("plan_next"), tf.control_dependencies(filled):
        planned_next = planner.plan_if(tf.constant(True))
    before_dequeue = filled if prefetch > 0 else [planned_next]
    end_of_data = _end_of_data()
    with tf.control_dependencies(before_dequeue):
        exhausted = tf.logical_and(planner.is_ended(), tf.equal(queue.size(), 0))
        check = tf.cond(exhausted, end_of_data, lambda: tf.constant(0, tf.int32))
        with tf.control_dependencies([check]):
            entry = queue.dequeue()
    return (list(entry) if isinstance(entry, (list, tuple)) else [entry]), planned_next


def _unpack_entry(entry: List[tf.Tensor], specs, lookups: int, layout: _Layout):
    """A dequeued entry as (the element's outputs, shaped as the user's; per lookup its
    plan by field; per key-stage round its batch ids; per send group its SendPlan)."""
    outputs = entry[:len(specs)]
    for output, spec in zip(outputs, specs):
        output.set_shape(spec.shape)
    per_lookup = len(_PLAN_FIELDS)
    planned = [dict(zip(_PLAN_FIELDS, entry[len(specs) + i * per_lookup:
                                             len(specs) + (i + 1) * per_lookup]))
               for i in range(lookups)]
    rest = entry[len(specs) + lookups * per_lookup:]
    round_ids, rest = rest[:len(layout.rounds)], rest[len(layout.rounds):]
    per_group = len(send_back.SendPlan.FIELDS)
    plans = [send_back.SendPlan(*rest[g * per_group:(g + 1) * per_group])
             for g in range(len(layout.groups))]
    return outputs, planned, round_ids, plans


def _commit_rounds(planned, round_ids, layout: _Layout, lookups) -> None:
    """The step that reads a batch's planned rows trains it: commit there, one commit per
    key-stage round (each lookup's rows and reused rows then read after it)."""
    for members, ids in zip(layout.rounds, round_ids):
        committed = mxrec_ops.after_commit(
            [planned[i][field] for i in members for field in ("rows", "reused")], ids,
            [lookups[i].record.table.table_key for i in members])
        for n, i in enumerate(members):
            planned[i]["rows"], planned[i]["reused"] = committed[2 * n:2 * n + 2]


def _lookup_replacements(lookups, planned) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """(tensor of the user's graph, planned tensor) for each lookup's exchanged IDs (and a
    replicated lookup's routing and exchange); the plan's tensors take the shapes of the
    ones they replace."""
    replacements = []
    for lookup, plan in zip(lookups, planned):
        record, parts = lookup.record, lookup.record.sharded
        old = dict(owned=parts.exchange.owned)
        if record.table.is_dp:
            # A replicated lookup's own send_back reads its routing and exchange; the
            # first replacement is what the next planning may gate (its `where`).
            old = dict(where=parts.route.where, order=parts.route.order,
                       index=parts.route.index, chunk=parts.exchange.chunk,
                       valid=parts.exchange.valid, first=parts.exchange.first, **old)
        for field, tensor in old.items():
            plan[field].set_shape(tensor.shape)
            replacements.append((tensor, plan[field]))
        plan["restore"].set_shape(record.restore.shape)
        plan["rows"].set_shape(record.rows.shape)
        plan["reused"].set_shape(record.reused.shape)
    return replacements


def _fused_send_backs(lookups, layout: _Layout, plans, planned_next: tf.Tensor, prefetch: int,
                      replacements) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """The replacements of the lookups' send-backs by one embedding all-to-all forward and
    one gradient all-to-all per backward pass for all lookups of the step
    (send_back.send_back_all, from the planned SendPlans).

    With prefetch p > 0 the writes of the gradients into the tables (without a backward
    pass, the forward send-back) wait for the planning of batch k + p, so the planning
    overlaps the step's exchanges and model (with prefetch 0 the dequeue waits for it
    already); where nothing was gated, `replacements` is rewired to wait for it."""
    fused, gated = send_back.send_back_all(
        [lookup.record.sharded.exchange for lookup in lookups], layout.groups, plans,
        [_grad_scale(lookup.record.table) for lookup in lookups], _gradient_scope,
        after=[planned_next] if prefetch > 0 else [])
    if prefetch > 0 and not gated:
        _schedule_next_plan(planned_next, replacements)
    return fused


def _initializer(kind_initializer: tf.Operation, planner: _Planner) -> tf.Operation:
    """Restarts the local iterator, drops the planned batches and the end mark, and pulls
    the first element."""
    restart = [kind_initializer, _drain(planner.queue), _drain(planner.ended),
               _drain(planner.held)]
    # Every rank runs its initializer at the same point of its program: it pulls the
    # first element (and agrees that every rank has one).
    with tf.name_scope("prime"), tf.control_dependencies(restart):
        primed = planner.pull_next()
    return tf.group(primed, name="initializer")


def _schedule_next_plan(planned_next: tf.Tensor, replacements) -> None:
    """Makes the step run `planned_next` (planning batch k + p while batch k trains) where
    send_back.send_back_all had nothing to gate (replicated lookups only, no backward pass):
    the first lookup's routing is read through an identity that waits for it."""
    old, new = replacements[0]  # the first (replicated) lookup's `where`
    with tf.control_dependencies([planned_next]):
        waiting = tf.identity(new)
    backward = _gradient_consumers(old)
    if not backward:
        replacements[0] = (old, waiting)
        return
    for consumer in backward:
        for position, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer._update_input(position, waiting)  # pylint: disable=protected-access
