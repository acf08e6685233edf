"""mxrec.compat: mx_rec's module paths reach the one real module, however they are reached."""

import importlib
import os
import subprocess
import sys

import pytest

from mxrec import compat

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh(code: str) -> str:
    """Runs `code` in a new interpreter (nothing of mxrec imported yet); its stdout."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("path", sorted(compat.MODULES))
def test_each_path_is_the_real_module(path):
    assert importlib.import_module(path) is importlib.import_module(compat.MODULES[path])


@pytest.mark.parametrize("path", sorted(compat.NAMES))
def test_each_name_is_the_real_object(path):
    host, name = path.rsplit(".", 1)
    assert getattr(importlib.import_module(host), name) is getattr(
        importlib.import_module(compat.NAMES[path]), name)


def test_paths_reached_first_in_a_fresh_process():
    """Each way a script reaches an alias, as the first mxrec import of its process: a
    submodule of an alias, an attribute of the real package, `from alias import name`."""
    out = _fresh(
        "import sys\n"
        "from mxrec.util.communication.hccl_ops import get_rank_size\n"
        "import mxrec.distributed.hccl_ops as real\n"
        "assert get_rank_size is real.get_rank_size\n"
        "import mxrec.core as core\n"
        "assert core.feature_process is sys.modules['mxrec.hooks.evict']\n"
        "from mxrec.graph.modifier import GraphModifierHook\n"
        "from mxrec.hooks import graph_modifier\n"
        "assert GraphModifierHook is graph_modifier.GraphModifierHook\n"
        "print('ok')\n")
    assert out.strip() == "ok"


def test_a_package_answers_its_alias_as_an_attribute():
    """mx_rec's zoo: `import mx_rec.util as mxrec_util; mxrec_util.communication.hccl_ops`."""
    out = _fresh(
        "import mxrec.util as mxrec_util\n"
        "print(mxrec_util.communication.hccl_ops.get_rank_id(),\n"
        "      mxrec_util.communication.__name__)\n")
    assert out.split() == ["0", "mxrec.distributed.communication"]


def test_import_mxrec_loads_nothing_heavy():
    """`import mxrec` installs the finder only (with its tables of aliases and refusals, plain
    dicts): the launcher stays a plain process starter."""
    out = _fresh("import sys\nimport mxrec\n"
                 "print(sorted(m for m in sys.modules if m.startswith(('mxrec', 'tensorflow'))))")
    assert out.strip() == "['mxrec', 'mxrec.compat', 'mxrec.compat.refused']"


def test_a_monkeypatch_through_an_alias_reaches_the_real_module(monkeypatch):
    from mxrec.distributed import communication

    monkeypatch.setattr("mxrec.util.communication.get_rank_id", lambda: 7)
    assert communication.get_rank_id() == 7


def test_a_missing_name_is_an_attribute_error():
    import mxrec.graph.modifier as modifier
    import mxrec.util

    with pytest.raises(AttributeError, match="'mxrec.graph.modifier' has no attribute 'nope'"):
        modifier.nope  # noqa: B018
    with pytest.raises(AttributeError, match="'mxrec.util' has no attribute 'nope'"):
        mxrec.util.nope  # noqa: B018


def test_install_is_idempotent():
    compat.install()
    assert sum(isinstance(f, compat._Finder) for f in sys.meta_path) == 1  # noqa: SLF001
