"""mx_rec's `mx_rec.util.communication` (and its `hccl_ops`): the modules that moved to
`mxrec.distributed`, under their old paths.

This path is `mxrec.distributed.communication` itself (the same module object, so reads and
writes of its names, which tests monkeypatch, reach the one module and its state), and
`mxrec.util.communication.hccl_ops` is `mxrec.distributed.hccl_ops`.
"""

import sys

from mxrec.distributed import communication as _moved
from mxrec.distributed import hccl_ops as _hccl_ops

_moved.hccl_ops = _hccl_ops  # `from mxrec.util.communication import hccl_ops`
sys.modules[__name__ + ".hccl_ops"] = _hccl_ops
sys.modules[__name__] = _moved
