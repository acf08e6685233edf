"""Runs every benchmark in bench/ and writes bench/RESULTS.md: machine, TensorFlow, date, and
each goal with its target, measured value and whether it is met.

Every `bench/bench_*.py` is run in a process of its own with `--json PATH` (and `--quick`
with --quick); see bench/report.py for the JSON each writes. A benchmark that fails or
writes no JSON gets a row saying so, with the end of its output. The benchmarks' own
printed tables follow the goals, one section each.

A benchmark may also run in further ways, each under a name of its own (RUNS: the
several-hosts comparison is `bench_multiworker.py --hosts 2`, as `bench_multiworker_hosts`).
With --merge, only the benchmarks --only names run, and the page keeps every other
benchmark's rows and output from the page at --out as they are, adding a line to the header
that says what ran when and where.

    PYTHONPATH=. .venv/bin/python bench/run_all.py --quick     # a few minutes on 2 cores
    PYTHONPATH=. .venv/bin/python bench/run_all.py             # the full figures
    PYTHONPATH=.:/tmp/tfra .venv/bin/python bench/run_all.py   # with the TFRA column
    sudo PYTHONPATH=. .venv/bin/python bench/run_all.py --only bench_multiworker_hosts --merge
"""

import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.machine import describe  # noqa: E402

# Further runs of a benchmark script: name -> (script, its arguments). Each is a benchmark of
# its own on the page, after its script's. The several-hosts comparison needs root and
# network namespaces; elsewhere it says why it did not run, as its one figure.
RUNS: Dict[str, Tuple[str, List[str]]] = {
    "bench_multiworker_hosts": ("bench_multiworker", ["--hosts", "2"]),
    # One table of 1e7 IDs (its SSD file fits this machine's page cache: CPU-bound).
    "bench_scale_1e7": ("bench_scale", ["--ids", "1e7"]),
    # Steps that wait on the disk: 3e6 IDs, 2.6e6 of them on the SSD tier, in a memory
    # cgroup of 1400 MiB that leaves the 1.4 GB file about half of the page cache it
    # would take (needs root and cgroup v1; elsewhere it ends with an error saying so).
    "bench_scale_disk": ("bench_scale", ["--ids", "3e6", "--device_rows", "200000",
                                         "--host_rows", "200000", "--engine_ids", "0",
                                         "--memory_limit", "1400M", "--no_checkpoint"]),
    # The predictor (and the floor) with each run in the request's thread, as a
    # latency-bound deployment runs it (docs/SERVING_GRPC.md, "Latency").
    "bench_serving_caller_thread": ("bench_serving", ["--tensorflow-threads", "1,-1"]),
}


def discover() -> list:
    """The benchmarks, by name: every bench/bench_*.py, each followed by its RUNS."""
    scripts = sorted(os.path.basename(p)[:-3]
                     for p in glob.glob(os.path.join(ROOT, "bench", "bench_*.py")))
    return [name for script in scripts
            for name in [script] + sorted(n for n, (s, _) in RUNS.items() if s == script)]


def run_one(name: str, quick: bool, timeout: int, extra: list) -> dict:
    """Runs benchmark `name` (bench/<name>.py, or its RUNS entry); returns its JSON (or
    None), exit status, seconds and output."""
    script, arguments = RUNS.get(name, (name, []))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "figures.json")
        command = [sys.executable, os.path.join(ROOT, "bench", f"{script}.py"), *arguments,
                   "--json", path]
        command += (["--quick"] if quick else []) + extra
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                              if p))
        started = time.perf_counter()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout)
            status, stdout, stderr = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as expired:
            status = "timeout"
            stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (
                expired.stdout or "")
            stderr = f"killed after {timeout} s (--timeout)"
        seconds = time.perf_counter() - started
        figures = None
        if os.path.exists(path):
            with open(path) as f:
                figures = json.load(f)
    return {"name": name, "figures": figures, "status": status, "seconds": seconds,
            "stdout": stdout, "stderr": stderr}


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


