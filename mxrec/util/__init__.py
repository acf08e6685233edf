"""mx_rec's `mx_rec.util`: scripts reach `mx_rec.util.communication.hccl_ops` through it
(`import mx_rec.util as mxrec_util; mxrec_util.communication.hccl_ops.get_rank_id()`)."""

from mxrec.util.communication import hccl_ops as _hccl_ops  # noqa: F401
