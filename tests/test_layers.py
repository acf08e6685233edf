"""mxrec's import graph runs one way: util -> core -> graph / optimizers / saver ->
distributed / export -> initialize -> hooks -> serving -> streaming / keras -> launch -> compat.

Every module's imports (top-level and inside functions, `importlib.import_module`
with a literal name too) are read with `ast`; a module may import its own
package and the layers below it, never a layer above or a sibling package of
its layer, and no set of modules may import each other in a circle. No module
only forwards another's names (mx_rec's paths live in `mxrec.compat`, which mxrec's own
modules never import).
"""

import ast
import pathlib
from typing import Dict, List, Set, Tuple

import pytest

from mxrec import compat

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent.parent / "mxrec"

# Lower layers first. Each module belongs to the first prefix that matches it.
LAYERS: Tuple[Tuple[str, int], ...] = (
    ("mxrec._lib", 0),
    ("mxrec.constants", 0),
    ("mxrec.util", 1),  # the configuration in force, op wrappers, the registry (util.registry)
    ("mxrec.core", 2),
    ("mxrec.graph", 3),
    ("mxrec.optimizers", 3),
    ("mxrec.saver", 3),
    ("mxrec.distributed", 4),  # several workers: above the single-process layers
    ("mxrec.export", 4),  # serving export (Session and Keras paths): checkpoint -> SavedModel
    ("mxrec.initialize", 5),  # init(): above what it installs (the wing, this rank's server)
    ("mxrec.hooks", 6),  # every SessionRunHook
    ("mxrec.serving", 7),  # the predictor: follows an export base, answers REST requests
    ("mxrec.streaming", 8),  # the streaming trainer: data in, checkpoints and exports out
    ("mxrec.keras", 8),  # TF2: the tables as a Keras layer, Keras optimizers that train them
    ("mxrec.launch", 9),  # `python -m mxrec.launch`: starts the ranks
    ("mxrec.quality", 9),  # `python -m mxrec.quality`: a model's forms scored side by side
    ("mxrec.compat", 10),  # mx_rec's module paths (aliases of the modules above)
)

# Imports against the direction that are allowed, and why: none. A lower layer that needs
# what a higher one has reads a slot of mxrec.util.registry, which the higher one fills.
ALLOWED: Dict[Tuple[str, str], str] = {}


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(root: pathlib.Path = PACKAGE_ROOT) -> Dict[str, str]:
    """{module name: source} of every module of the package under `root`."""
    return {_module_name(path, root): path.read_text()
            for path in sorted(root.rglob("*.py"))}


def _resolve(module: str, is_package: bool, level: int, target: str) -> str:
    if level == 0:
        return target
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imported_names(module: str, source: str, is_package: bool) -> List[str]:
    """Every dotted name an import of `module` names (`from a import b`: `a.b`), as written."""
    names: List[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module or "")
            names += [f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant)):
            names.append(node.args[0].value)
    return names


def imports(modules: Dict[str, str], packages: Set[str]) -> Dict[str, Set[str]]:
    """{module: the mxrec modules it imports}, from every import statement in it."""
    known = set(modules)
    out: Dict[str, Set[str]] = {}
    for module, source in modules.items():
        found = set()
        for name in imported_names(module, source, module in packages):
            if name == "mxrec" or name.startswith("mxrec."):
                while name not in known and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name != module:
                    found.add(name)
        out[module] = found
    return out


def layer(module: str) -> Tuple[str, int]:
    """(the layer's package, its rank) of a module; the top package is above all."""
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    return "mxrec", len(LAYERS)


def violations(graph: Dict[str, Set[str]], allowed=ALLOWED) -> List[str]:
    """Imports of a layer above, or of a sibling package of the same layer."""
    bad = []
    for module, targets in sorted(graph.items()):
        package, rank = layer(module)
        for target in sorted(targets):
            target_package, target_rank = layer(target)
            if target_package == package or target_rank < rank:
                continue
            if (module, target) not in allowed:
                bad.append(f"{module} imports {target}")
    return bad


