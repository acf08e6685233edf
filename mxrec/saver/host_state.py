"""The old import path of a table's host-state saveable, which belongs to the table.

It lives in `mxrec.core.host_state`; this module re-exports it.
"""

from mxrec.core.host_state import HostStateSaveable, register

__all__ = ["HostStateSaveable", "register"]