class Section:
    """One benchmark's lines on the page: its goal rows, its figure rows, its output (its
    heading, the fenced output, no blank line after)."""

    def __init__(self, goals: List[str], figures: List[str], output: List[str]):
        self.goals, self.figures, self.output = goals, figures, output


def section_of(result: dict) -> Section:
    """The page's lines for one benchmark's run (run_one's result)."""
    name, figures = result["name"], result["figures"]
    goals = []
    if figures is None:
        goals.append(f"| {name} | (no figures: exit status {result['status']}) | | | not run |")
    for goal in (figures or {}).get("goals", []):
        lower = "(<=)" in goal["goal"]
        target = f"{'<=' if lower else '>='} {goal['target']}"
        goals.append(f"| {name} | {goal['goal']} | {target} | {_value(goal['value'])} | "
                     f"{'met' if goal['met'] else 'NOT met'} |")
    rows = [f"| {name} | {figure} | {_value(value)} |"
            for figure, value in (figures or {}).items() if figure != "goals"]
    body = result["stdout"].strip()
    if figures is None or result["status"] not in (0, 1):
        body += "\n\nstderr (end):\n" + "\n".join(result["stderr"].strip().splitlines()[-15:])
    output = [f"### {name} ({result['seconds']:.0f} s, exit status {result['status']})", "",
              "```", *body.split("\n"), "```"]
    return Section(goals, rows, output)


def _mode(quick: bool) -> str:
    return "quick (`--quick`: short runs, noisier figures)" if quick else "full"


def _load() -> str:
    return (f"1-minute load average at the end {os.getloadavg()[0]:.1f} (more than the core "
            "count means other work shared the CPUs)")


def header(quick: bool, tf_version: str, started: str, argv: list) -> List[str]:
    """The lines above the goals: how the page was made, when, where."""
    return [
        "# Benchmark results",
        "",
        f"Generated by `{' '.join(['python bench/run_all.py'] + list(argv))}` (do not edit; "
        "re-run it).",
        "",
        f"- date: {started} UTC",
        f"- machine: {describe()}; {_load()}",
        f"- TensorFlow {tf_version}, Python {sys.version.split()[0]}",
        f"- mode: {_mode(quick)}",
    ]


def assemble(head: List[str], sections: Dict[str, Section], order: List[str]) -> str:
    """The page: `head`, then the goals, figures and outputs of `order`'s benchmarks."""
    lines = head + ["", "## Goals", "", "| benchmark | goal | target | measured | met |",
                    "|---|---|---:|---:|---|"]
    for name in order:
        lines += sections[name].goals
    lines += ["", "## Figures", "", "| benchmark | figure | value |", "|---|---|---:|"]
    for name in order:
        lines += sections[name].figures
    lines += ["", "## Each benchmark's output", ""]
    for name in order:
        lines += sections[name].output + [""]
    return "\n".join(lines)


def render(results: list, quick: bool, tf_version: str, started: str, argv: list) -> str:
    """The page of one run of every benchmark in `results`."""
    return assemble(header(quick, tf_version, started, argv),
                    {r["name"]: section_of(r) for r in results}, [r["name"] for r in results])


_OUTPUT_HEADING = re.compile(r"^### (\S+) \(\d+ s, exit status [^)]*\)$")
_RERUN = re.compile(r"^- re-run at (.+? UTC): ([\w, ]+) (\(.*\))$")


def _table_rows(lines: List[str], title: str) -> Dict[str, List[str]]:
    """The rows of the table under heading `title`, by benchmark (the first cell)."""
    rows: Dict[str, List[str]] = {}
    start = lines.index(title) + 4  # the heading, a blank line, the table's two head rows
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        rows.setdefault(line.split(" | ")[0][2:], []).append(line)
    return rows


