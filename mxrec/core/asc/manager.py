"""mx_rec's `mx_rec.core.asc.manager`: `start_asc_pipeline`."""

from mxrec.core.asc.helper import start_asc_pipeline

__all__ = ["start_asc_pipeline"]
