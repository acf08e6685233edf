"""The send-back phase of a sharded lookup (mxrec.distributed.routing has the whole path):
the owner's embeddings back to the ranks that asked, each flat ID's row gathered from what
came back; backward, the gradients the same way in reverse.

- The plan, made before the embeddings exist (`SendPlan`: `positions`, `plan_send_back`,
  and `plan_send_backs` for every send group of a step at once).
- One lookup's send-back, one custom gradient whose backward passes are recorded
  (`send_back`; lookups sharing their exchange send side by side, `Exchange.shared`).
- The graph modifier's send-back of a whole step (`send_back_all`): one buffer per send
  group, one embedding all-to-all per dtype forward and one gradient all-to-all per dtype
  and backward pass, replacing each lookup's own send-back.

The owner's side is one `MxrecScatterRows` forward and one `MxrecGatherSumRows` backward
per buffer (float32/64; other dtypes the TensorFlow composition they equal).
"""

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from mxrec.distributed import communication, sharded_ops
from mxrec.distributed.id_exchange import Exchange, check_groups
from mxrec.distributed.routing import Route
from mxrec.util.gradients import custom_gradient


def positions(routed: Route, chunk: tf.Tensor, offset=0) -> tf.Tensor:
    """Each flat ID's row in the [N * chunk] buffer the embedding all-to-all returns: its
    unique ID's (owner, slot), as owner * chunk + offset + slot (`offset`: the lookup's first
    row per peer in a buffer it shares). One gather by these rows replaces the gather_nd by
    `where`, the inverse of `order` and the gather by `index` (and their three gradients by
    one segment sum, over the same terms in the same order). One op (MxrecSendPositions)
    computes them: the value of gather(gather(flat, invert_permutation(order)), index)."""
    (position,) = sharded_ops.send_positions(
        [routed.where], [routed.order], [routed.index], tf.reshape(chunk, [1]),
        tf.reshape(tf.cast(offset, tf.int32), [1]), [0], 1)
    return position


@dataclasses.dataclass
class SendPlan:
    """Where one send group's embeddings go: the buffer [N * chunk, dim] of its lookups
    (per peer each lookup's rows after the previous lookup's) and the indices into it, all
    planned before the embeddings exist (`plan_send_back`).

    Attributes:
        spots: [V] int32, the row of each ID this rank received as owner.
        first: [V] int32, that ID's row in the group's owned embeddings (concatenated).
        position: [n] int32, each flat ID's row in the buffer that comes back.
        out_sizes: [k] int32, flat IDs per lookup (`position` split by lookup).
        owned_sizes: [k] int32, owned IDs per lookup (the owned embeddings' rows).
        chunk: scalar int32, rows per peer of the buffer.
        owned: scalar int32, the group's owned IDs.
    """

    spots: tf.Tensor
    first: tf.Tensor
    position: tf.Tensor
    out_sizes: tf.Tensor
    owned_sizes: tf.Tensor
    chunk: tf.Tensor
    owned: tf.Tensor

    FIELDS = ("spots", "first", "position", "out_sizes", "owned_sizes", "chunk", "owned")


def _joined(values):
    """The tensors `values` concatenated along the rows (the one tensor where alone)."""
    return values[0] if len(values) == 1 else tf.concat(values, axis=0)


def plan_send_back(exchanges, routes) -> SendPlan:
    """The SendPlan of one send group: `exchanges` (placed in one buffer by exchange_all's
    `groups`, or one lookup alone) and their routes, in group order."""
    position = [positions(r, ex.group_chunk, ex.group_offset)
                for ex, r in zip(exchanges, routes)]
    owned_sizes = tf.stack([tf.size(ex.owned, out_type=tf.int32) for ex in exchanges])
    return SendPlan(spots=_joined([ex.spot for ex in exchanges]),
                    first=_joined([ex.group_first for ex in exchanges]),
                    position=_joined(position),
                    out_sizes=tf.stack([tf.size(p, out_type=tf.int32) for p in position]),
                    owned_sizes=owned_sizes, chunk=exchanges[0].group_chunk,
                    owned=tf.reduce_sum(owned_sizes))


