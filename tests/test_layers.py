"""mxrec's import graph runs one way: util -> core -> graph / optimizers / saver -> distributed
-> hooks.

Every module's imports (top-level and inside functions, `importlib.import_module`
with a literal name too) are read with `ast`; a module may import its own
package and the layers below it, never a layer above or a sibling package of
its layer, and no set of modules may import each other in a circle.
"""

import ast
import pathlib
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent.parent / "mxrec"

# Lower layers first. Each module belongs to the first prefix that matches it.
LAYERS: Tuple[Tuple[str, int], ...] = (
    ("mxrec._lib", 0),
    ("mxrec.constants", 0),
    ("mxrec.util", 1),
    ("mxrec.core", 2),
    ("mxrec.graph", 3),
    ("mxrec.optimizers", 3),
    ("mxrec.saver", 3),
    ("mxrec.distributed", 4),  # several workers: above the single-process layers
    ("mxrec.hooks", 5),
    ("mxrec.serving", 6),  # the predictor: follows an export base, answers REST requests
    ("mxrec.streaming", 7),  # the streaming trainer: data in, checkpoints and exports out
    ("mxrec.keras", 7),  # TF2: the tables as a Keras layer, Keras optimizers that train them
    ("mxrec.launch", 8),  # the old path of `python -m mxrec.launch` (mxrec.distributed.launch)
)

# Imports against the direction that are allowed, and why.
ALLOWED: Dict[Tuple[str, str], str] = {
    # Old import paths of the modules that moved into mxrec.distributed: each is the moved
    # module under its old name (mx_rec's paths among them: mxrec.util.communication[.hccl_ops]).
    **{(old, new): "the old import path of a module moved into mxrec.distributed"
       for old, new in (
           ("mxrec.util.communication", "mxrec.distributed.communication"),
           ("mxrec.util.communication", "mxrec.distributed.hccl_ops"),
           ("mxrec.core.replicated", "mxrec.distributed.replicated"),
           ("mxrec.core.sharded_state", "mxrec.distributed.sharded_state"),
           ("mxrec.graph.sharded", "mxrec.distributed.sharded_pipeline"),
       )},
    ("mxrec.core.feature_process", "mxrec.hooks.evict"):
        "mx_rec's import path of EvictHook (the hook lives in mxrec.hooks)",
    ("mxrec.util.initialize", "mxrec.distributed.communication"):
        "init() reads the ranks from the launcher's environment and starts this rank's "
        "server: multi-worker training's entry point",
    ("mxrec.util.initialize", "mxrec.distributed.multirank"):
        "init() on several ranks installs the wing's behaviour (mxrec.core.wing)",
}


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


def imports(modules: Dict[str, str], packages: Set[str]) -> Dict[str, Set[str]]:
    """{module: the mxrec modules it imports}, from every import statement in it."""
    known = set(modules)
    out: Dict[str, Set[str]] = {}
    for module, source in modules.items():
        found = set()
        for node in ast.walk(ast.parse(source)):
            names: List[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, module in packages, node.level, node.module or "")
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    names.append(candidate if candidate in known else base)
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                    node.func, "id", None)) == "import_module" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                names = [node.args[0].value]
            for name in names:
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


# Old import paths of moved modules: for users (and mx_rec's scripts), not for mxrec itself.
OLD_PATHS = ("mxrec.util.communication", "mxrec.core.replicated", "mxrec.core.sharded_state",
             "mxrec.graph.sharded", "mxrec.launch")
# mx_rec's own module that names the old path (`mx_rec.util.tf_version_adapter.hccl_ops`).
OLD_PATH_USERS = {"mxrec.util.tf_version_adapter": "mx_rec's tf_version_adapter re-exports "
                                                    "mx_rec's hccl_ops path",
                  "mxrec.util": "mx_rec's `mx_rec.util.communication` attribute, imported on "
                                "first use by the package's __getattr__"}


def test_no_module_uses_an_old_path():
    users = [f"{module} imports {target}" for module, targets in sorted(_package_graph().items())
             for target in sorted(targets)
             if target in OLD_PATHS and module not in OLD_PATH_USERS]
    assert not users, "use the modules in mxrec.distributed:\n" + "\n".join(users)


def test_the_wing_plugs_in_from_above():
    """core, graph, optimizers and saver never import mxrec.distributed (their old-path
    modules aside): the wing installs its behaviour into mxrec.core.wing."""
    below = ("mxrec.core", "mxrec.graph", "mxrec.optimizers", "mxrec.saver")
    bad = [f"{module} imports {target}" for module, targets in sorted(_package_graph().items())
           if module.startswith(below) and module not in OLD_PATHS
           for target in sorted(targets) if target.startswith("mxrec.distributed")]
    assert not bad, "\n".join(bad)


def test_allowed_exceptions_are_still_needed():
    graph = _package_graph()
    stale = [pair for pair in ALLOWED if pair[1] not in graph.get(pair[0], set())]
    assert not stale, f"ALLOWED names imports that no longer exist: {stale}"


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


def test_old_import_paths_still_work():
    from mxrec.constants import constants
    from mxrec.core import dynamic, embedding, host_state
    from mxrec.hooks import checkpoint as hook_module
    from mxrec.saver import checkpoint, manifest
    from mxrec.saver import host_state as old_host_state

    assert checkpoint.IncrementalCheckpointHook is hook_module.IncrementalCheckpointHook
    assert checkpoint.CheckpointError is manifest.CheckpointError
    assert old_host_state.HostStateSaveable is host_state.HostStateSaveable
    assert embedding.SPARSE_TABLE_COLLECTION == constants.SPARSE_TABLE_COLLECTION
    assert embedding.TIMESTAMP_COLLECTION == constants.TIMESTAMP_COLLECTION
    assert dynamic.ASCEND_SPARSE_LOOKUP_LOCAL_EMB == constants.ASCEND_SPARSE_LOOKUP_LOCAL_EMB
    with pytest.raises(AttributeError, match="no_such_name"):
        checkpoint.no_such_name  # noqa: B018
