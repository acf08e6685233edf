"""docs/ARCHITECTURE.md stays true to the code: every module, file, name and class it cites
exists, its tables cover every module, and its layer diagram is tests/test_layers.py's LAYERS.

Read with `ast` and plain text only (nothing of mxrec or TensorFlow is imported):

- paths in backticks under mxrec/, cc_ops/, tests/, bench/, scripts/, docs/, examples/ exist
  (`a.{h,cc}` stands for a.h and a.cc; a path ending in / is a folder);
- every dotted `mxrec.x.y` name anywhere in the doc is a module, or a module and a name defined
  in it (a function, class or assignment, or a method of a class there), or one of mx_rec's
  paths that mxrec/compat/__init__.py defines;
- every CamelCase name in backticks (`HostTable`, `BatchPlanner::Plan`, `GraphState`) is a C++
  name of cc_ops/ (`Class::member`: a member of that class), a class or function of mxrec/,
  or one of the TensorFlow names in TENSORFLOW_NAMES;
- every Python module under mxrec/ and every file under cc_ops/ is cited;
- every link resolves (a file, or a heading of the doc), and code's references to a section
  ("Determinism" in docs/ARCHITECTURE.md) name a heading;
- no table cell is over MAX_CELL_WORDS words;
- the diagram's layer lines ("rank  mxrec.a, mxrec.b  what they own") list LAYERS' packages
  with their ranks, bottom line first, in LAYERS' order.
"""

import ast
import functools
import pathlib
import re
from typing import Dict, Iterable, List, Optional, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PATH_ROOTS = ("mxrec/", "cc_ops/", "tests/", "bench/", "scripts/", "docs/", "examples/")
MAX_CELL_WORDS = 25
# TensorFlow's names the doc cites in backticks (not defined in this repository).
TENSORFLOW_NAMES = frozenset({"IteratorGetNext"})

_SPAN = re.compile(r"`([^`\n]+)`")
_DOTTED = re.compile(r"(?<![\w.])mxrec(?:\.[A-Za-z_]\w*)+")
_PATH = re.compile(r"[\w./{},*-]+")
_CAMEL = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*(?:::[A-Za-z_]\w*)?")
_LAYER_LINE = re.compile(r"\s*(\d+)\s+(mxrec\.[\w.]+(?:,\s*mxrec\.[\w.]+)*)(?:\s{2,}\S.*)?$")


# ------------------------------------------------------------------------- the doc's text

def spans(text: str) -> List[str]:
    """The backticked spans of `text`, fenced blocks left out."""
    return _SPAN.findall(_without_fences(text))


def _without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def expand(path: str) -> List[str]:
    """`a.{h,cc}` -> [a.h, a.cc]; one brace group at most."""
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    return [path[:match.start()] + part + path[match.end():] for part in match.group(1).split(",")]


def cited_paths(text: str) -> List[str]:
    """The repository paths the doc cites in backticks (brace groups expanded)."""
    out = []
    for span in spans(text):
        if span.startswith(PATH_ROOTS) and " " not in span:
            out += expand(span)
    return out


def stale_paths(text: str, root: pathlib.Path = ROOT) -> List[str]:
    """The cited paths that are no file or folder of the repository, each with why."""
    stale = []
    for path in cited_paths(text):
        if not _PATH.fullmatch(path) or "*" in path or "{" in path:
            stale.append(f"{path} (not a plain path)")
        elif path.endswith("/") and not (root / path).is_dir():
            stale.append(f"{path} (no such folder)")
        elif not path.endswith("/") and not (root / path).is_file():
            stale.append(f"{path} (no such file)")
    return stale


# ------------------------------------------------------------------------ Python names

