"""mx_rec's `mx_rec.util.communication.hccl_ops`: ranks and allreduce.

mx_rec calls Huawei's HCCL collectives; mxrec runs the same calls on
TensorFlow's collectives (mxrec.distributed.communication). One process (no launcher)
is rank 0 of 1, where `allreduce` returns its input.

Example:
    >>> grad = hccl_ops.allreduce(grad, "sum") if hccl_ops.get_rank_size() > 1 else grad
"""

import tensorflow as tf

from mxrec.distributed import communication

WORLD_GROUP = "hccl_world_group"


def get_rank_id() -> int:
    """This process's rank (0 in single-process training)."""
    return communication.get_rank_id()


def get_rank_size() -> int:
    """The number of training processes (1 in single-process training)."""
    return communication.get_rank_size()


def allreduce(tensor, reduction: str = "sum", fusion: int = 1, fusion_id: int = -1,
              group: str = WORLD_GROUP) -> tf.Tensor:
    """The element-wise reduction ("sum", "max", "min"; mxrec adds "mean") of `tensor`
    over all ranks.

    Args:
        tensor: any numeric tensor of the same shape on every rank.
        reduction: "sum", "max", "min" or "mean". mx_rec's "prod" is refused.
        fusion, fusion_id: HCCL's fusing of several allreduces into one; only mx_rec's
            defaults (1, -1), which TensorFlow's collectives run as they are.
        group: only "hccl_world_group" (all ranks); sub-groups are refused.

    Raises:
        ValueError: an unknown reduction.
        NotImplementedError: reduction "prod", another group, or other fusion settings.
    """
    if reduction == "prod":
        raise NotImplementedError("hccl_ops.allreduce(reduction='prod') is not available; "
                                  "use 'sum', 'max', 'min' or 'mean'")
    if group != WORLD_GROUP:
        raise NotImplementedError(f"hccl_ops.allreduce(group={group!r}): only the group of all "
                                  f"ranks, {WORLD_GROUP!r}, is available")
    if (fusion, fusion_id) != (1, -1):
        raise NotImplementedError(
            f"hccl_ops.allreduce(fusion={fusion!r}, fusion_id={fusion_id!r}): HCCL's fusion of "
            "several allreduces is not available; leave fusion and fusion_id out")
    return communication.allreduce(tensor, reduction)
