"""Trains tests/test_keras_*.py's model with mxrec.keras in a process of its own (eager
mode: the test process runs TF1 graph mode, see conftest.py).

    python keras_worker.py DATA.npz OUT_PREFIX MODE [MODE ...]

MODE: fit (Model.fit), function (a tf.function step with tf.GradientTape), eager (the same
step eagerly), resume (Model.fit on the first half, tf.train.Checkpoint, a new init() and
model restored from it, Model.fit on the rest), weights_resume (the same through
model.save_weights("x.weights.h5") / load_weights), ckpt_resume (the same through
mk.callbacks.Checkpoint, mxrec's full/delta format, in settings["ckpt_dir"]), to_session
(Model.fit on the first half with that callback), from_session (Model.fit on the second half,
the callback restoring settings["ckpt_dir"] first), warm (mk.warm_start from it); each trains
from the start under its own init(). DATA.npz holds the batches, the initial values and the
settings. fit_planned and function_planned: fit and function over the dataset of
mk.data.plan_ahead (prefetch settings["prefetch"], 2 by default); function_planned_retrace:
the same step without an input_signature (traced anew for each new shape); ckpt_mid_planned:
Model.fit over all steps with plan_ahead and mk.callbacks.Checkpoint(full_every=half) in
settings["ckpt_dir"], then a new init() and model restored from the version at the half
(saved while later batches were planned), Model.fit on the rest without plan_ahead.
OUT_PREFIX<MODE>.npz gets the table's rows and slots by ID, the dense weights and the host
statistics.
"""

import json
import sys

import numpy as np
import tensorflow as tf

import mxrec.keras as mk
from mxrec.keras import _compat

SLOTS = {"sgd": (), "adagrad": ("accumulator",), "lazy_adam": ("m", "v")}


def build(settings, init):
    mk.init()
    policy = {key: settings[key] for key in ("access_threshold", "eviction_threshold")
              if settings.get(key) is not None}
    initializer = (tf.keras.initializers.Constant(settings["constant_init"])
                   if settings.get("constant_init") is not None else None)
    tier = {}
    if settings.get("host"):
        tier = dict(host_vocabulary_size=settings["host"],
                    ssd_vocabulary_size=settings.get("ssd", 0))
    if settings.get("ssd"):
        tier["ssd_data_path"] = [f"{settings['ssd_dir']}/{settings['mode']}"]
    if settings.get("is_dp"):
        tier["is_dp"] = True
    if settings.get("storage"):  # half-precision rows
        tier["storage_dtype"] = settings["storage"]
    layer = mk.Embedding(settings["dim"], "user", settings["capacity"],
                         embeddings_initializer=initializer, combiner=settings.get("combiner"),
                         **policy, **tier)
    if initializer is None:
        layer.embeddings.assign(init["table"])
    ids = tf.keras.Input([settings["width"]], dtype=tf.int64, name="ids")
    dense = tf.keras.Input([settings["dense"]], name="dense")
    stamp = tf.keras.Input([], dtype=tf.int64, name="ts")
    if settings.get("group"):  # a second table of twice the dim, both in one EmbeddingGroup
        item = mk.Embedding(2 * settings["dim"], "item", settings["capacity"],
                            embeddings_initializer=initializer, **policy)
        other = tf.keras.layers.Lambda(lambda x: x * 7919 + 13, name="item_ids")(ids)
        looked = mk.EmbeddingGroup([layer, item], name="tables")([ids, other], timestamp=stamp)
        parts = [tf.keras.layers.Flatten()(emb) for emb in looked]
    else:
        parts = [tf.keras.layers.Flatten()(layer(ids, timestamp=stamp))]
    head = tf.keras.layers.Dense(1, name="head")
    out = head(tf.keras.layers.Concatenate()([*parts, dense]))
    model = tf.keras.Model([ids, dense, stamp], out)
    head.set_weights([init["w"], init["b"]])
    return model, layer


def optimizer(settings):
    if settings["optimizer"] == "sgd":
        return mk.optimizers.SGD(settings["lr"])
    if settings["optimizer"] == "lazy_adam":
        return mk.optimizers.LazyAdam(settings["lr"], beta_1=settings["beta1"],
                                      beta_2=settings["beta2"], epsilon=settings["epsilon"])
    return mk.optimizers.Adagrad(settings["lr"], initial_accumulator_value=settings["acc0"],
                                 epsilon=settings["epsilon"])