def cycles(graph: Dict[str, Set[str]], allowed=ALLOWED) -> List[List[str]]:
    """The import circles (strongly connected sets of two or more modules)."""
    edges = {m: {t for t in ts if (m, t) not in allowed and t in graph}
             for m, ts in graph.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _is_forwarding(node: ast.stmt) -> bool:
    """A statement a module that only forwards another's names is made of."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return True  # the docstring
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        # `__all__`, `sys.modules[name] = other`, `other.name = ...`
        return all((isinstance(t, ast.Name) and t.id == "__all__")
                   or isinstance(t, (ast.Subscript, ast.Attribute)) for t in targets)
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and ast.unparse(node.test) == "__name__ == '__main__'")


def forwarders(modules: Dict[str, str], packages: Set[str]) -> List[str]:
    """The modules outside `mxrec.compat` that only re-export another: a body of imports,
    `__all__`, a docstring (and `sys.modules` swaps). A package that gathers the names of its
    own modules is not one."""
    found = []
    for module, source in sorted(modules.items()):
        if module == "mxrec.compat" or module.startswith("mxrec.compat."):
            continue
        body = ast.parse(source).body
        names = [name for name in imported_names(module, source, module in packages)
                 if name.startswith("mxrec.")]
        if module in packages and all(name.startswith(module + ".") for name in names):
            continue
        if names and all(_is_forwarding(node) for node in body):
            found.append(module)
    return found


def _package_graph():
    modules = sources()
    packages = {_module_name(p, PACKAGE_ROOT) for p in PACKAGE_ROOT.rglob("__init__.py")}
    return imports(modules, packages)


def test_every_module_has_a_layer():
    loose = [m for m in _package_graph() if layer(m)[0] == "mxrec" and m != "mxrec"]
    assert not loose, f"modules outside every layer of LAYERS: {loose}"


def test_imports_run_one_way():
    bad = violations(_package_graph())
    assert not bad, "imports against util -> core -> graph/optimizers/saver -> hooks:\n" + \
        "\n".join(bad)


def test_no_import_cycles():
    assert cycles(_package_graph()) == []


def _packages() -> Set[str]:
    return {_module_name(p, PACKAGE_ROOT) for p in PACKAGE_ROOT.rglob("__init__.py")}


def test_no_module_only_forwards_another():
    found = forwarders(sources(), _packages())
    assert not found, ("modules that only re-export another (mx_rec's paths belong in "
                       f"mxrec.compat, mxrec's own in one module): {found}")


# mx_rec's paths (mxrec.compat): for mx_rec's scripts, not for mxrec itself.
COMPAT_PATHS = tuple(sorted(set(compat.MODULES) | set(compat.NAMES)))


def test_no_module_uses_a_compat_path():
    modules, packages = sources(), _packages()
    users = [f"{module} imports {name}" for module, source in sorted(modules.items())
             if module != "mxrec" and not module.startswith("mxrec.compat")
             for name in imported_names(module, source, module in packages)
             if any(name == path or name.startswith(path + ".") for path in COMPAT_PATHS)]
    assert not users, "import the modules mxrec.compat names, not mx_rec's paths:\n" + \
        "\n".join(users)


def test_compat_paths_are_not_modules_of_ours():
    """A path that is both mx_rec's and a real module of ours stays the real module."""
    modules = sources()
    shadowed = [path for path in compat.MODULES if path in modules]
    assert not shadowed, f"mxrec.compat.MODULES names real modules: {shadowed}"
    assert all(target in modules for target in compat.MODULES.values())
    assert all(path.rsplit(".", 1)[0] in modules and target in modules
               for path, target in compat.NAMES.items())


def test_the_wing_plugs_in_from_above():
    """core, graph, optimizers and saver never import mxrec.distributed: the wing fills the
    registry's WING slot, which mxrec.core.wing reads."""
    below = ("mxrec.core", "mxrec.graph", "mxrec.optimizers", "mxrec.saver")
    bad = [f"{module} imports {target}" for module, targets in sorted(_package_graph().items())
           if module.startswith(below)
           for target in sorted(targets) if target.startswith("mxrec.distributed")]
    assert not bad, "\n".join(bad)


def test_no_exceptions():
    assert ALLOWED == {}, "an import against the layers: fill a slot of mxrec.util.registry"


@pytest.mark.parametrize("source,expected", [
    ("def f():\n    from mxrec.graph import modifier\n",
     ["mxrec.util.a imports mxrec.graph.modifier"]),
    ("from ..core import table\n", ["mxrec.util.a imports mxrec.core.table"]),
    ("import importlib\nimportlib.import_module('mxrec.hooks.h')\n",
     ["mxrec.util.a imports mxrec.hooks.h"]),
    ("from mxrec._lib import loader\nfrom mxrec.util import b\n", []),
])
def test_checker_catches_upward_imports(source, expected):
    modules = {"mxrec.util.a": source, "mxrec.util.b": "", "mxrec._lib.loader": "",
               "mxrec.core.table": "", "mxrec.graph.modifier": "", "mxrec.hooks.h": "",
               "mxrec.core": "", "mxrec.graph": "", "mxrec.util": ""}
    packages = {"mxrec.core", "mxrec.graph", "mxrec.util"}
    assert violations(imports(modules, packages), allowed={}) == expected


def test_checker_catches_cycles_and_sibling_imports():
    modules = {"mxrec.core.a": "from mxrec.core import b\n",
               "mxrec.core.b": "def f():\n    from mxrec.core import a\n",
               "mxrec.core": "",
               "mxrec.saver.s": "from mxrec.graph import g\n", "mxrec.graph.g": ""}
    graph = imports(modules, {"mxrec.core"})
    assert cycles(graph, allowed={}) == [["mxrec.core.a", "mxrec.core.b"]]
    assert violations(graph, allowed={}) == ["mxrec.saver.s imports mxrec.graph.g"]


@pytest.mark.parametrize("source,forwards", [
    ('"""Old path."""\nimport sys\nfrom mxrec.distributed import replicated as _moved\n'
     "sys.modules[__name__] = _moved\n", True),
    ('"""Old path."""\nfrom mxrec.core.host_state import HostStateSaveable\n'
     '__all__ = ["HostStateSaveable"]\n', True),
    ("import sys\nfrom mxrec.x.launch import main\nif __name__ == '__main__':\n"
     "    sys.exit(main())\n", True),
    ("from mxrec.core import table\n\n\ndef f():\n    return table\n", False),
    ('"""Nothing imported."""\n', False),
])
def test_checker_catches_forwarding_modules(source, forwards):
    modules = {"mxrec.util.a": source, "mxrec.hooks": "from mxrec.hooks.h import H\n",
               "mxrec.compat.c": "from mxrec.util import a\n"}
    found = forwarders(modules, {"mxrec.hooks"})
    assert found == (["mxrec.util.a"] if forwards else [])


def test_mx_rec_paths_reach_the_real_modules():
    import importlib

    from mxrec.constants import constants
    from mxrec.core import dynamic, embedding
    from mxrec.hooks import incremental_checkpoint as hook_module
    from mxrec.saver import checkpoint, manifest

    assert checkpoint.IncrementalCheckpointHook is hook_module.IncrementalCheckpointHook
    assert checkpoint.CheckpointError is manifest.CheckpointError
    assert embedding.SPARSE_TABLE_COLLECTION == constants.SPARSE_TABLE_COLLECTION
    assert embedding.TIMESTAMP_COLLECTION == constants.TIMESTAMP_COLLECTION
    assert dynamic.ASCEND_SPARSE_LOOKUP_LOCAL_EMB == constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB
    with pytest.raises(AttributeError, match="no_such_name"):
        checkpoint.no_such_name  # noqa: B018
    for path, target in compat.MODULES.items():
        assert importlib.import_module(path) is importlib.import_module(target), path
