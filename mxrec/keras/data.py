"""`plan_ahead`: the key stage of a model's mxrec tables in the tf.data pipeline, ahead of
the step that trains the batch.

    dataset ─► map(plan) ─► prefetch(p) ─► Model.fit / a tf.function loop
                 │
                 └ the model's ID preprocessing (the ops between its inputs and each
                   table's lookup, cut out of a trace of the model) and, on one rank, the
                   deferred key stage of every training lookup: element -> (element, plans)

On one rank the plan is the key stage's (unique rows, restore indexes, rows handed to new
IDs), made with `deferred=True`: the engine keeps the batch *pending* until the step that
trains it commits it, so saves, evaluation and eviction see trained steps only, however far
ahead the pipeline runs (docs/ARCHITECTURE.md, "The step boundary"). On several ranks the
plan is each rank's routing of its own slice (local dedupe, occurrence counts, owner
buckets); the ID exchange and the owners' key stages stay in the step, where the ranks'
collectives run in lockstep.

The step hands the plans to the layers (mxrec.keras.planning): Model.fit through a
`train_step` that plan_ahead puts in front of the model's own (once per model; elements
without plans pass through it unchanged), a loop of the user's through `use_plans`.
"""

import contextlib
import dataclasses
from typing import Dict, List, Tuple

import tensorflow as tf

from mxrec.distributed import communication, replicated, routing
from mxrec.keras import planning
from mxrec.keras.layers import embedding_layers
from mxrec.util import ops as mxrec_ops

PLANS = "mxrec_plans"  # the key of the plans in a planned element's second part
_WRAPPED = "_mxrec_plan_ahead_steps"  # marks a model whose steps plan_ahead wrapped


def plan_ahead(dataset: tf.data.Dataset, model, prefetch: int = 2) -> tf.data.Dataset:
    """The dataset with the key stage of `model`'s mxrec tables run in its pipeline.

    Each element becomes (element, plans); `prefetch` planned batches wait between the
    pipeline and the step, so the key stage of batch k + prefetch runs while step k trains.
    Train it with `model.fit` (plan_ahead makes the model's train_step hand the plans to its
    layers) or in a loop of your own through `use_plans`. Evaluation takes the dataset
    without plan_ahead: an evaluation batch must read the tables as they are when it runs.

    Args:
        dataset: a tf.data.Dataset of Keras elements: `x`, `(x,)`, `(x, y)` or
            `(x, y, sample_weight)`, where `x` is what the model is called on.
        model: the Keras model (built) whose mxrec.keras Embedding layers (and
            EmbeddingGroups) look the batch up; its lookups' IDs may be computed from `x`
            by any ops that read no variable and no lookup table.
        prefetch: planned batches kept ready (>= 1).

    Returns:
        The planned dataset.

    Raises:
        TypeError: dataset is not a tf.data.Dataset; prefetch not an int.
        ValueError: prefetch < 1; a model without mxrec.keras Embedding layers, or whose
            trace makes no training lookup; an element whose `x` the model cannot be called
            on; IDs computed from something other than `x`.
        NotImplementedError: on several ranks with the gRPC engine (mxrec.keras trains on
            the MPI engine only).

    Example:
        >>> planned = mk.data.plan_ahead(dataset.batch(4096), model, prefetch=2)
        >>> model.fit(planned, epochs=1)  # each step: [4096, ...] batch, its plans ready
    """
    _check_arguments(dataset, model, prefetch)
    specs = dataset.element_spec
    x_spec = _x_of(specs)
    lookups, ids_fn = _trace_lookups(model, x_spec)
    rounds = _rounds(lookups)
    size = communication.get_rank_size()

    def plan(*element):
        element = element[0] if len(element) == 1 else element
        flat = tf.nest.flatten(_x_of(element), expand_composites=True)
        outputs = ids_fn(*flat)
        ids, stamps = outputs[:len(lookups)], outputs[len(lookups):]
        plans, batch_ids = _plan(lookups, rounds, ids, stamps, size)
        return element, {PLANS: (tuple(plans), tuple(batch_ids))}

    _wrap_steps(model, lookups, rounds)
    # Sequential (deterministic) map: the batches are planned in the order they train.
    return dataset.map(plan).prefetch(prefetch)