def plan_send_backs(exchanges, routes, groups):
    """plan_send_back of every send group at once, with ops shared by all the groups'
    lookups (one pass over their routes instead of one per lookup: on a small batch the
    executor's cost per op is most of the planning). Equal to plan_send_back per group.

    Args:
        exchanges, routes: of the step's lookups (placed by exchange_all's `groups`).
        groups: send_groups of the lookups.

    Returns:
        [SendPlan], one per group.
    """
    check_groups(groups, len(exchanges), "plan_send_backs")
    if len(routes) != len(exchanges):
        raise ValueError(f"plan_send_backs: {len(exchanges)} exchanges but {len(routes)} "
                         "routes; give one route per lookup")
    if not groups:
        return []
    if len(groups) == 1 and len(groups[0]) == 1:
        return [plan_send_back([exchanges[groups[0][0]]], [routes[groups[0][0]]])]
    members = sorted(i for g in groups for i in g)
    slot = {i: n for n, i in enumerate(members)}
    count = len(members)
    ex = [exchanges[i] for i in members]
    rt = [routes[i] for i in members]
    width = tf.stack([e.group_chunk for e in ex])
    offset = tf.stack([e.group_offset for e in ex])
    flat_sizes = tf.stack([tf.size(r.index, out_type=tf.int32) for r in rt])
    owned_sizes = tf.stack([tf.size(e.owned, out_type=tf.int32) if e.owned_size is None
                            else e.owned_size for e in ex])
    # positions() of every member at once, each group's in member order (one op over the
    # routes: the TF composition took a dozen ops over every flat ID of the step).
    group_of = np.zeros(count, np.int64)
    for number, g in enumerate(groups):
        group_of[[slot[i] for i in g]] = number
    positions_of = sharded_ops.send_positions(
        [r.where for r in rt], [r.order for r in rt], [r.index for r in rt],
        tf.cast(width, tf.int32), tf.cast(offset, tf.int32), group_of.tolist(), len(groups))
    plans = []
    for g, group_position in zip(groups, positions_of):
        rows = [slot[i] for i in g]
        sizes = tf.gather(owned_sizes, rows)
        plans.append(SendPlan(spots=_joined([exchanges[i].spot for i in g]),
                              first=_joined([exchanges[i].group_first for i in g]),
                              position=group_position, out_sizes=tf.gather(flat_sizes, rows),
                              owned_sizes=sizes, chunk=exchanges[g[0]].group_chunk,
                              owned=tf.reduce_sum(sizes)))
    return plans


def _alltoall_parts(parts, name: str):
    """One all-to-all for [N, width_i] tensors of one dtype, each peer's row of each
    concatenated; returns each part's share back."""
    with tf.name_scope(name):
        if len(parts) == 1:
            return [communication.alltoall(parts[0])]
        moved = communication.alltoall(tf.concat(parts, axis=1))
        widths = tf.stack([tf.shape(part, out_type=tf.int32)[1] for part in parts])
        return tf.split(moved, widths, axis=1, num=len(parts))


# Embedding dtypes with one-op kernels for the owner's side of the send-back (MxrecScatterRows,
# MxrecGatherSumRows); others take the TF composition they equal.
_FUSED_DTYPES = (tf.float32, tf.float64)


def _scatter_out(plan: SendPlan, emb: tf.Tensor, dim: int, size: int) -> tf.Tensor:
    """The owner's side forward: the group's owned embeddings [M, dim] into the buffer,
    [N, chunk * dim]."""
    if emb.dtype in _FUSED_DTYPES:
        slots = sharded_ops.scatter_rows(emb, plan.first, plan.spots, size * plan.chunk)
    else:
        rows = tf.gather(emb, plan.first)
        slots = tf.scatter_nd(plan.spots[:, None], rows, tf.stack([size * plan.chunk, dim]))
    return tf.reshape(slots, tf.stack([size, plan.chunk * dim]))


def _gather_back(plan: SendPlan, moved: tf.Tensor, dim: int) -> tf.Tensor:
    """The asking side forward: each flat ID's row of the buffer that came back, [n, dim]."""
    return tf.gather(tf.reshape(moved, [-1, dim]), plan.position)