def _module_file(name: str, root: pathlib.Path) -> Optional[pathlib.Path]:
    """The source of module `name` (its folder for a namespace package), or None."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    if base.is_dir():  # a namespace package (no __init__.py)
        return base
    return None


def _bound_names(body: Iterable[ast.stmt]) -> Dict[str, ast.AST]:
    """The names a module (or class) body binds: defs, classes, assignments, imports, also
    inside its top-level if/try blocks."""
    names: Dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for element in ast.walk(target):
                    if isinstance(element, ast.Name):
                        names[element.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [handler.body for handler in getattr(node, "handlers", [])]
            for block in blocks:
                names.update(_bound_names(block))
    return names


@functools.cache
def _module_names(path: pathlib.Path) -> Dict[str, ast.AST]:
    return _bound_names(ast.parse(path.read_text()).body) if path.is_file() else {}


@functools.cache
def compat_tables(root: pathlib.Path = ROOT) -> Tuple[Dict[str, str], Dict[str, str]]:
    """mxrec.compat's MODULES and NAMES, read from its source."""
    tables = {}
    for node in ast.parse((root / "mxrec" / "compat" / "__init__.py").read_text()).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            tables[node.target.id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            tables[node.targets[0].id] = ast.literal_eval(node.value)
    return tables["MODULES"], tables["NAMES"]


def python_name_problem(name: str, root: pathlib.Path = ROOT) -> Optional[str]:
    """Why the dotted `name` (mxrec.a.b[.attr[.member]]) does not exist, or None."""
    modules, names = compat_tables(root)
    if name in modules or name in names:
        return None
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        module = modules.get(module, module)  # mx_rec's path of a module: the module
        path = _module_file(module, root)
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if len(rest) > 2:
            return f"{'.'.join(rest)} is not a name of module {module}"
        found = _module_names(path).get(rest[0])
        if found is None and (path.is_dir() or path.name == "__init__.py"):
            return f"package {module} has no module or name {rest[0]}"
        if found is None:
            return f"module {module} defines no {rest[0]}"
        if len(rest) == 2 and not (isinstance(found, ast.ClassDef)
                                   and rest[1] in _bound_names(found.body)):
            return f"{module}.{rest[0]} has no member {rest[1]}"
        return None
    return "no such module"


def stale_dotted(text: str, root: pathlib.Path = ROOT) -> List[str]:
    """The dotted mxrec names of `text` that name nothing, each with why."""
    found = sorted(set(_DOTTED.findall(text)))
    return [f"{name} ({why})" for name in found
            for why in [python_name_problem(name, root)] if why is not None]


@functools.cache
def python_definitions(root: pathlib.Path = ROOT) -> Set[str]:
    """Every class and function name defined anywhere in mxrec/ (methods included)."""
    names = set()
    for path in (root / "mxrec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names


# ---------------------------------------------------------------------------- C++ names

@functools.cache
def cpp_sources(root: pathlib.Path = ROOT) -> str:
    """cc_ops/'s C++ with comments removed (string literals, such as op names, kept)."""
    text = "\n".join(p.read_text() for p in sorted((root / "cc_ops").rglob("*"))
                     if p.suffix in (".h", ".cc"))
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _class_body(source: str, name: str) -> Optional[str]:
    """The body of C++ class or struct `name` (its definition, not a declaration)."""
    for match in re.finditer(rf"\b(?:class|struct)\s+(?:\[\[\w+\]\]\s+)?{name}\b[^;{{]*\{{",
                             source):
        depth, start = 1, match.end()
        for index in range(start, len(source)):
            depth += {"{": 1, "}": -1}.get(source[index], 0)
            if depth == 0:
                return source[start:index]
    return None


def cpp_name_problem(name: str, root: pathlib.Path = ROOT) -> Optional[str]:
    """Why the backticked CamelCase `name` (or `Class::member`) is nowhere, or None."""
    source = cpp_sources(root)
    if "::" in name:
        owner, member = name.split("::")
        body = _class_body(source, owner)
        if body is None:
            return f"no C++ class or struct {owner} in cc_ops/"
        if re.search(rf"\b{member}\b", body) or f"{owner}::{member}" in source:
            return None
        return f"{owner} has no member {member}"
    if (re.search(rf"\b{name}\b", source) or name in python_definitions(root)
            or name in TENSORFLOW_NAMES):
        return None
    return "neither a C++ name of cc_ops/ nor a class or function of mxrec/"


def stale_classes(text: str, root: pathlib.Path = ROOT) -> List[str]:
    """The backticked CamelCase names of `text` defined nowhere, each with why."""
    found = sorted({span for span in spans(text) if _CAMEL.fullmatch(span)})
    return [f"{name} ({why})" for name in found
            for why in [cpp_name_problem(name, root)] if why is not None]


# ---------------------------------------------------------------------- coverage, links

def uncited_files(text: str, root: pathlib.Path = ROOT) -> List[str]:
    """Python modules of mxrec/ and files of cc_ops/ the doc does not cite. A package's
    __init__.py is cited by its folder."""
    cited = set(cited_paths(text))
    missing = []
    for path in sorted((root / "mxrec").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        folder = path.parent.relative_to(root).as_posix() + "/"
        if name not in cited and not (path.name == "__init__.py" and folder in cited):
            missing.append(name)
    for path in sorted((root / "cc_ops").rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_file() and name not in cited:
            missing.append(name)
    return missing


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def headings(text: str) -> List[str]:
    """The doc's headings, outside fenced blocks."""
    return re.findall(r"^#+\s+(.+)$", _without_fences(text), flags=re.M)


def broken_links(text: str, doc: pathlib.Path = DOC) -> List[str]:
    """Links to no file (relative to the doc's folder) or to no heading of the doc."""
    anchors = {anchor(h) for h in headings(text)}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_fences(text)):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, fragment = target.partition("#")
        if path and not (doc.parent / path).exists():
            broken.append(f"{target} (no such file)")
        elif not path and fragment not in anchors:
            broken.append(f"{target} (no such heading)")
    return broken


# '"A" in docs/ARCHITECTURE.md', '"A" and "B" in docs/ARCHITECTURE.md',
# 'docs/ARCHITECTURE.md, "A"'.
_SECTION_REFERENCE = re.compile(
    r'((?:"[^"]+"(?:,\s*|\s+and\s+))*"[^"]+")\s+in\s+docs/ARCHITECTURE\.md'
    r'|docs/ARCHITECTURE\.md,\s*("[^"]+")')


def sections_cited(text: str) -> List[str]:
    """The doc's sections that `text` (code, comments joined across lines) cites."""
    text = re.sub(r"\s*\n\s*(?://|#)?\s*", " ", text)
    return [name for match in _SECTION_REFERENCE.finditer(text)
            for name in re.findall(r'"([^"]+)"', match.group(1) or match.group(2))]


def section_references(root: pathlib.Path = ROOT) -> List[Tuple[str, str]]:
    """(file, section) of each reference of mxrec/'s and cc_ops/'s code to a section of
    the doc."""
    found = []
    for path in sorted(list((root / "mxrec").rglob("*.py")) + list((root / "cc_ops").rglob("*"))):
        if path.suffix in (".py", ".h", ".cc"):
            found += [(path.relative_to(root).as_posix(), name)
                      for name in sections_cited(path.read_text())]
    return found


def long_cells(text: str, limit: int = MAX_CELL_WORDS) -> List[str]:
    """The table cells of more than `limit` words, each with its count and beginning."""
    out = []
    for line in _without_fences(text).splitlines():
        if line.startswith("|") and not re.fullmatch(r"[|\s:-]+", line):
            for cell in line.strip().strip("|").split("|"):
                if len(cell.split()) > limit:
                    out.append(f"{len(cell.split())} words: {cell.strip()[:60]}...")
    return out


# ------------------------------------------------------------------------------ layers

def layers_of_test(root: pathlib.Path = ROOT) -> List[Tuple[str, int]]:
    """tests/test_layers.py's LAYERS, read from its source."""
    for node in ast.parse((root / "tests" / "test_layers.py").read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "LAYERS":
            return [tuple(layer) for layer in ast.literal_eval(node.value)]
    raise AssertionError("tests/test_layers.py defines no LAYERS")


def diagram_layers(text: str) -> List[Tuple[str, int]]:
    """The layers of the doc's diagram (the first fenced block under "## The layers"):
    [(package, rank)] bottom line first, left to right. A line that starts with a number
    must be a layer line."""
    section = re.search(r"^## The layers\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert section, 'docs/ARCHITECTURE.md has no "## The layers" section'
    block = re.search(r"^```[^\n]*\n(.*?)^```", section.group(1), flags=re.S | re.M)
    assert block, 'the "## The layers" section has no fenced diagram'
    layers = []
    for line in block.group(1).splitlines():
        if not re.match(r"\s*\d", line):
            continue
        match = _LAYER_LINE.fullmatch(line)
        assert match, f"a layer line of the diagram does not parse: {line.strip()!r}"
        rank = int(match.group(1))
        layers.append([(name.strip(), rank) for name in match.group(2).split(",")])
    return [layer for line in reversed(layers) for layer in line]


# ------------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


@pytest.mark.parametrize("checker,what", [
    (stale_paths, "paths"), (stale_dotted, "mxrec names"), (stale_classes, "classes"),
])
def test_cited_names_exist(doc, checker, what):
    stale = checker(doc)
    assert not stale, f"docs/ARCHITECTURE.md cites {what} that do not exist:\n" + \
        "\n".join(stale)


def test_every_module_and_native_file_is_cited(doc):
    missing = uncited_files(doc)
    assert not missing, "docs/ARCHITECTURE.md's tables miss:\n" + "\n".join(missing)


def test_links_and_section_references_resolve(doc):
    broken = broken_links(doc)
    assert not broken, "docs/ARCHITECTURE.md's links that lead nowhere:\n" + "\n".join(broken)
    known = [anchor(h) for h in headings(doc)]
    unknown = [f"{path}: {section!r}" for path, section in section_references()
               if not any(a.startswith(anchor(section)) for a in known)]
    assert not unknown, "code cites sections docs/ARCHITECTURE.md does not have:\n" + \
        "\n".join(unknown)


def test_table_cells_are_short(doc):
    long = long_cells(doc)
    assert not long, f"table cells over {MAX_CELL_WORDS} words:\n" + "\n".join(long)


def diagram_difference(drawn: List[Tuple[str, int]], layers: List[Tuple[str, int]]
                       ) -> Optional[str]:
    """Where the diagram's layers (bottom first) first differ from LAYERS, or None."""
    for index, (mine, theirs) in enumerate(zip(drawn, layers)):
        if mine != theirs:
            return (f"layer {index} (bottom first) is {mine[0]} at rank {mine[1]} in the "
                    f"diagram, {theirs[0]} at rank {theirs[1]} in LAYERS")
    if len(drawn) != len(layers):
        extra = drawn[len(layers):] or layers[len(drawn):]
        where = "diagram" if len(drawn) > len(layers) else "LAYERS"
        return f"only the {where} has {[name for name, _ in extra]}"
    return None


def test_layer_diagram_is_test_layers(doc):
    difference = diagram_difference(diagram_layers(doc), layers_of_test())
    assert difference is None, ("the layer diagram of docs/ARCHITECTURE.md is not "
                                f"tests/test_layers.py's LAYERS: {difference}")


# ------------------------------------------------------------- the checkers catch staleness

@pytest.mark.parametrize("text,stale", [
    ("`mxrec/graph/sharded.py`", ["mxrec/graph/sharded.py (no such file)"]),
    ("`mxrec/keras/`, `mxrec/no_such/`", ["mxrec/no_such/ (no such folder)"]),
    ("`cc_ops/engine/host_tier.{h,cc}` `cc_ops/engine/key_map.{h,cc}`",
     ["cc_ops/engine/key_map.cc (no such file)"]),
    ("`mxrec/optimizers/*_by_addr.py`", ["mxrec/optimizers/*_by_addr.py (not a plain path)"]),
])
def test_stale_paths_are_named(text, stale):
    assert stale_paths(text) == stale


@pytest.mark.parametrize("text,stale", [
    ("mxrec.graph.sharded builds ...", ["mxrec.graph.sharded (package mxrec.graph has no "
                                         "module or name sharded)"]),
    ("mxrec.gone.module", ["mxrec.gone.module (package mxrec has no module or name gone)"]),
    ("`mxrec.core.table.no_such`", ["mxrec.core.table.no_such (module mxrec.core.table "
                                    "defines no no_such)"]),
    ("mxrec.core.table.DeviceTable.gone", ["mxrec.core.table.DeviceTable.gone "
                                           "(mxrec.core.table.DeviceTable has no member gone)"]),
    ("mxrec.core.table.DeviceTable.lookup_planned, mxrec.util.initialize.init, "
     "mxrec.graph.modifier.GraphModifierHook, mxrec.export, mxrec.util.communication", []),
])
def test_stale_python_names_are_named(text, stale):
    assert stale_dotted(text) == stale


@pytest.mark.parametrize("text,stale", [
    ("`HostTable`, `BatchPlanner::Plan`, `KeyRecord::in_chain`, `GraphState`", []),
    ("`HostTable::NoSuchPhase`", ["HostTable::NoSuchPhase (HostTable has no member "
                                  "NoSuchPhase)"]),
    ("`NoSuchPlanner::Plan`", ["NoSuchPlanner::Plan (no C++ class or struct NoSuchPlanner in "
                               "cc_ops/)"]),
    ("`HostTableGone`", ["HostTableGone (neither a C++ name of cc_ops/ nor a class or function "
                         "of mxrec/)"]),
])
def test_stale_classes_are_named(text, stale):
    assert stale_classes(text) == stale


def test_stale_diagram_is_refused():
    text = ("## The layers\n\n```text\n  1  mxrec.util, mxrec.core   x\n"
            "  0  mxrec._lib, mxrec.constants   y\n```\n\n## Next\n")
    assert diagram_layers(text) == [("mxrec._lib", 0), ("mxrec.constants", 0),
                                    ("mxrec.util", 1), ("mxrec.core", 1)]
    assert diagram_difference(diagram_layers(text), layers_of_test()) == (
        "layer 3 (bottom first) is mxrec.core at rank 1 in the diagram, mxrec.core at rank 2 "
        "in LAYERS")
    assert diagram_difference(layers_of_test()[:-1], layers_of_test()) == (
        "only the LAYERS has ['mxrec.compat']")
    with pytest.raises(AssertionError, match="does not parse"):
        diagram_layers("## The layers\n```\n  3  graph modifier\n```\n## Next\n")


def test_coverage_names_uncited_modules():
    assert "mxrec/launch.py" in uncited_files("`mxrec/hooks/` `mxrec/hooks/evict.py`")
    assert "mxrec/hooks/__init__.py" not in uncited_files("`mxrec/hooks/`")


def test_broken_links_and_long_cells_are_named():
    text = "# Top\n## The step boundary: pending batches\n[a](#top) [b](#gone) [c](NO_SUCH.md)\n"
    assert broken_links(text) == ["#gone (no such heading)", "NO_SUCH.md (no such file)"]
    assert anchor("The step boundary: pending batches") == "the-step-boundary-pending-batches"
    assert long_cells("| a | " + "word " * 26 + "|\n") == [
        "26 words: " + ("word " * 26).strip()[:60] + "..."]


def test_section_references_are_read_across_comment_lines():
    code = ('// See "Checkpoints" and "The step boundary" in\n// docs/ARCHITECTURE.md.\n'
            'x = 1  # (docs/ARCHITECTURE.md, "Determinism")\n')
    assert sections_cited(code) == ["Checkpoints", "The step boundary", "Determinism"]