def session_names(opt, model):
    """{Keras name: name in tests/test_keras_checkpoint_interop.py's Session graph}: the
    head's weights are w and b there, their optimizer slots acc_w, m_w, v_w, ... (Keras 2
    names an optimizer slot `<Opt>/<slot>/head/kernel`, Keras 3 `<opt>/head_kernel_<slot>`)."""
    from mxrec.keras import saving  # noqa: PLC0415

    saving.build_optimizer(opt, model)  # its slots of the head's weights exist from here on
    names = {"head/kernel": "w", "head/bias": "b"}
    slots = {"accumulator": "acc", "m": "m", "momentum": "m", "v": "v", "velocity": "v"}
    tables = [layer.table for layer in saving.embedding_layers(model)]
    for name in saving.dense_variables(model, opt, tables):
        if name in names:
            continue
        parts = name.replace("head_kernel", "head/kernel").replace("head_bias", "head/bias")
        for target, short in (("head/kernel", "w"), ("head/bias", "b")):
            if target in parts:
                rest = parts.replace(target, "").replace(opt.name, "").strip("/_").split("/")
                rest = [r for r in rest if r and r.lower() != opt.name.lower()]
                names[name] = f"{slots[rest[-1].strip('_')]}_{short}"
    return names


def checkpoint_callback(settings, opt, model):
    dense_names = session_names(opt, model) if settings.get("session_names") else None
    return mk.callbacks.Checkpoint(settings["ckpt_dir"], full_every=settings.get("full_every"),
                                   delta_every=settings.get("delta_every"),
                                   dense_names=dense_names)


