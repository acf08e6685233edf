"""The lookup planners of several ranks: tables sharded by ID and replicated tables.

`mxrec.distributed.multirank.MultiRank.lookup_planner` hands `sharded_lookup` to
`sparse_lookup` for tensor IDs on several ranks, and to the FeatureSpec path
(`mxrec.core.planners.feature_spec_lookup`). The IDs go to their owners, each owner
looks its IDs up in its shard like a one-process table (mxrec.distributed.routing); or, for
a table replicated on every rank (is_dp=True, mxrec.distributed.replicated), every rank
looks the global batch up in its replica, through the same pieces (its own `route` and
`send_back`). The owner's key stage runs through `mxrec.core.planners.run_key_stage`, as
every planner's.
"""

import tensorflow as tf

from mxrec.core import planners
from mxrec.core.table import default_values
from mxrec.distributed import (
    communication,
    id_exchange,
    replicated,
    routing,
    send_back,
    sharded_pipeline,
)


class ShardedParts:
    """The pieces of a sharded lookup (mxrec.distributed.routing) the graph modifier rewires.

    Attributes:
        local_time: the rank's batch time before the all-reduce, or None.
        route: the rank-local routing (routing.Route).
        exchange: what the owner received (id_exchange.Exchange); `exchange.owned` is the
            key stage's input.
        router: the function that makes `route` from the IDs, (ids, size) -> Route:
            routing.route, or replicated.route for an is_dp=True table.
    """

    def __init__(self, local_time, route, exchange, router=routing.route):
        self.local_time = local_time
        self.route = route
        self.exchange = exchange
        self.router = router


def sharded_lookup(request: planners.LookupRequest) -> tf.Tensor:
    """A lookup of a table sharded across the ranks, or replicated on every rank.

    With modify_graph=True the same graph is built and recorded; the graph modifier moves
    its routing, exchange and key stage ahead of the step (sharded_pipeline)."""
    table, ids, is_train, scope = request.table, request.ids, request.is_train, request.scope
    table.check_lookup(request.mode)
    grad_scale = None
    if table.all2all_gradients_op == "sum_gradients_and_div_by_ranksize":
        grad_scale = 1.0 / communication.get_rank_size()
    if not request.modify_graph:  # the graph modifier's own initializers meet in their all-reduce
        id_exchange.fence_iterators(ids)
    # A replicated table (is_dp=True): every rank owns every ID and plans the global batch.
    router, back = ((replicated.route, replicated.send_back) if table.is_dp
                    else (routing.route, send_back.send_back))
    with tf.name_scope(scope):
        default = default_values(table, request.serving_default_value)
        local_time = request.local_time()
        timestamp = id_exchange.batch_time(local_time)
        if request.modify_graph:  # the modifier replans each recorded lookup on its own
            routed = router(ids, communication.get_rank_size())
            exchanged = id_exchange.exchange(table, routed, is_train, request.pad_to)
        else:
            routed, exchanged = id_exchange.shared_exchange(table, ids, is_train,
                                                            request.pad_to, router)
        rows, restore, reused = planners.run_key_stage(table, exchanged.owned, is_train,
                                                       timestamp, weights=exchanged.weights)
        # is_grad reaches the owner: a dynamic table's lookup then leaves its rows out of the
        # by-address optimizers' collections.
        owned_emb = table.lookup_planned(exchanged.owned, rows, restore, reused, is_train,
                                         default=default, is_grad=request.is_grad, scope=scope)
        out = back(table, owned_emb, exchanged, routed, ids, grad_scale)
    if request.modify_graph:
        # On several ranks the key stage reads IDs that came by collectives: the modifier
        # traces the lookup's own IDs (and batch time) instead.
        planners.record_lookup(tf.compat.v1.get_default_graph(), planners.LookupRecord(
            # send_count, not pad_to (None for a modify_graph lookup): the rewritten lookup
            # pads its chunk to it under init(use_dynamic=False), as one process's does
            table, ids, rows, restore, reused, is_train, request.send_count,
            sharded=ShardedParts(local_time, routed, exchanged, router),
            trace_from=[ids] + ([local_time] if local_time is not None else []),
            rebuild=sharded_pipeline.rebuild))
    return out if request.is_grad else tf.stop_gradient(out)
