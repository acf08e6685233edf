"""bench/report.py and bench/run_all.py: the JSON every benchmark writes and the RESULTS.md
table made from it (goals met or not, failed benchmarks named), without running a benchmark."""

import json

from bench import report, run_all


def test_report_goals_and_json(tmp_path):
    out = report.Report()
    out.figure("samples/s", 1234)
    out.figure("broken", float("nan"))
    assert out.goal("ratio (>=)", 0.95, 0.9) is True
    assert out.goal("ratio", 0.85, 0.9) is False
    assert out.goal("growth (<=)", 1.2, 1.1, lower_is_better=True) is False
    assert out.goal("growth (<=)", 1.0, 1.1, lower_is_better=True) is True
    path = tmp_path / "figures.json"
    out.write(str(path))
    written = json.loads(path.read_text())
    assert written["samples/s"] == 1234 and written["broken"] is None
    assert [g["met"] for g in written["goals"]] == [True, False, False, True]
    assert written["goals"][1] == {"goal": "ratio", "value": 0.85, "target": 0.9, "met": False}
    out.write(None)  # no --json: nothing written, no error


def test_render_marks_goals_and_failures():
    results = [
        {"name": "bench_a", "status": 0, "seconds": 3.0, "stdout": "| table |", "stderr": "",
         "figures": {"rate": 10.5, "goals": [
             {"goal": "x plain", "value": 1.1, "target": 1.0, "met": True},
             {"goal": "growth (<=)", "value": 1.3, "target": 1.1, "met": False}]}},
        {"name": "bench_b", "status": 2, "seconds": 0.0, "stdout": "",
         "stderr": "error: unrecognized arguments: --json", "figures": None},
    ]
    text = run_all.render(results, quick=True, tf_version="2.15.1", started="2026-01-01 00:00",
                          argv=["--quick"])
    assert "TensorFlow 2.15.1" in text and "mode: quick" in text
    assert "| bench_a | x plain | >= 1.0 | 1.100 | met |" in text
    assert "| bench_a | growth (<=) | <= 1.1 | 1.300 | NOT met |" in text
    assert "| bench_b | (no figures: exit status 2) | | | not run |" in text
    assert "| bench_a | rate | 10.500 |" in text
    assert "unrecognized arguments: --json" in text  # the failed benchmark's stderr


def test_discover_lists_every_benchmark():
    names = run_all.discover()
    for name in ("bench_train", "bench_tiers", "bench_soak", "bench_streaming",
                 "bench_multiworker", "bench_key_stage"):
        assert name in names


def _result(name, value, output):
    return {"name": name, "status": 0, "seconds": 1.0, "stdout": output, "stderr": "",
            "figures": {"rate": value, "goals": [
                {"goal": "rate", "value": value, "target": 1.0, "met": value >= 1.0}]}}


def test_merge_replaces_only_the_rerun_benchmarks_rows_and_output():
    page = run_all.render([_result("bench_a", 2.0, "a's table\n### not a section"),
                           _result("bench_c", 3.0, "c's table")], quick=False,
                          tf_version="2.15.1", started="2026-01-01 00:00", argv=[])
    rerun = run_all.render([_result("bench_a", 0.5, "a's new table"),
                            _result("bench_b", 4.0, "b's table")], quick=True,
                           tf_version="2.15.1", started="2026-02-02 00:00", argv=["--quick"])
    merged = run_all.merge(page, rerun, ["bench_a", "bench_b"],
                           "merged: bench_a, bench_b re-run on 2026-02-02")
    assert "- date: 2026-01-01 00:00 UTC" in merged and "mode: full" in merged
    assert "- merged: bench_a, bench_b re-run on 2026-02-02" in merged
    goals = [line for line in merged.splitlines()
             if line.endswith(("| met |", "NOT met |")) and not line.startswith("| benchmark")]
    assert goals == ["| bench_a | rate | >= 1.0 | 0.500 | NOT met |",
                     "| bench_b | rate | >= 1.0 | 4.000 | met |",
                     "| bench_c | rate | >= 1.0 | 3.000 | met |"]
    assert "| bench_a | rate | 2.000 |" not in merged and "| bench_c | rate | 3.000 |" in merged
    assert "a's new table" in merged and "a's table" not in merged
    assert "not a section" not in merged  # a '###' line inside the output went with it
    assert "c's table" in merged and "b's table" in merged
    # Merging again drops the note that the new merge covers, and changes nothing else.
    again = run_all.merge(merged, rerun, ["bench_a", "bench_b"],
                          "merged: bench_a, bench_b re-run on 2026-02-02")
    assert again == merged
