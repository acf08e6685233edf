"""The documentation stays a set of guides a user can follow.

Pages: the guides (README.md and docs/*.md), design notes (docs/design/) and the dated record
of measurements (docs/history/). Rules:

- Links: every relative link of every page resolves, to a file or folder of the repository,
  and a `#anchor` to a heading of the target page under GitHub's rules (lowercased,
  punctuation other than `-` and `_` removed, each space a `-`, a repeated heading `-1`, ...).
- Length: a guide under docs/ has at most 250 lines. Rationale goes to docs/design/, dated
  experiments to docs/history/, figures to bench/RESULTS.md.
- Figures are links: a paragraph of a guide (a list item and a table row count as one each)
  that states a measured figure links bench/RESULTS.md. A measured figure is a decimal ratio
  written with x (`0.82x`, `1.5 x`, `1.2×`), a decimal fraction "of" a baseline (`0.96 of
  one process`), a rate (a number before `samples/s`, `rows/s`, `keys/s`, `IDs/s`, `MB/s`,
  ...), a size per ID or row (`56 bytes per ID`, `250 MiB per million IDs`), a time per step,
  batch or call (`9.1 ms a step`), or a percentage faster or slower. So a benchmark's figure
  cannot be copied into a guide without the link to where its current value is.
- Code blocks run: every fenced ```python block of any page runs, in a fresh Python process
  in a temporary folder (PYTHONPATH at the repository, TensorFlow's log quiet, 120 s), unless
  the line just before its fence is `<!-- fragment -->`. A block with `<!-- continued -->` on
  the line before its fence runs with the python block(s) before it in the page, as one
  script; fragments between them (an aside, an alternative) are left out of that script.
  README's example, which tests/test_readme.py runs and checks, is not run twice.

PENDING names pages that other branches rewrite at the same time, with the SHA-256 of the
text they had when the entry was made and the rules they broke then: those rules skip such a
page only while its text is exactly that, and test_pending_entries_are_current fails once it
changed (remove the entry then: the rules apply to the new text).
"""

import hashlib
import importlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDE_LINES = 250
# A reference page, not a guide: the module map grows with the modules. Held to its own cap.
LONGER_PAGES = {"docs/ARCHITECTURE.md": 720}  # a row per module (about 140), the design sections
RESULTS = "bench/RESULTS.md"
FRAGMENT = "<!-- fragment -->"
CONTINUED = "<!-- continued -->"
BLOCK_TIMEOUT = 120

# page -> (the SHA-256 of its text when the entry was made, the branch that rewrites it, the
# rules it is excused from: "links", "length", "figures", "code")
PENDING: Dict[str, Tuple[str, str, Tuple[str, ...]]] = {}

_FENCE = re.compile(r"^\s*(```|~~~)(.*)$")
_LINK = re.compile(r"!?\[((?:[^\]\\]|\\.)*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_FIGURES = [
    ("a ratio", re.compile(r"(?<![\w.])\d+\.\d+\s?[x×](?![\w-])")),
    ("a fraction of a baseline",
     re.compile(r"(?<![\w.])[0-2]\.\d+\s+of\s+(one|a|the|plain|device|its|TF's)\b")),
    ("a rate", re.compile(
        r"\d\s*[kKMG]?\s*(samples|rows|keys|IDs|lookups|requests|records|lines)/s\b"
        r"|\d\s*[KMGT]i?B/s\b")),
    ("a size per ID or row", re.compile(
        r"\d\s*(bytes|[KMG]i?B)\s+(per|an?|each)\s+(admitted\s+)?(ID|row|million)", re.I)),
    ("a time per step", re.compile(
        r"\d\s*(ms|µs|us)\s*(per|an?|/)\s*(step|batch|call)\b")),
    ("a percentage faster or slower", re.compile(r"\d\s*%\s*(faster|slower)")),
]


# ---------------------------------------------------------------------------------------
# Reading the pages


