"""What every benchmark shares for bench/run_all.py: `--quick`, `--json PATH` and the JSON.

The JSON a benchmark writes is one flat object: figure name -> number (or short text), plus
"goals": a list of {"goal": text, "value": number, "target": number, "met": bool}. A goal
whose figure must stay below its target says so in its text ("<= ..."); `met` is computed
here, so run_all.py never re-derives it.
"""

import json
import math
from pathlib import Path
from typing import Dict, List, Optional


def add_arguments(parser) -> None:
    """Adds --quick and --json to a benchmark's argparse parser."""
    parser.add_argument("--quick", action="store_true",
                        help="a short run (for bench/run_all.py --quick): fewer steps and "
                             "repeats, so the figures are noisier")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the figures and goals to PATH as one JSON object")


class Report:
    """Figures and goals of one benchmark run, written by `write` when --json was given."""

    def __init__(self):
        self.figures: Dict[str, object] = {}
        self.goals: List[dict] = []

    def figure(self, name: str, value) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        self.figures[name] = value

    def goal(self, text: str, value: float, target: float, lower_is_better: bool = False) -> bool:
        """Records a goal; returns whether it is met."""
        value = float(value)
        met = value <= target if lower_is_better else value >= target
        self.goals.append({"goal": text, "value": round(value, 4), "target": target,
                           "met": bool(met)})
        return met

    def write(self, path: Optional[str]) -> None:
        if not path:
            return
        Path(path).write_text(json.dumps(dict(self.figures, goals=self.goals), indent=1) + "\n")