def _scatter_grad(plan: SendPlan, d_out: tf.Tensor, dim: int, size: int) -> tf.Tensor:
    """The asking side backward: the gradients of the flat IDs [n, dim] summed into their
    rows of the buffer, [N, chunk * dim] (the transpose of `_gather_back`)."""
    summed = tf.math.unsorted_segment_sum(d_out, plan.position, size * plan.chunk)
    return tf.reshape(summed, tf.stack([size, plan.chunk * dim]))


def _gather_grad(plan: SendPlan, moved: tf.Tensor, dim: int, scale) -> tf.Tensor:
    """The owner's side backward: the buffer of gradients that came back, times `scale`,
    summed into the owned rows, [M, dim] (the transpose of `_scatter_out`)."""
    moved = tf.reshape(moved, [-1, dim])
    if moved.dtype in _FUSED_DTYPES:
        return sharded_ops.gather_sum_rows(moved, plan.spots, plan.first, plan.owned, scale)
    if scale is not None:
        moved = moved * scale
    return tf.math.unsorted_segment_sum(tf.gather(moved, plan.spots), plan.first, plan.owned)


@dataclasses.dataclass
class _SharedSendBack:
    """One lookup's send-back over a shared exchange (Exchange.shared)."""

    key: tuple  # (embedding dtype, gradient scale): lookups of one key share a buffer
    emb: tf.Tensor  # the owner's embeddings [M, dim]
    dim: int
    shaped: tf.Tensor  # the reshape to [*ids.shape, dim] of what came back
    exchanged: Exchange


def _moved(plan: SendPlan, emb: tf.Tensor, dim: int, size: int, grad_scale,
           exchanged: Optional[Exchange]) -> tf.Tensor:
    """The owner's embeddings [M, dim] at the asking ranks' flat IDs, [n, dim]: one
    all-to-all each way, the gradient the same path in reverse (recorded in
    `exchanged.backward` where given)."""

    @custom_gradient
    def moved(emb):
        def grad(d_out):
            d_out = tf.convert_to_tensor(d_out)
            (back,) = _alltoall_parts([_scatter_grad(plan, d_out, dim, size)], "alltoall")
            d_emb = _gather_grad(plan, back, dim, grad_scale)
            if exchanged is not None:
                exchanged.backward.append((d_out, d_emb))
            return d_emb

        (back,) = _alltoall_parts([_scatter_out(plan, tf.stop_gradient(emb), dim, size)],
                                  "alltoall")
        return _gather_back(plan, back, dim), grad

    return moved(emb)


def send_back(table, owned_emb: tf.Tensor, exchanged: Exchange, routed: Route, ids: tf.Tensor,
              grad_scale: Optional[float]) -> tf.Tensor:
    """The owner's embeddings of `exchanged.owned` [M, dim] back to the ranks that asked,
    spread over `ids`' positions: [*ids.shape, dim]. Differentiable in `owned_emb`: the
    gradient takes the same path in reverse (one custom gradient over the whole send-back,
    recorded in `exchanged.backward` for `send_back_all`).

    Lookups sharing their exchange (`shared_exchange`, `Exchange.shared`) with the same
    embedding dtype and gradient scale send together: the earlier ones' embeddings and
    this one's side by side, [M, dim_1 + ... + dim_k], in one all-to-all each way (the
    same values, bit for bit: every column moves and sums alone), and the earlier lookups'
    results are rewired to their columns of it (their own all-to-alls are left with no
    consumer and never run). A wide & deep model's step then sends 1 embedding and 1
    gradient all-to-all instead of 2 each."""
    size, dim = communication.get_rank_size(), table.dim
    plan = exchanged.plan if exchanged.plan is not None else plan_send_back([exchanged], [routed])
    exchanged.position, exchanged.plan = plan.position, plan
    key = (owned_emb.dtype, grad_scale)
    earlier = [m for m in exchanged.shared if m.key == key] if exchanged.shared else []
    if not earlier:
        out = _moved(plan, owned_emb, dim, size, grad_scale, exchanged)
    else:
        dims = [m.dim for m in earlier] + [dim]
        with tf.name_scope("shared_send_back"):
            joint = _moved(plan, tf.concat([m.emb for m in earlier] + [owned_emb], axis=1),
                           sum(dims), size, grad_scale, None)
            pieces = tf.split(joint, dims, axis=1, num=len(dims))
        for member, piece in zip(earlier, pieces):
            member.shaped.op._update_input(0, piece)  # noqa: SLF001 (no public way)
            member.exchanged.out = piece
        out = pieces[-1]
    exchanged.emb, exchanged.out = owned_emb, out
    out = tf.reshape(out, tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], axis=0))
    out.set_shape(ids.shape.concatenate([dim]))
    if exchanged.shared is not None:
        exchanged.shared.append(_SharedSendBack(key, owned_emb, dim, out, exchanged))
    return out


