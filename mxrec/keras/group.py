"""`EmbeddingGroup`: several mxrec.keras tables looked up together, so that on several ranks
a step exchanges the IDs of all of them at once (the Session path's fused exchange).

Each `Embedding` called on its own runs its own exchange (an agreement all-reduce, an ID,
an embedding and a gradient all-to-all per lookup). Through a group, one step of any number
of tables runs one agreement all-reduce (which also agrees the batch time), one ID
all-to-all (`id_exchange.exchange_all`), one embedding all-to-all and one gradient
all-to-all (`send_back.send_back_groups`); each owner plans its share of every table with
the table's own key stage, as a lone lookup does. Replicated tables (is_dp=True) share the
agreement and the ID all-to-all; their gradient all-to-all stays their own. On one rank the
group calls each layer.

    user = mk.Embedding(16, "user", 1_000_000)
    item = mk.Embedding(32, "item", 1_000_000)
    user_emb, item_emb = mk.EmbeddingGroup([user, item])([user_ids, item_ids], timestamp=ts)
"""

from typing import List, Sequence

import tensorflow as tf

from mxrec.core.arguments import validate_ids
from mxrec.distributed import communication, id_exchange, replicated, routing, send_back
from mxrec.keras import planning
from mxrec.keras.layers import Embedding


class EmbeddingGroup(tf.keras.layers.Layer):
    """Looks up several `Embedding` layers with one exchange of IDs per step.

    Args:
        layers: the Embedding layers (distinct tables), in the order of the call's IDs.
        **kwargs: Keras Layer arguments.

    Call:
        group(ids_list, training=None, timestamp=None): one dense ID tensor [*S_i] per
        layer -> [ [*S_i, dim_i] ], as each layer's own call (training, timestamp: the
        same for every table).

    Raises:
        TypeError: a member that is not an mxrec.keras Embedding.
        ValueError: no layer, a layer twice, or a layer with a combiner (multi-hot IDs:
            call that layer on its own).
    """

    def __init__(self, layers: Sequence[Embedding], **kwargs):
        super().__init__(**kwargs)
        layers = list(layers)
        if not layers:
            raise ValueError("mxrec.keras.EmbeddingGroup: give at least one Embedding layer")
        for layer in layers:
            if not isinstance(layer, Embedding):
                raise TypeError("mxrec.keras.EmbeddingGroup: every member must be an "
                                f"mxrec.keras.Embedding, got {type(layer).__name__}")
            if layer.combiner is not None:
                raise ValueError(f"mxrec.keras.EmbeddingGroup: layer {layer.name!r} has "
                                 f"combiner={layer.combiner!r}; a group looks up dense IDs "
                                 "only (call a multi-hot layer on its own)")
        if len({id(layer) for layer in layers}) != len(layers):
            raise ValueError("mxrec.keras.EmbeddingGroup: a layer is given twice; look its "
                             "IDs up once (concatenate them) or call it on its own")
        self.members = layers
        self.supports_jit = False  # the key stage is a CPU op XLA cannot compile

    def call(self, ids_list, training=None, timestamp=None):
        ids_list = list(ids_list)
        if len(ids_list) != len(self.members):
            raise ValueError(f"mxrec.keras.EmbeddingGroup: {len(self.members)} layers but "
                             f"{len(ids_list)} ID tensors; give one per layer, in order")
        if communication.get_rank_size() == 1:
            return [layer(ids, training=training, timestamp=timestamp)
                    for layer, ids in zip(self.members, ids_list)]
        is_train = True if training is None else bool(training)
        stamp = None
        if timestamp is not None and is_train:
            stamp = tf.cast(tf.reduce_max(timestamp), tf.int64)
        ids_list = [validate_ids(layer.table, ids) for layer, ids in zip(self.members, ids_list)]
        return _grouped_lookup(self.members, ids_list, is_train, stamp)

    def compute_output_shape(self, input_shape):
        return [tf.TensorShape(shape).concatenate([layer.dim])
                for layer, shape in zip(self.members, input_shape)]

    def get_config(self):
        raise NotImplementedError("mxrec.keras.EmbeddingGroup: serialising the layer "
                                  "(get_config, model.save, clone_model) is not available yet")


def _grouped_lookup(layers: List[Embedding], ids_list, is_train: bool, stamp) -> list:
    """Several ranks: every table's IDs to their owners in one exchange, each owner's
    lookups, and every sharded table's rows back in one all-to-all each way."""
    size = communication.get_rank_size()
    scale = 1.0 / size  # each rank's loss is the mean over its slice
    if is_train:
        for layer in layers:
            layer.table.before_training_lookup()
    routes = [_route(layer, ids, stamp, is_train, size) for layer, ids in zip(layers, ids_list)]
    lookups = [id_exchange.PlannedLookup(layer.name, layer.table, None) for layer in layers]
    keys = [None if layer.table.is_dp else ("float32", layer.dim) for layer in layers]
    groups = id_exchange.send_groups(keys)
    exchanges, stamps, _ = id_exchange.exchange_all(lookups, routes, [stamp] * len(layers),
                                                    is_train, groups=groups)
    owned = [layer._owned_lookup(ex.owned, is_train, agreed, ex.weights)  # noqa: SLF001
             for layer, ex, agreed in zip(layers, exchanges, stamps)]
    out = [None] * len(layers)
    for i, layer in enumerate(layers):
        if layer.table.is_dp:
            out[i] = replicated.send_back(layer.table, owned[i], exchanges[i], routes[i],
                                          ids_list[i], scale)
    if groups:
        plans = send_back.plan_send_backs(exchanges, routes, groups)
        backs = send_back.send_back_groups(
            plans, [tf.concat([owned[i] for i in g], axis=0) if len(g) > 1 else owned[g[0]]
                    for g in groups],
            [layers[g[0]].dim for g in groups], scale)
        for g, plan, back in zip(groups, plans, backs):
            pieces = [back] if len(g) == 1 else tf.split(back, plan.out_sizes, num=len(g))
            for i, piece in zip(g, pieces):
                shape = tf.concat([tf.shape(ids_list[i], out_type=tf.int32), [layers[i].dim]], 0)
                out[i] = tf.reshape(piece, shape)
                out[i].set_shape(ids_list[i].shape.concatenate([layers[i].dim]))
    return out


def _route(layer: Embedding, ids, stamp, is_train: bool, size: int):
    """The rank-local routing of one member's IDs: planned in the input pipeline
    (mxrec.keras.data.plan_ahead), or here."""
    scope = planning.current()
    routed = None if scope is None else scope.routed(layer.table, ids, stamp, is_train)
    if routed is None:
        router = replicated.route if layer.table.is_dp else routing.route
        routed = router(tf.reshape(ids, [-1]), size)
    return routed
