"""What scripts/setup.sh decides: the TensorFlow line for a Python, and whether to rebuild.

    python scripts/setup_helper.py pick [REQUESTED]    prints 2.15 or 2.21, or exits 2 naming
                                                       the supported Pythons
    python scripts/setup_helper.py stamp               prints the build stamp of this tree for
                                                       the running (venv) Python
    python scripts/setup_helper.py fresh               exits 0 when mxrec/_lib holds a build
                                                       with the stamp of this tree

mxrec/_lib holds one build at a time (the .venv and .venv-tf221 environments share the
in-place package), so the stamp covers what a build depends on: every file under cc_ops/,
setup.py, the compiler (CXX and its --version), the TensorFlow version and the Python
extension suffix. A build with another stamp, or none, is rebuilt; switching MXREC_TF
therefore rebuilds.
"""

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / "mxrec" / "_lib" / "build_stamp.txt"
# Python versions with a TensorFlow wheel of each line (tensorflow-cpu on PyPI).
PYTHONS = {"2.15": ((3, 9), (3, 11)), "2.21": ((3, 10), (3, 13))}
OUTPUTS = ("libmxrec_engine.so", "_mxrec_ops.so", "build_info.json")


def _versions(line: str) -> str:
    low, high = PYTHONS[line]
    return f"Python {low[0]}.{low[1]}-{high[0]}.{high[1]}"


def pick_tf(python: Tuple[int, int], requested: Optional[str]) -> str:
    """The TensorFlow line to install for `python` (major, minor): `requested` (MXREC_TF)
    when given, else 2.15 where its wheel exists and 2.21 from Python 3.12 on.

    Raises:
        ValueError: no wheel of that line (or of any) for this Python, naming the versions.
    """
    if requested:
        if requested not in PYTHONS:
            raise ValueError(f"MXREC_TF must be 2.15 or 2.21, got {requested!r}")
        low, high = PYTHONS[requested]
        if not low <= tuple(python) <= high:
            raise ValueError(
                f"TensorFlow {requested} has wheels for {_versions(requested)}, this is Python "
                f"{python[0]}.{python[1]}; set PYTHON to one of those (e.g. PYTHON=python3.11) "
                f"or use MXREC_TF={'2.21' if requested == '2.15' else '2.15'}")
        return requested
    for line in ("2.15", "2.21"):
        low, high = PYTHONS[line]
        if low <= tuple(python) <= high:
            return line
    raise ValueError(
        f"mxrec needs {_versions('2.15')} (TensorFlow 2.15) or {_versions('2.21')} "
        f"(TensorFlow 2.21); this is Python {python[0]}.{python[1]}. Set PYTHON to one of those")


def _tensorflow_version() -> str:
    import importlib.metadata  # Python 3.8+; `pick` runs on older Pythons to refuse them

    for name in ("tensorflow-cpu", "tensorflow"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def _compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return f"{cxx}\n{out.stdout}"
    except OSError:
        return f"{cxx}\n(not found)"


def stamp(root: Path = ROOT, tensorflow: Optional[str] = None,
          compiler: Optional[str] = None) -> str:
    """SHA-256 over the build's inputs (see the module docstring)."""
    digest = hashlib.sha256()
    sources = sorted(p for p in (root / "cc_ops").rglob("*") if p.is_file())
    for path in [root / "setup.py", *sources]:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    digest.update((compiler if compiler is not None else _compiler()).encode() + b"\0")
    digest.update((tensorflow if tensorflow is not None else _tensorflow_version()).encode())
    digest.update(str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    return digest.hexdigest()


def fresh(root: Path = ROOT) -> bool:
    """Whether root/mxrec/_lib holds a complete build with this tree's stamp."""
    lib = root / "mxrec" / "_lib"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    outputs = [lib / name for name in OUTPUTS] + [lib / f"_mxrec_engine{suffix}"]
    stamp_file = lib / STAMP.name
    if not stamp_file.is_file() or not all(p.is_file() for p in outputs):
        return False
    try:  # a build made without setup.sh (setup.py, pip) for another TensorFlow
        built_for = json.loads((lib / "build_info.json").read_text()).get("tensorflow")
    except ValueError:
        return False
    if built_for != _tensorflow_version():
        return False
    return stamp_file.read_text().strip() == stamp(root)


def main(argv) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "pick":
        try:
            print(pick_tf(sys.version_info[:2], argv[2] if len(argv) > 2 else None))
        except ValueError as error:
            print(f"scripts/setup.sh: {error}", file=sys.stderr)
            return 2
        return 0
    if command == "stamp":
        print(stamp())
        return 0
    if command == "fresh":
        return 0 if fresh() else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
