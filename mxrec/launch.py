"""`python -m mxrec.launch -n N script.py ...`: the old path of `mxrec.distributed.launch`."""

import sys

from mxrec.distributed.launch import launch, main  # noqa: F401 (re-exported: the old path)

if __name__ == "__main__":
    sys.exit(main())
