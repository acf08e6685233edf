"""Old import path of `mxrec.distributed.sharded_state`: the same module object.

Multi-worker training lives in `mxrec.distributed`; reads and writes of this path's names
(tests monkeypatch them) reach the one module.
"""

import sys

from mxrec.distributed import sharded_state as _moved

sys.modules[__name__] = _moved
