"""No function in mxrec/ is longer than 60 lines: a longer one is split by phase, a helper
per phase and a short function that reads as their sequence.

A function's length is `end_lineno - lineno + 1` of its `ast` node: from its `def` line to
its last line, the docstring included, the decorators not. Nested functions and methods
count as functions of their own (and within the function around them).
"""

import ast
import pathlib
from typing import Dict, Iterator, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMIT = 60

# argparse parser builders: one add_argument call per flag with its help text, a list
# that reads best whole.
ARGPARSE_BUILDERS = frozenset({
    "mxrec/streaming/__main__.py::build_parser",
})



def _functions(tree: ast.AST, prefix: str = "") -> Iterator[Tuple[str, ast.AST]]:
    """(qualified name, node) of every function under `tree`, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _lengths() -> Dict[str, Tuple[int, ast.AST]]:
    """"path::qualified name" -> (length in lines, node) of every function in mxrec/."""
    out = {}
    for path in sorted((ROOT / "mxrec").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for name, node in _functions(ast.parse(path.read_text(), str(path))):
            out[f"{relative}::{name}"] = (node.end_lineno - node.lineno + 1, node)
    return out


@pytest.fixture(scope="module")
def lengths():
    return _lengths()


def test_no_function_is_longer_than_the_limit(lengths):
    long = {key: length for key, (length, _) in lengths.items()
            if length > LIMIT and key not in ARGPARSE_BUILDERS}
    assert not long, (f"functions over {LIMIT} lines (split each by phase): "
                      + ", ".join(f"{key} ({length})" for key, length in sorted(long.items())))


def test_argparse_builders_only_build_parsers(lengths):
    """An allowed builder exists, is still long, and calls add_argument: the allowance
    cannot outlive the builder or cover another function."""
    for key in sorted(ARGPARSE_BUILDERS):
        assert key in lengths, f"{key} is gone: drop it from ARGPARSE_BUILDERS"
        length, node = lengths[key]
        assert length > LIMIT, f"{key} has {length} lines: drop it from ARGPARSE_BUILDERS"
        calls = [call.func.attr for call in ast.walk(node)
                 if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)]
        assert "add_argument" in calls, f"{key} adds no argparse argument"
