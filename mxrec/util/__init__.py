"""mx_rec's `mx_rec.util`: scripts reach `mx_rec.util.communication.hccl_ops` through it
(`import mx_rec.util as mxrec_util; mxrec_util.communication.hccl_ops.get_rank_id()`).

The old path is imported on first use, not with this package: `mxrec.util` sits below
`mxrec.distributed`, which the old path is."""

import importlib


def __getattr__(name: str):
    if name == "communication":
        return importlib.import_module("mxrec.util.communication")
    raise AttributeError(f"module 'mxrec.util' has no attribute {name!r}")
