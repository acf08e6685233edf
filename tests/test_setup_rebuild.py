"""scripts/setup.sh: the TensorFlow line for each Python, and a rebuild only when a build input
changed (a copy of the tree built with a fake compiler that records its calls)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import setup_helper  # noqa: E402


@pytest.mark.parametrize("python, requested, want", [
    ((3, 9), None, "2.15"), ((3, 11), None, "2.15"), ((3, 12), None, "2.21"),
    ((3, 13), None, "2.21"), ((3, 11), "2.21", "2.21"), ((3, 10), "2.15", "2.15")])
def test_pick_tf(python, requested, want):
    assert setup_helper.pick_tf(python, requested) == want


@pytest.mark.parametrize("python, requested, message", [
    ((3, 12), "2.15", r"TensorFlow 2.15 has wheels for Python 3.9-3.11, this is Python 3.12"),
    ((3, 9), "2.21", r"TensorFlow 2.21 has wheels for Python 3.10-3.13, this is Python 3.9"),
    ((3, 14), None, r"Python 3.9-3.11 \(TensorFlow 2.15\) or Python 3.10-3.13 "
                    r"\(TensorFlow 2.21\); this is Python 3.14"),
    ((3, 8), None, r"this is Python 3.8"),
    ((3, 11), "2.16", r"MXREC_TF must be 2.15 or 2.21, got '2.16'")])
def test_pick_tf_refuses_with_the_versions(python, requested, message):
    with pytest.raises(ValueError, match=message):
        setup_helper.pick_tf(python, requested)


def test_pick_from_the_command_line_names_the_versions():
    this = sys.version_info[:2]
    other = "2.15" if this >= (3, 12) else "2.21"
    if setup_helper.PYTHONS[other][0] <= this <= setup_helper.PYTHONS[other][1]:
        other = "2.99"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_helper.py"), "pick",
                             other], capture_output=True, text=True)
    assert result.returncode == 2
    assert "scripts/setup.sh:" in result.stderr and ("Python" in result.stderr
                                                      or "MXREC_TF" in result.stderr)


def _tree(tmp_path: Path) -> Path:
    """A copy of the tree's tracked files (no build), with the real environment."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    tree = tmp_path / "tree"
    for name in files:
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    venv = Path(sys.prefix)
    (tree / (".venv-tf221" if venv.name == ".venv-tf221" else ".venv")).symlink_to(
        os.path.realpath(venv))
    return tree


FAKE_CXX = textwrap.dedent("""\
    #!/usr/bin/env bash
    # Records each call; writes an empty output file where -o names one.
    echo "$*" >> "$FAKE_CXX_LOG"
    if [ "${1:-}" = "--version" ]; then echo "fake-g++ 1.0"; exit 0; fi
    while [ $# -gt 0 ]; do
      if [ "$1" = "-o" ]; then : > "$2"; fi
      shift
    done
""")


def test_second_setup_does_not_compile_and_a_changed_input_rebuilds(tmp_path):
    tree = _tree(tmp_path)
    cxx = tmp_path / "fake-g++"
    cxx.write_text(FAKE_CXX)
    cxx.chmod(0o755)
    log = tmp_path / "calls.log"
    tf_line = "2.21" if Path(sys.prefix).name == ".venv-tf221" else "2.15"
    env = dict(os.environ, CXX=str(cxx), FAKE_CXX_LOG=str(log), MXREC_TF=tf_line,
               PYTHON=sys.executable)

    def setup():
        result = subprocess.run(["bash", "scripts/setup.sh"], cwd=tree, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        calls = [line for line in log.read_text().splitlines()
                 if line != "--version"] if log.exists() else []
        log.unlink(missing_ok=True)
        return calls

    first = setup()
    assert any(" -c " in f" {call} " for call in first)  # compiled every source
    assert any("_mxrec_ops.so" in call for call in first)
    built = json.loads((tree / "mxrec" / "_lib" / "build_info.json").read_text())
    assert built["tensorflow"].startswith(tf_line)
    assert setup() == []  # nothing changed: no compiler call
    source = tree / "cc_ops" / "engine" / "thread_pool.cc"
    source.write_text(source.read_text() + "\n// changed\n")
    assert any("thread_pool.cc" in call for call in setup())
    assert setup() == []
    # A build for another TensorFlow in mxrec/_lib (the other environment's) is rebuilt.
    built["tensorflow"] = "0.0.0"
    (tree / "mxrec" / "_lib" / "build_info.json").write_text(json.dumps(built))
    assert setup() != []


def test_stamp_covers_sources_compiler_and_tensorflow(tmp_path):
    tree = tmp_path / "t"
    (tree / "cc_ops" / "engine").mkdir(parents=True)
    (tree / "setup.py").write_text("flags = ['-O3']\n")
    (tree / "cc_ops" / "engine" / "a.cc").write_text("int a;\n")
    base = setup_helper.stamp(tree, "2.15.1", "g++ 11")
    assert setup_helper.stamp(tree, "2.15.1", "g++ 11") == base
    assert setup_helper.stamp(tree, "2.21.0", "g++ 11") != base
    assert setup_helper.stamp(tree, "2.15.1", "g++ 12") != base
    (tree / "cc_ops" / "engine" / "b.h").write_text("// new header\n")
    with_header = setup_helper.stamp(tree, "2.15.1", "g++ 11")
    assert with_header != base
    (tree / "setup.py").write_text("flags = ['-O2']\n")
    assert setup_helper.stamp(tree, "2.15.1", "g++ 11") != with_header