def parse(text: str) -> Tuple[List[str], Dict[str, Section], List[str]]:
    """A page `render` or `merge` wrote: (its head, each benchmark's section, their order)."""
    lines = text.split("\n")
    for title in ("## Goals", "## Figures", "## Each benchmark's output"):
        if title not in lines:
            raise ValueError(f"bench/run_all.py --merge: the page has no {title!r} heading; "
                             "was it written by run_all.py?")
    head = lines[:lines.index("## Goals")]
    while head and not head[-1].strip():
        head.pop()
    goals, figures = _table_rows(lines, "## Goals"), _table_rows(lines, "## Figures")
    outputs: Dict[str, List[str]] = {}
    name = None
    for line in lines[lines.index("## Each benchmark's output") + 1:]:
        match = _OUTPUT_HEADING.match(line)
        if match:
            name = match.group(1)
            outputs[name] = []
        if name is not None:
            outputs[name].append(line)
    for output in outputs.values():
        while output and not output[-1].strip():
            output.pop()
    return head, {n: Section(goals.get(n, []), figures.get(n, []), outputs[n])
                  for n in outputs}, list(outputs)


def merge(text: str, results: list, quick: bool, tf_version: str, started: str, argv: list,
          order: Optional[List[str]] = None) -> str:
    """The page `text` with the benchmarks of `results` replaced (or added) and every other
    benchmark kept as it was; the head gains a line saying what ran, when and where, and
    earlier such lines stop naming what ran again. Benchmarks that `order` (default: the
    benchmarks there are now) does not name are left out."""
    head, sections, kept_order = parse(text)
    fresh = [r["name"] for r in results]
    sections.update({r["name"]: section_of(r) for r in results})
    order = discover() if order is None else order
    names = [n for n in order if n in sections]
    lines = []
    for line in head:
        match = _RERUN.match(line)
        if match:
            left = [n for n in match.group(2).split(", ") if n not in fresh]
            if not left:
                continue
            line = f"- re-run at {match.group(1)}: {', '.join(left)} {match.group(3)}"
        lines.append(line)
    lines.append(f"- re-run at {started} UTC: {', '.join(fresh)} (`"
                 f"{' '.join(['python bench/run_all.py'] + list(argv))}`; {_mode(quick)}; "
                 f"machine: {describe()}; {_load()}; TensorFlow {tf_version})")
    return assemble(lines, sections, names)


def _page_to_merge(parser, args) -> str:
    """The page at --out that --merge adds to (checked before any benchmark runs)."""
    if not args.only:
        parser.error("--merge needs --only: the benchmarks to run again")
    if not os.path.isfile(args.out):
        parser.error(f"--merge: no page to merge into at --out {args.out}")
    with open(args.out) as f:
        text = f.read()
    try:
        parse(text)
    except ValueError as error:
        parser.error(str(error))
    return text


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="pass --quick to every benchmark (a few minutes in all)")
    parser.add_argument("--only", default="",
                        help="comma-separated benchmark names (bench_tiers,...); default all")
    parser.add_argument("--skip", default="", help="comma-separated benchmark names to skip")
    parser.add_argument("--timeout", type=int, default=3600,
                        help="seconds one benchmark may run (3600)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "RESULTS.md"))
    parser.add_argument("--merge", action="store_true",
                        help="run only --only's benchmarks and keep every other one's rows "
                             "and output from the page at --out")
    args = parser.parse_args(argv)
    names = discover()
    only = [n for n in args.only.split(",") if n]
    skip = [n for n in args.skip.split(",") if n]
    unknown = sorted(set(only + skip) - set(names))
    if unknown:
        parser.error(f"unknown benchmarks {unknown}; there are {names}")
    names = [n for n in names if (not only or n in only) and n not in skip]
    page = _page_to_merge(parser, args) if args.merge else None
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    tf_version = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    ).stdout.strip() or "unknown"
    results = []
    for name in names:
        print(f"{name} ...", flush=True)
        result = run_one(name, args.quick, args.timeout, [])
        print(f"{name}: exit status {result['status']}, {result['seconds']:.0f} s", flush=True)
        results.append(result)
    if page is None:
        text = render(results, args.quick, tf_version, started, argv)
    else:
        text = merge(page, results, args.quick, tf_version, started, argv)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["figures"] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