def send_back_all(exchanges, groups, plans, scales, gradient_scope, after=()):
    """The send-back of all sharded lookups of a step, fused: per embedding dtype one
    all-to-all forward and, per backward pass, one backward, for every send group (and the
    backward all-to-alls of replicated lookups); returns ((old, new) tensor pairs whose
    consumers are to read the new ones, whether `after` was made a control input).

    The lookups' own send-backs (send_back) stay in the graph unread: each lookup's `out`
    and each backward pass's `d_emb` are replaced by their share of the fused ones, equal
    to what the lookup's own send-back gives (the same terms summed in the same order).

    Args:
        exchanges: [Exchange] of the step's lookups after send_back (emb/out/backward set),
            or after replicated.send_back (peer_backward set).
        groups: send_groups of the sharded lookups, each with its SendPlan in `plans`
            (planned ahead of the step).
        scales: per lookup the factor of its gradient, or None.
        gradient_scope: tensor -> the name scope of the tf.gradients call that built it.
        after: ops the writes of the backward passes' gradients to the tables (without a
            backward pass: the forward send-back) wait for.
    """
    size = communication.get_rank_size()
    _check_send_back_all(exchanges, groups, plans, scales)
    dims = [int(exchanges[g[0]].out.shape[-1]) for g in groups]
    passes = {}  # gradient scope -> {lookup: (dy, dx)}
    for i, ex in enumerate(exchanges):
        for dy, dx in ex.backward + ex.peer_backward:
            passes.setdefault(gradient_scope(dx), {})[i] = (dy, dx)
    gate_forward = bool(after) and not passes
    with tf.name_scope("send_back_fused"), tf.control_dependencies(
            list(after) if gate_forward else []):
        pairs = _forward_fused(exchanges, groups, plans, dims, size)
    for grads in passes.values():
        # A backward pass does not wait for `after`: the ops that write the tables do
        # (_gate_writers), so the gradients' exchange overlaps the planning of the next batch.
        moved = _backward_fused(exchanges, groups, plans, scales, dims, grads, size)
        pairs += _gate_writers(moved, list(after)) if after else moved
    return pairs, bool(after) and (bool(passes) or bool(groups))


def _check_send_back_all(exchanges, groups, plans, scales) -> None:
    """Raises ValueError unless send_back_all's arguments fit together: disjoint groups,
    a plan per group and a scale per lookup, a send-back to replace for each grouped lookup
    and one (dtype, dim, gradient scale) per group."""
    check_groups(groups, len(exchanges), "send_back_all")
    if len(plans) != len(groups) or len(scales) != len(exchanges):
        raise ValueError(f"send_back_all: {len(groups)} send groups with {len(plans)} plans, "
                         f"{len(exchanges)} lookups with {len(scales)} gradient scales; give "
                         "one plan per group and one scale per lookup")
    for group in groups:
        missing = [i for i in group if exchanges[i].out is None]
        if missing:
            raise ValueError(f"send_back_all: lookups {missing} have no send-back to replace "
                             "(send_back.send_back was not built for them)")
        kinds = {(exchanges[i].out.dtype.name, int(exchanges[i].out.shape[-1]),
                  scales[i]) for i in group}
        if len(kinds) > 1:
            raise ValueError(f"send_back_all: send group {group} mixes (dtype, dim, gradient "
                             f"scale) {sorted(kinds, key=str)}; one buffer holds one kind "
                             "(id_exchange.send_groups)")