def train(mode, data, settings, model, layer, opt, checkpoint=False):
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    every = settings.get("evict_every")
    steps = len(data["ids"])
    if mode.endswith(("_planned", "_planned_retrace")):
        return train_planned(mode, data, settings, model, layer, opt, loss_fn)
    if mode == "fit":
        metrics = []
        if settings.get("global_metrics"):  # over the global batch on several ranks
            metrics = [mk.metrics.Global(tf.keras.metrics.AUC(name="auc")),
                       mk.metrics.Global(tf.keras.metrics.BinaryAccuracy(name="acc",
                                                                         threshold=0.0))]
        model.compile(optimizer=opt, loss=loss_fn, metrics=metrics)
        dataset = tf.data.Dataset.from_tensor_slices(
            ((data["ids"], data["dense"], data["ts"]), data["y"]))
        callbacks = [mk.callbacks.Evict(every_steps=every)] if every else []
        if checkpoint:
            callbacks.append(checkpoint_callback(settings, opt, model))
        history = model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks).history
        if not metrics:  # the other tests compare the outputs' keys
            return {}
        return {f"history_{key}": np.float64(values[-1]) for key, values in history.items()}

    def step(ids, dense, ts, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model([ids, dense, ts], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if mode == "function":
        step = tf.function(step)
    for i in range(steps):
        step(data["ids"][i], data["dense"][i], data["ts"][i], data["y"][i])
        if every and (i + 1) % every == 0:
            layer.evict()
    if mode == "function" and mk.rank_and_size()[1] > 1:  # one traced step's collectives
        graph = step.get_concrete_function(data["ids"][0], data["dense"][0], data["ts"][0],
                                           data["y"][0]).graph
        kinds = [op.type for op in graph.get_operations()]
        return {"collectives": np.array([kinds.count("MxrecMpiAlltoallv"),
                                         kinds.count("MxrecMpiAllreduce")])}
    return {}


def train_planned(mode, data, settings, model, layer, opt, loss_fn, callbacks=()):
    """fit_planned / function_planned / ckpt_mid_planned's fit: the batches through
    mk.data.plan_ahead."""
    every = settings.get("evict_every")
    dataset = mk.data.plan_ahead(tf.data.Dataset.from_tensor_slices(
        ((data["ids"], data["dense"], data["ts"]), data["y"])), model,
        prefetch=settings.get("prefetch", 2))
    if not mode.startswith("function_planned"):
        model.compile(optimizer=opt, loss=loss_fn)
        callbacks = [*callbacks, *([mk.callbacks.Evict(every_steps=every)] if every else [])]
        model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks)
        return {}

    # One trace for every batch (the plans' shapes vary from batch to batch), or, for
    # function_planned_retrace, a trace per new shape: on several ranks at different steps.
    signature = None if mode.endswith("_retrace") else [dataset.element_spec]

    @tf.function(input_signature=signature)
    def step(element):
        with mk.data.use_plans(model, element) as (x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(list(x), training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    traced_at = []  # the steps that traced the step anew
    for i, element in enumerate(dataset):  # eviction while later batches are planned
        traces = step.experimental_get_tracing_count()
        step(element)
        if step.experimental_get_tracing_count() > traces:
            traced_at.append(i)
        if every and (i + 1) % every == 0:
            layer.evict()
    # Only the retracing mode reports its traces: the tests compare every other output by ID.
    return {"traced_at": np.array(traced_at, np.int64)} if mode.endswith("_retrace") else {}


def ranks_extras(settings, data, model, out_path):
    """On several ranks after training: the refused checkpoint formats (their errors; in
    one process they save into settings["saved_dir"], which the ranks then fail to restore,
    weights unchanged), model.evaluate's loss, and mk.export_serving (rank 0's SavedModel
    against model(x, training=False) on rank 0's slice of the last batch)."""
    import tempfile  # noqa: PLC0415

    saved = settings["saved_dir"]
    alone = mk.rank_and_size()[1] == 1
    refused = []
    opt = model.optimizer

    def state():  # the weights, the optimizer's variables and its table slots
        slots = [opt.table_slot(layer, slot) for layer in mk.embedding_layers(model)
                 for slot in SLOTS[settings["optimizer"]]]
        return [np.array(v.numpy()) for v in [*model.weights, *opt.variables, *slots]]

    # Keras 3 loads every other object of a weights file before it raises what failed (one
    # ValueError quoting the objects' errors), so there the model is compared before
    # load_weights; Keras 2 stops at the first refusal, so there after it.
    keras3 = _compat.keras_major() >= 3
    before = state()
    unchanged = True
    for what, call in (
            ("tf.train.Checkpoint",
             lambda: tf.train.Checkpoint(model=model).save(
                 f"{saved}/c" if alone else tempfile.mkdtemp() + "/c")),
            ("save_weights", lambda: model.save_weights(
                f"{saved}/m.weights.h5" if alone else tempfile.mkdtemp() + "/m.weights.h5")),
            *(() if alone else (
                ("tf.train.Checkpoint restore",
                 lambda: tf.train.Checkpoint(model=model).restore(f"{saved}/c-1")),
                ("load_weights", lambda: model.load_weights(f"{saved}/m.weights.h5"))))):
        if keras3 and what == "load_weights":
            unchanged = all(np.array_equal(a, b) for a, b in zip(state(), before))
        try:
            call()
            refused.append(f"{what}: saved")
        except NotImplementedError as error:
            refused.append(f"{what}: {error}")
        except ValueError as error:  # Keras 3's load_weights: the refusals quoted
            if not (keras3 and what == "load_weights"):
                raise
            refused.append(f"{what}: {error}")
    if not (keras3 and not alone):
        unchanged = all(np.array_equal(a, b) for a, b in zip(state(), before))
    inputs = (data["ids"][-1], data["dense"][-1], data["ts"][-1])
    evaluated = model.evaluate(
        tf.data.Dataset.from_tensor_slices((inputs, data["y"][-1])).batch(len(data["y"][-1])),
        verbose=0)
    export_dir = settings["export_dir"]
    mk.export_serving(model, export_dir)
    expected = model(list(inputs), training=False).numpy()
    extras = dict(refused=np.array(refused), unchanged=np.array(unchanged),
                  evaluated=np.atleast_1d(evaluated), expected=expected)
    if mk.rank_and_size()[0] == 0:
        served = tf.saved_model.load(export_dir).signatures["serving_default"]
        got = served(ids=tf.constant(inputs[0]), dense=tf.constant(inputs[1]),
                     ts=tf.constant(inputs[2]))
        extras["served"] = next(iter(got.values())).numpy()
    return extras


def main(data_path, out_prefix, *modes):
    for mode in modes:
        run(data_path, out_prefix, mode)
        tf.keras.backend.clear_session()


def run(data_path, out_prefix, mode):
    """Trains `mode` into OUT_PREFIX<MODE>.npz; on several ranks (under mxrec.launch) each
    rank trains on its slice of every global batch (rows [r B / N, (r + 1) B / N)) and
    writes OUT_PREFIX<MODE>.rank<R>.npz."""
    data = dict(np.load(data_path))
    extras = {}
    settings = dict(json.loads(str(data.pop("settings"))), mode=mode)
    init = {key: data.pop(key) for key in ("table", "w", "b")}
    model, layer = build(settings, init)
    rank, size = mk.rank_and_size()
    out_path = f"{out_prefix}{mode}.npz" if size == 1 else f"{out_prefix}{mode}.rank{rank}.npz"
    if size > 1:
        batch = data["ids"].shape[1]
        mine = slice(rank * batch // size, (rank + 1) * batch // size)
        data = {key: value[:, mine] for key, value in data.items()}
    opt = optimizer(settings)
    if mode == "resume":  # Model.fit on the first half, a checkpoint, a new init(), the rest
        half = len(data["ids"]) // 2
        train("fit", {k: v[:half] for k, v in data.items()}, settings, model, layer, opt)
        path = tf.train.Checkpoint(model=model, optimizer=opt).save(
            out_path[:-len(".npz")] + "_ckpt/ckpt")
        tf.keras.backend.clear_session()
        model, layer = build(settings, init)  # new host tables, fresh rows
        opt = optimizer(settings)
        tf.train.Checkpoint(model=model, optimizer=opt).restore(
            path).assert_existing_objects_matched()
        train("fit", {k: v[half:] for k, v in data.items()}, settings, model, layer, opt)
    elif mode == "weights_resume":  # the same through model.save_weights / load_weights
        from mxrec.keras import saving  # noqa: PLC0415

        half = len(data["ids"]) // 2
        train("fit", {k: v[:half] for k, v in data.items()}, settings, model, layer, opt)
        path = out_path[:-len(".npz")] + ".weights.h5"
        model.save_weights(path)
        tf.keras.backend.clear_session()
        model, layer = build(settings, init)
        opt = optimizer(settings)
        model.compile(optimizer=opt, loss="mse")
        saving.build_optimizer(opt, model)  # Keras loads an optimizer's state once it is built
        model.load_weights(path)
        train("fit", {k: v[half:] for k, v in data.items()}, settings, model, layer, opt)
    elif mode == "ckpt_resume":  # the same through mk.callbacks.Checkpoint (mxrec's format)
        half = len(data["ids"]) // 2
        train("fit", {k: v[:half] for k, v in data.items()}, settings, model, layer, opt, True)
        tf.keras.backend.clear_session()
        model, layer = build(settings, init)
        opt = optimizer(settings)
        train("fit", {k: v[half:] for k, v in data.items()}, settings, model, layer, opt, True)
    elif mode == "ckpt_mid_planned":  # a save mid-fit with batches planned ahead
        from mxrec.keras import saving  # noqa: PLC0415

        half = len(data["ids"]) // 2
        loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
        train_planned(mode, data, settings, model, layer, opt, loss_fn, [
            mk.callbacks.Checkpoint(settings["ckpt_dir"], full_every=half, max_to_keep=None)])
        tf.keras.backend.clear_session()
        model, layer = build(settings, init)
        opt = optimizer(settings)
        model.compile(optimizer=opt, loss=loss_fn)
        saving.build_optimizer(opt, model)
        saving.KerasSaver(settings["ckpt_dir"], model, opt, max_to_keep=None).restore(half)
        train("fit", {k: v[half:] for k, v in data.items()}, settings, model, layer, opt)
    elif mode == "to_session":  # the first half, checkpointed for the Session path
        half = len(data["ids"]) // 2
        train("fit", {k: v[:half] for k, v in data.items()}, settings, model, layer, opt, True)
    elif mode == "from_session":  # the second half, from the Session path's checkpoint
        half = len(data["ids"]) // 2
        train("fit", {k: v[half:] for k, v in data.items()}, settings, model, layer, opt, True)
    elif mode == "ranks_extras":  # Model.fit, then what several ranks offer beside training
        extras = train("fit", data, settings, model, layer, opt)
        extras.update(ranks_extras(settings, data, model, out_path))
    elif mode == "warm":  # mk.warm_start from settings["ckpt_dir"], no training
        model.compile(optimizer=opt, loss="mse")
        names = session_names(opt, model) if settings.get("session_names") else None
        loaded = mk.warm_start(model, settings["ckpt_dir"], ".*", optimizer=opt,
                               dense_names=names)
        assert sorted(loaded) == ["b", "user", "w"], loaded
    else:
        extras = train(mode, data, settings, model, layer, opt) or {}
    ids, rows = layer.export_rows()
    table = layer.embeddings.numpy() if hasattr(layer.embeddings, "numpy") else \
        np.asarray(layer.embeddings)
    out = dict(ids=ids, rows=rows, values=table[rows],
               w=model.get_layer("head").get_weights()[0],
               b=model.get_layer("head").get_weights()[1],
               stats=json.dumps({k: int(v) for k, v in layer.stats().items()}
                                | (layer.tier_stats() if settings.get("host") else {})))
    for slot in SLOTS[settings["optimizer"]]:
        out[f"slot_{slot}"] = opt.table_slot(layer, slot).numpy()[rows]
    for other in mk.embedding_layers(model):  # a group's second table
        if other is not layer:
            other_ids, other_rows = other.export_rows()
            out["item_ids"], out["item_values"] = other_ids, other.embeddings.numpy()[other_rows]
    if settings.get("host"):  # every admitted ID's row and slots, wherever they live
        for component, (all_ids, all_values) in layer.export_values(opt).items():
            name = component.split("/")[-1]
            out[f"all_ids_{name}"], out[f"all_{name}"] = all_ids, all_values
    # half-precision rows as float32 (exact): NumPy files have no bfloat16
    np.savez(out_path, **{k: v.astype(np.float32) if getattr(v, "dtype", None) in
                          (tf.bfloat16.as_numpy_dtype, np.float16) else v
                          for k, v in {**out, **extras}.items()})


if __name__ == "__main__":
    main(*sys.argv[1:])