def pages() -> List[pathlib.Path]:
    """README.md and every page under docs/."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def is_pending(path: pathlib.Path, rule: str) -> bool:
    entry = PENDING.get(rel(path))
    return entry is not None and rule in entry[2] and _digest(path) == entry[0]


def _digest(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Line(NamedTuple):
    number: int  # 1-based
    text: str
    in_code: bool  # inside a fenced block, or a fence itself


def lines_of(path: pathlib.Path) -> List[Line]:
    out, fence = [], None
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = _FENCE.match(text)
        if fence is None and match:
            fence = match.group(1)
            out.append(Line(number, text, True))
        elif fence is not None:
            out.append(Line(number, text, True))
            if text.strip().startswith(fence) and not text.strip()[len(fence):].strip():
                fence = None
        else:
            out.append(Line(number, text, False))
    return out


def _without_code_spans(text: str) -> str:
    return _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before the -1, -2 of repeats)."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set:
    seen: Dict[str, int] = {}
    out = set()
    for line in lines_of(path):
        match = None if line.in_code else _HEADING.match(line.text)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def links(path: pathlib.Path) -> List[Tuple[int, str]]:
    """(line, target) of every Markdown link outside code."""
    out = []
    for line in lines_of(path):
        if not line.in_code:
            out.extend((line.number, m.group(2))
                       for m in _LINK.finditer(_without_code_spans(line.text)))
    return out


def paragraphs(path: pathlib.Path) -> List[List[Line]]:
    """The page's prose in units: paragraphs, each list item and each table row apart."""
    units: List[List[Line]] = []
    current: List[Line] = []

    def close():
        if current:
            units.append(list(current))
            current.clear()

    for line in lines_of(path):
        stripped = line.text.strip()
        if line.in_code or not stripped or _HEADING.match(line.text):
            close()
            continue
        if stripped.startswith("|") or re.match(r"([-*+]|\d+[.)])\s", stripped):
            close()
        current.append(line)
        if stripped.startswith("|"):
            close()
    close()
    return units


# ---------------------------------------------------------------------------------------
# Links, length, figures