def _by_dtype(items):
    """The items of (item, dtype) pairs, one list per dtype, in order of first appearance."""
    found = {}
    for item, dtype in items:
        found.setdefault(dtype, []).append(item)
    return found.values()


def _forward_fused(exchanges, groups, plans, dims, size: int):
    """The forward of send_back_all: every group's owned embeddings into its buffer, one
    all-to-all per dtype, each lookup's rows gathered back; (out, its replacement) pairs."""
    pairs = []
    for members in _by_dtype((g, exchanges[groups[g][0]].out.dtype)
                             for g in range(len(groups))):
        parts = []
        for g in members:
            emb = _joined([exchanges[i].emb for i in groups[g]])
            parts.append(_scatter_out(plans[g], emb, dims[g], size))
        for g, back in zip(members, _alltoall_parts(parts, "alltoall")):
            out = _gather_back(plans[g], back, dims[g])
            pieces = ([out] if len(groups[g]) == 1 else
                      tf.split(out, plans[g].out_sizes, num=len(groups[g])))
            for i, piece in zip(groups[g], pieces):
                piece.set_shape(exchanges[i].out.shape)
                pairs.append((exchanges[i].out, piece))
    return pairs


def _backward_fused(exchanges, groups, plans, scales, dims, grads, size: int):
    """One backward pass of send_back_all, `grads` {lookup: (dy, dx)}: the gradients of every
    group, and of every replicated lookup outside the groups (a "peer" part), one all-to-all
    per dtype; (dx, its replacement) pairs."""
    grouped = {i for g in groups for i in g}
    pairs = []
    # A backward exchange, as the bench reads it ("gradients" in its name).
    with tf.name_scope("gradients_fused"):
        items = [(("group", g), exchanges[groups[g][0]].out.dtype)
                 for g in range(len(groups)) if any(i in grads for i in groups[g])]
        items += [(("peer", i), grads[i][0].dtype) for i in sorted(grads) if i not in grouped]
        for members in _by_dtype(items):
            parts = []
            for kind, index in members:
                if kind == "peer":
                    parts.append(tf.reshape(grads[index][0], tf.stack([size, -1])))
                    continue
                d_out = _joined([grads[i][0] if i in grads else tf.zeros_like(exchanges[i].out)
                                 for i in groups[index]])
                parts.append(_scatter_grad(plans[index], d_out, dims[index], size))
            for (kind, index), back in zip(members, _alltoall_parts(parts, "alltoall")):
                if kind == "peer":
                    pairs.append(_peer_gradient(grads[index], back, scales[index]))
                else:
                    pairs += _group_gradients(groups[index], plans[index], back, dims[index],
                                              scales, grads)
    return pairs


def _peer_gradient(grad, back: tf.Tensor, scale):
    """A replicated lookup's (dx, replacement): the gradients every rank sent it, `back`,
    in dx's shape, times `scale` where given."""
    dy, dx = grad
    new = tf.reshape(back, tf.shape(dy))
    if scale is not None:
        new = new * scale
    new.set_shape(dx.shape)
    return dx, new


def _group_gradients(members, plan: SendPlan, back: tf.Tensor, dim: int, scales, grads):
    """A send group's (dx, replacement) pairs, one per member with a gradient in `grads`: the
    group's gradients that came back, `back`, summed into its owned rows and split by lookup."""
    d_emb = _gather_grad(plan, back, dim, scales[members[0]])
    pieces = ([d_emb] if len(members) == 1 else
              tf.split(d_emb, plan.owned_sizes, num=len(members)))
    pairs = []
    for i, piece in zip(members, pieces):
        if i in grads:
            piece.set_shape(grads[i][1].shape)
            pairs.append((grads[i][1], piece))
    return pairs