def _check_arguments(dataset, model, prefetch) -> None:
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError("mxrec.keras.data.plan_ahead: dataset must be a tf.data.Dataset, got "
                        f"{type(dataset).__name__}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int):
        raise TypeError("mxrec.keras.data.plan_ahead: prefetch must be an int, got "
                        f"{prefetch!r}")
    if prefetch < 1:
        raise ValueError(f"mxrec.keras.data.plan_ahead: prefetch must be >= 1 (planned "
                         f"batches kept ready), got {prefetch}")
    if not embedding_layers(model):
        raise ValueError("mxrec.keras.data.plan_ahead: the model has no mxrec.keras "
                         "Embedding layer, so there is no key stage to plan ahead")
    if not model.built:
        raise ValueError("mxrec.keras.data.plan_ahead: build the model first (a functional "
                         "model is; call a subclassed one on a batch)")


def _x_of(element):
    """`x` of a Keras element: x, (x,), (x, y) or (x, y, sample_weight)."""
    if isinstance(element, tuple) and 1 <= len(element) <= 3:
        return element[0]
    return element


def _trace_lookups(model, x_spec) -> Tuple[List[planning.Lookup], object]:
    """The model's training lookups (a trace of model(x, training=True)), and a function
    from x's flat components to their IDs and batch times."""
    flat_specs = tf.nest.flatten(x_spec, expand_composites=True)
    recorder = planning.Recorder()

    def trace(*flat):
        x = tf.nest.pack_sequence_as(x_spec, list(flat), expand_composites=True)
        with planning.active(recorder):
            model(x, training=True)

    try:
        wrapped = tf.compat.v1.wrap_function(trace, flat_specs)
    except (TypeError, ValueError) as error:
        raise ValueError("mxrec.keras.data.plan_ahead: the model cannot be called on the "
                         f"dataset's x ({x_spec}): {error}") from error
    lookups = recorder.lookups
    if not lookups:
        raise ValueError("mxrec.keras.data.plan_ahead: model(x, training=True) made no "
                         "lookup of an mxrec.keras Embedding layer on the dataset's x")
    fetches = [lookup.ids for lookup in lookups]
    fetches += [lookup.stamp for lookup in lookups if lookup.stamp is not None]
    try:
        ids_fn = wrapped.prune(wrapped.inputs, fetches)
    except (TypeError, ValueError) as error:
        raise ValueError(
            "mxrec.keras.data.plan_ahead: the IDs of the model's lookups must be computed "
            "from x by ops that read no variable and no lookup table (they run in the input "
            f"pipeline): {error}") from error
    return lookups, ids_fn


def _rounds(lookups: List[planning.Lookup]) -> List[List[int]]:
    """One rank: the lookups grouped into key-stage calls (a table at most once per call,
    one batch time and one ID dtype per call), in trace order: a table's second lookup of
    a step plans after its first, as the step's chain of key stages would."""
    if not lookups or lookups[0].kind != planning.OWNED:
        return []
    rounds: List[List[int]] = []
    modes: List[Tuple] = []
    last_round: Dict[str, int] = {}
    for index, lookup in enumerate(lookups):
        mode = (None if lookup.stamp is None else lookup.stamp.ref(), lookup.ids.dtype)
        start = last_round.get(lookup.table.table_key, -1) + 1
        while start < len(rounds) and modes[start] != mode:
            start += 1
        if start == len(rounds):
            rounds.append([])
            modes.append(mode)
        rounds[start].append(index)
        last_round[lookup.table.table_key] = start
    return rounds


def _plan(lookups, rounds, ids, stamps, size: int):
    """Inside the pipeline: each lookup's plan, and each key-stage call's batch ids."""
    stamp_of, stamps = [], list(stamps)
    for lookup in lookups:
        stamp_of.append(None if lookup.stamp is None else stamps.pop(0))
    if size > 1:  # routing.Route's fields as a tuple (tf.data carries no dataclass)
        routes = [(replicated.route if lookup.is_dp else routing.route)(flat, size)
                  for lookup, flat in zip(lookups, ids)]
        return [tuple(getattr(route, field.name) for field in dataclasses.fields(route))
                for route in routes], []
    plans = [None] * len(lookups)
    batch_ids, previous = [], []
    for members in rounds:
        stamp = stamp_of[members[0]]
        with tf.control_dependencies(previous):
            rows, restore, reused, round_ids = mxrec_ops.key_stage(
                [ids[i] for i in members], [lookups[i].table.table_key for i in members],
                True, timestamp=None if stamp is None else tf.cast(stamp, tf.int64),
                deferred=True)
        previous = [rows[0].op]
        batch_ids.append(round_ids)
        for slot, i in enumerate(members):
            plans[i] = (rows[slot], restore[slot], reused[slot])
    return plans, batch_ids


def split(data):
    """(element, StepPlans) of a planned element, or (data, None) of another."""
    if (isinstance(data, tuple) and len(data) == 2 and isinstance(data[1], dict)
            and set(data[1]) == {PLANS}):
        return data[0], data[1][PLANS]
    return data, None


@contextlib.contextmanager
def use_plans(model, data):
    """Hands a planned element's plans to the layers of `model` in the step inside the
    block, and yields the element as the dataset had it before plan_ahead (for a loop of
    your own; Model.fit does this itself).

    Example:
        >>> @tf.function
        ... def step(data):
        ...     with mk.data.use_plans(model, data) as (x, y):
        ...         with tf.GradientTape() as tape:
        ...             loss = loss_fn(y, model(x, training=True))
        ...         ...

    Raises:
        ValueError: data is not an element of a plan_ahead dataset of `model`.
        RuntimeError: the step looks the tables up otherwise than the model's trace did
            (fewer or more lookups, or with training=False).
    """
    element, plans = split(data)
    steps = getattr(model, _WRAPPED, None)
    if plans is None or steps is None:
        raise ValueError("mxrec.keras.data.use_plans: data is not an element of a "
                         "mxrec.keras.data.plan_ahead dataset of this model")
    scope = _step_plans(steps["layout"], plans)
    with planning.active(scope):
        yield element
    scope.check_consumed()


def _step_plans(layout, plans) -> planning.StepPlans:
    lookups, rounds = layout
    per_lookup, batch_ids = plans
    if len(per_lookup) != len(lookups):
        raise ValueError(f"mxrec.keras.data.plan_ahead: the element holds plans of "
                         f"{len(per_lookup)} lookups, but the model's last plan_ahead traced "
                         f"{len(lookups)}; train a planned dataset with the model it was "
                         "planned for")
    kinds = [lookup.kind for lookup in lookups]
    return planning.StepPlans([lookup.table for lookup in lookups], kinds, per_lookup,
                              rounds, batch_ids)


def _wrap_steps(model, lookups, rounds) -> None:
    """Model.fit, evaluate and predict hand a planned element's plans to the layers."""
    layout = (lookups, rounds)
    steps = getattr(model, _WRAPPED, None)
    if steps is not None:
        steps["layout"] = layout
        return
    steps = {"layout": layout}
    train_step, test_step, predict_step = model.train_step, model.test_step, model.predict_step

    def planned_train_step(data):
        element, plans = split(data)
        if plans is None:
            return train_step(data)
        scope = _step_plans(steps["layout"], plans)
        with planning.active(scope):
            logs = train_step(element)
        scope.check_consumed()
        return logs

    def refuse(step):
        def unplanned(data):
            if split(data)[1] is not None:
                raise ValueError(_EVALUATION_REFUSED)
            return step(data)
        return unplanned

    object.__setattr__(model, _WRAPPED, steps)
    model.train_step = planned_train_step
    model.test_step = refuse(test_step)
    model.predict_step = refuse(predict_step)
    _refuse_planned_evaluation(model)
    # Keras keeps the functions it built from the old steps.
    for name in ("train_function", "test_function", "predict_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)


_EVALUATION_REFUSED = (
    "mxrec.keras.data.plan_ahead: evaluate, predict and validation_data take the dataset "
    "without plan_ahead (a planned batch is planned for training; evaluation reads the "
    "tables as they are when it runs)")


def is_planned(dataset) -> bool:
    """Whether `dataset` is a tf.data.Dataset made by plan_ahead (by its element structure)."""
    if not isinstance(dataset, tf.data.Dataset):
        return False
    return split(dataset.element_spec)[1] is not None


def _refuse_planned_evaluation(model) -> None:
    """evaluate, predict and fit's validation_data refuse a planned dataset before Keras
    makes its iterator: the pipeline would plan (and leave pending) training batches that
    no step trains."""
    evaluate, predict, fit = model.evaluate, model.predict, model.fit

    def checked(call, name):
        def run(*args, **kwargs):
            given = args[0] if args else kwargs.get("x")
            if name == "fit":
                given = kwargs.get("validation_data", args[7] if len(args) > 7 else None)
            if is_planned(given):
                raise ValueError(_EVALUATION_REFUSED)
            return call(*args, **kwargs)
        return run

    model.evaluate = checked(evaluate, "evaluate")
    model.predict = checked(predict, "predict")
    model.fit = checked(fit, "fit")