def _resolve(page: pathlib.Path, target: str) -> Optional[str]:
    """None when the link resolves, else what is wrong."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
        return None
    path_part, _, anchor = target.partition("#")
    file = page if not path_part else (page.parent / path_part).resolve()
    if not str(file).startswith(str(ROOT)):
        return f"{target}: outside the repository"
    if not file.exists():
        return f"{target}: no such file"
    if anchor:
        if file.suffix != ".md" or file.is_dir():
            return f"{target}: an anchor into a page that is not Markdown"
        if anchor not in anchors(file):
            return f"{target}: {rel(file)} has no heading with the anchor #{anchor}"
    return None


def _pages_for(rule_pages, rule: str):
    return [p for p in rule_pages if not is_pending(p, rule)]


def broken_links(page: pathlib.Path) -> List[str]:
    return [f"{rel(page)}:{number}: {problem}" for number, target in links(page)
            for problem in [_resolve(page, target)] if problem]


@pytest.mark.one_tf
def test_links_resolve():
    broken = [found for page in _pages_for(pages(), "links") for found in broken_links(page)]
    assert not broken, "\n".join(broken)


def guides() -> List[pathlib.Path]:
    return sorted((ROOT / "docs").glob("*.md"))


def too_long(page: pathlib.Path) -> Optional[str]:
    limit = LONGER_PAGES.get(rel(page), GUIDE_LINES)
    count = len(page.read_text(encoding="utf-8").splitlines())
    if count <= limit:
        return None
    return (f"{rel(page)}: {count} lines (at most {limit}: rationale goes to docs/design/, "
            f"dated experiments to docs/history/, figures to {RESULTS})")


@pytest.mark.one_tf
def test_guides_are_short():
    long = [found for page in _pages_for(guides(), "length") for found in [too_long(page)]
            if found]
    assert not long, "\n".join(long)


def figure_pages() -> List[pathlib.Path]:
    """The guides: README.md and docs/*.md (design/ and history/ pages may cite figures)."""
    return [ROOT / "README.md"] + guides()


def figures_without_link(page: pathlib.Path) -> List[str]:
    """"page:line: what" for each paragraph that states a measured figure and links no
    results."""
    found = []
    for unit in paragraphs(page):
        targets = [m.group(2) for line in unit for m in _LINK.finditer(line.text)]
        if any(_links_results(page, target) for target in targets):
            continue
        for line in unit:
            text = _without_code_spans(line.text)
            for what, pattern in _FIGURES:
                match = pattern.search(text)
                if match:
                    found.append(f"{rel(page)}:{line.number}: {what} ({match.group(0)!r}) "
                                 f"without a link to {RESULTS} in its paragraph")
                    break
    return found


def _links_results(page: pathlib.Path, target: str) -> bool:
    path_part = target.partition("#")[0]
    return bool(path_part) and (page.parent / path_part).resolve() == ROOT / RESULTS


@pytest.mark.one_tf
def test_figures_link_the_results():
    copied = []
    for page in _pages_for(figure_pages(), "figures"):
        copied.extend(figures_without_link(page))
    assert not copied, "\n".join(copied)


@pytest.mark.one_tf
def test_pending_entries_are_current():
    stale = [f"{page} (rewritten by {branch})" for page, (digest, branch, _) in PENDING.items()
             if not (ROOT / page).exists() or _digest(ROOT / page) != digest]
    assert not stale, ("these pages changed since PENDING named them; remove their entries "
                       f"from tests/test_docs.py: {stale}")


@pytest.mark.one_tf
@pytest.mark.parametrize("heading,slug", [
    # Anchors as GitHub renders them for these headings.
    ("Serving export (`mk.export_serving`)", "serving-export-mkexport_serving"),
    ("Names RecSDK's model examples use (DLRM, Wide&Deep)",
     "names-recsdks-model-examples-use-dlrm-widedeep"),
    ("2026-12-04: route and weights", "2026-12-04-route-and-weights"),
    ("What's new?  Two spaces", "whats-new--two-spaces"),
    ("A [linked](other.md) heading", "a-linked-heading"),
    ("Größe und Überblick", "größe-und-überblick"),
])
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def _write(root: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.one_tf
def test_the_rules_find_what_they_name(tmp_path, monkeypatch):
    """Each rule, on a small made-up repository, against the answers written out by hand."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    _write(tmp_path, RESULTS, "# Results\n")
    _write(tmp_path, "docs/B.md", "# B\n\n## Part\n\n## Part\n")
    page = _write(tmp_path, "docs/A.md", "\n".join([
        "# A",
        "[ok](B.md#part-1) [ok](#a) [web](https://example.com) `[not](a-link.md)`",
        "[gone](C.md) [no anchor](B.md#nothing) [up](../../x.md)",
        "",
        "Two ranks run at 0.82x one process.",  # copied: no link in the paragraph
        "",
        "- 350k samples/s in the last run",  # copied
        "- 1.5 x, see [results](../bench/RESULTS.md)",  # linked in its item
        "",
        "| a | 9.1 ms a step |",  # a table row is its own paragraph
        "| b | [results](../bench/RESULTS.md) |",
        "",
        "```python",
        "x = 0.5  # 0.82x in code is not prose",
        "```",
        "Padding costs at most 2x; TF 2.15.1; a growth factor of 1.5.",  # no figure
    ]) + "\n")
    assert broken_links(page) == [
        "docs/A.md:3: C.md: no such file",
        "docs/A.md:3: B.md#nothing: docs/B.md has no heading with the anchor #nothing",
        "docs/A.md:3: ../../x.md: outside the repository"]
    assert [found.split(" (")[0] for found in figures_without_link(page)] == [
        "docs/A.md:5: a ratio", "docs/A.md:7: a rate", "docs/A.md:10: a time per step"]
    assert too_long(page) is None
    long = _write(tmp_path, "docs/Long.md", "line\n" * (GUIDE_LINES + 1))
    assert too_long(long).startswith(f"docs/Long.md: {GUIDE_LINES + 1} lines")


@pytest.mark.one_tf
def test_blocks_group_by_their_markers(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    _write(tmp_path, "README.md", "# R\n")
    fence = "```"
    _write(tmp_path, "docs/A.md", "\n".join([
        "# A", f"{fence}python", "a = 1", fence,                        # 2: runs
        CONTINUED, f"{fence}python", "b = a", fence,                   # 6: joins 2
        FRAGMENT, f"{fence}python", "c = undefined", fence,            # 10: skipped
        CONTINUED, f"{fence}python", "d = b", fence,                   # 14: joins 2+6, not 10
        f"{fence}python", "x = 1", fence,                               # 17: runs
        FRAGMENT, f"{fence}python", "y = undefined", fence,            # 21: skipped
        CONTINUED, f"{fence}python", "z = x", fence,                   # 25: joins 17
        f"{fence}bash", "echo not python", fence,
        FRAGMENT, "", f"{fence}python", "e = 1", fence,                # 31: stray marker
    ]) + "\n")
    found = [(s.ident, s.source, s.problem) for s in scripts()]
    assert found == [
        ("docs/A.md:2+6+14", "a = 1\nb = a\nd = b\n", ""),
        ("docs/A.md:17+25", "x = 1\nz = x\n", ""),
        ("docs/A.md:33", "e = 1\n", ""),
        ("docs/A.md:31: <!-- fragment --> is not on the line just before a ```python fence",
         "", "stray marker"),
    ]


# ---------------------------------------------------------------------------------------
# The code-block runner


class Block(NamedTuple):
    page: str
    line: int  # the opening fence's line
    source: str
    marker: str  # "", "fragment" or "continued"


def python_blocks(path: pathlib.Path) -> List[Block]:
    """The page's ```python blocks with the marker on the line before each."""
    text_lines = path.read_text(encoding="utf-8").splitlines()
    blocks, body, start = [], None, 0
    for line in lines_of(path):
        if body is None and line.in_code and re.match(r"^\s*```\s*python\s*$", line.text):
            body, start = [], line.number
        elif body is not None and re.match(r"^\s*```\s*$", line.text):
            previous = text_lines[start - 2].strip() if start >= 2 else ""
            marker = {FRAGMENT: "fragment", CONTINUED: "continued"}.get(previous, "")
            blocks.append(Block(rel(path), start, "\n".join(body) + "\n", marker))
            body = None
        elif body is not None:
            body.append(line.text)
    return blocks


def stray_markers(path: pathlib.Path) -> List[str]:
    """Markers not on the line just before a ```python fence."""
    text_lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for index, text in enumerate(text_lines):
        if text.strip() in (FRAGMENT, CONTINUED):
            after = text_lines[index + 1] if index + 1 < len(text_lines) else ""
            if not re.match(r"^\s*```\s*python\s*$", after):
                out.append(f"{rel(path)}:{index + 1}: {text.strip()} is not on the line just "
                           "before a ```python fence")
    return out


def _readme_example() -> Optional[str]:
    """The block tests/test_readme.py runs and checks, when it has one."""
    path = ROOT / "tests" / "test_readme.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("_readme_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    example = getattr(module, "_example", None)
    try:
        return example() if example else None
    except (AttributeError, IndexError):  # README no longer has that section
        return None


class Script(NamedTuple):
    ident: str  # page:line of its blocks
    source: str
    problem: str  # what is wrong with its markers, or ""


def scripts() -> List[Script]:
    """Each script the runner runs: a block with the continued blocks after it."""
    readme_example = _readme_example()
    out: List[Script] = []
    for path in [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")):
        if is_pending(path, "code"):
            continue
        group: List[Block] = []
        skipped = "the page's first python block"  # what a continued block would continue
        for block in python_blocks(path):
            ident = f"{block.page}:{block.line}"
            if block.marker == "continued":
                if group:
                    group.append(block)
                else:
                    out.append(Script(ident, "", f"continued, but it continues {skipped}"))
                continue
            if block.marker == "fragment":
                if not group:  # nothing runnable before it for a continued block to join
                    skipped = f"a fragment ({ident})"
                continue
            if group:
                out.append(_script(group))
            group = []
            if block.source == readme_example:
                skipped = f"the example tests/test_readme.py runs ({ident})"
            else:
                group = [block]
        if group:
            out.append(_script(group))
        out.extend(Script(where, "", "stray marker") for where in stray_markers(path))
    return out


def _script(group: List[Block]) -> Script:
    ident = f"{group[0].page}:{group[0].line}"
    if len(group) > 1:
        ident += "+" + "+".join(str(b.line) for b in group[1:])
    return Script(ident, "".join(b.source for b in group), "")


_SCRIPTS = scripts()


@pytest.mark.parametrize("script", _SCRIPTS, ids=[s.ident for s in _SCRIPTS])
def test_code_block_runs(script, tmp_path):
    assert not script.problem, f"{script.ident}: {script.problem}"
    path = tmp_path / "block.py"
    path.write_text(script.source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    try:
        done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script.ident}: still running after {BLOCK_TIMEOUT} s")
    assert done.returncode == 0, (
        f"{script.ident} failed (exit status {done.returncode}); mark it with {FRAGMENT} on "
        f"the line before its fence if it is not meant to run alone:\n{done.stderr[-3000:]}")


# ---------------------------------------------------------------------------------------
# Command lines in shell blocks: they do not run here (set-ups, trainings, servers), but each
# `python -m mxrec.streaming|serving ...` a page shows must parse with the CLI's own parser,
# so a renamed or removed flag cannot stay in a guide. A line holding `...` is elided on
# purpose and not parsed.

_CLI = re.compile(r"(?:^|\s)python3? -m (mxrec\.(?:streaming|serving|launch))((?:\s+\S+)*)")


def shell_commands(path: pathlib.Path) -> List[Tuple[int, str, List[str]]]:
    """(line, module, argv) of each mxrec CLI call in the page's ```bash / ```sh blocks,
    continuation lines joined, comments and a trailing `&` dropped."""
    found, joined, start, shell = [], "", 0, False
    for line in lines_of(path):
        fence = _FENCE.match(line.text)
        if fence:
            shell = not shell and fence.group(2).strip() in ("bash", "sh", "shell", "console")
            continue
        if not shell:
            continue
        text = re.sub(r"\s#.*$", "", line.text).rstrip()
        if not joined:
            start = line.number
        joined += " " + text.rstrip("\\")
        if text.endswith("\\"):
            continue
        command, joined = joined.strip().rstrip("&").strip(), ""
        match = _CLI.search(command)
        if match and "..." not in command:
            found.append((start, match.group(1), match.group(2).split()))
    return found


def _parse(module: str, argv: List[str]) -> Optional[str]:
    """None when `argv` parses with `module`'s parser, else why not."""
    if module == "mxrec.launch":  # its own flags first; the module it runs parses the rest
        if "-m" not in argv:
            return None
        argv = argv[argv.index("-m") + 1:]
        module, argv = argv[0], argv[1:]
        if module not in ("mxrec.streaming", "mxrec.serving"):
            return None
    main = importlib.import_module(f"{module}.__main__")
    try:
        main.build_parser().parse_args(argv)
    except SystemExit as stop:
        return None if stop.code == 0 else f"exit status {stop.code}"
    return None


@pytest.mark.one_tf
def test_documented_command_lines_parse(capsys):
    bad = []
    for page in pages():
        for number, module, argv in shell_commands(page):
            problem = _parse(module, argv)
            if problem:
                err = capsys.readouterr().err.strip().splitlines()
                bad.append(f"{rel(page)}:{number}: python -m {module} {' '.join(argv)}: "
                           f"{problem}: {err[-1] if err else ''}")
    assert not bad, "documented command lines the CLI refuses:\n" + "\n".join(bad)


@pytest.mark.one_tf
def test_shell_commands_are_found_and_parsed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = _write(tmp_path, "docs/A.md", "\n".join([
        "# A", "```bash",
        "python -m mxrec.serving --export-base E --model-name m --port 1 &  # comment",
        "python -m mxrec.streaming train --data D --model-dir W \\",
        "    --no-such-flag 1",
        "python -m mxrec.streaming train --data D ...   # elided",
        "python -m mxrec.launch -n 2 -m mxrec.streaming train --data D --workdir W",
        "```", "```python", "python -m mxrec.serving --nothing", "```"]) + "\n")
    found = shell_commands(page)
    assert [(n, m) for n, m, _ in found] == [(3, "mxrec.serving"), (4, "mxrec.streaming"),
                                             (7, "mxrec.launch")]
    assert [_parse(m, argv) for _, m, argv in found] == [None, "exit status 2", None]