def _table_writers(tensor: tf.Tensor, limit: int = 10_000):
    """The stateful ops with a resource input (an optimizer's apply to a table, or to its
    slots) that read `tensor` or what is computed from it, found by following data edges;
    None where one of them sits in a control-flow context (a cond or loop body that an
    outside control input cannot enter) or the search passes `limit` ops."""
    found, seen, frontier = [], set(), list(tensor.consumers())
    while frontier:
        op = frontier.pop()
        if op in seen:
            continue
        seen.add(op)
        if len(seen) > limit:
            return None
        if op.op_def is not None and op.op_def.is_stateful and any(
                t.dtype == tf.resource for t in op.inputs):
            if op._control_flow_context is not None:  # pylint: disable=protected-access
                return None
            found.append(op)
            continue
        for output in op.outputs:
            frontier.extend(output.consumers())
    return found


def _gate_writers(pairs, after):
    """Makes `after` a control input of the ops that apply each backward pass's gradient
    (old, new) pair to its table, which read `old` (they will read `new`): the step still
    runs `after`, and only those writes wait for it. A gradient with no such op (not
    applied, or applied inside a control-flow context) is read through an identity that
    waits for `after` instead."""
    ops = [a.op if isinstance(a, tf.Tensor) else a for a in after]
    gated = []
    for old, new in pairs:
        writers = _table_writers(old)
        if not writers:
            with tf.control_dependencies(after):
                waiting = tf.identity(new)
            waiting.set_shape(new.shape)
            gated.append((old, waiting))
            continue
        for op in writers:
            missing = [a for a in ops if a not in op.control_inputs]
            if missing:
                op._add_control_inputs(missing)  # pylint: disable=protected-access
        gated.append((old, new))
    return gated




def send_back_groups(plans, embs, dims, grad_scale: Optional[float]) -> list:
    """The send-back of every send group of a step's sharded lookups at once, for a caller
    that has every lookup's owned embeddings before any send-back is built (mxrec.keras'
    EmbeddingGroup): one embedding all-to-all forward and one gradient all-to-all backward
    for all the groups (float32 embeddings), the values of each group's own send-back.

    Args:
        plans: per group its SendPlan (plan_send_backs).
        embs: per group its lookups' owned embeddings concatenated in group order [M_g, d_g].
        dims: per group its row width d_g.
        grad_scale: the factor of the gradients summed on the owner, or None.

    Returns:
        per group [n_g, d_g], the rows of its lookups' flat IDs in group order (split by
        plan.out_sizes); differentiable in `embs`.
    """
    size = communication.get_rank_size()
    if not (len(plans) == len(embs) == len(dims)):
        raise ValueError(f"send_back_groups: {len(plans)} plans, {len(embs)} embeddings and "
                         f"{len(dims)} dims; give one of each per send group")
    if any(e.dtype != tf.float32 for e in embs):
        raise TypeError("send_back_groups: the embeddings must be float32 (one buffer each "
                        "way)")
    sizes = [tf.size(e) for e in embs]
    out_sizes = [tf.size(p.position) * d for p, d in zip(plans, dims)]

    def split(flat, lengths, widths):
        return [tf.reshape(piece, [-1, d]) for piece, d in
                zip(tf.split(flat, tf.stack(lengths), num=len(widths)), widths)]

    def joined(pieces):
        return tf.concat([tf.reshape(p, [-1]) for p in pieces], axis=0)

    @custom_gradient
    def moved(flat):
        def grad(d_flat):
            d_outs = split(tf.convert_to_tensor(d_flat), out_sizes, dims)
            parts = [_scatter_grad(p, d, dim, size) for p, d, dim in zip(plans, d_outs, dims)]
            backs = _alltoall_parts(parts, "gradients_grouped")
            return joined([_gather_grad(p, b, dim, grad_scale)
                           for p, b, dim in zip(plans, backs, dims)])

        parts = [_scatter_out(p, e, dim, size)
                 for p, e, dim in zip(plans, split(flat, sizes, dims), dims)]
        backs = _alltoall_parts(parts, "alltoall_grouped")
        return joined([_gather_back(p, b, dim) for p, b, dim in zip(plans, backs, dims)]), grad

    return split(moved(joined(embs)), out_sizes, dims)
