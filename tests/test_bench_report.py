"""bench/report.py and bench/run_all.py: the JSON every benchmark writes and the RESULTS.md
table made from it (goals met or not, failed benchmarks named), without running a benchmark."""

import json

import pytest

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


def _result(name, rate, met=True, stdout="| table |"):
    return {"name": name, "status": 0, "seconds": 2.0, "stdout": stdout, "stderr": "",
            "figures": {"rate": rate, "goals": [
                {"goal": "x plain", "value": rate, "target": 1.0, "met": met}]}}


def test_discover_puts_each_further_run_after_its_script():
    names = run_all.discover()
    assert names.index("bench_multiworker_hosts") == names.index("bench_multiworker") + 1
    assert run_all.RUNS["bench_multiworker_hosts"] == ("bench_multiworker", ["--hosts", "2"])


def test_a_page_parses_back_to_itself():
    results = [_result("bench_a", 1.5, stdout="### a heading of its own\n| x |"),
               _result("bench_b", 0.5, met=False)]
    text = run_all.render(results, quick=False, tf_version="2.15.1",
                          started="2026-01-01 00:00", argv=[])
    head, sections, order = run_all.parse(text)
    assert order == ["bench_a", "bench_b"]
    assert sections["bench_b"].goals == ["| bench_b | x plain | >= 1.0 | 0.500 | NOT met |"]
    assert sections["bench_a"].figures == ["| bench_a | rate | 1.500 |"]
    assert run_all.assemble(head, sections, order) == text


def test_merge_replaces_what_ran_and_keeps_the_rest():
    old = run_all.render([_result("bench_a", 1.5), _result("bench_b", 0.5, stdout="old b"),
                          _result("bench_c", 2.5)],
                         quick=False, tf_version="2.15.1", started="2026-01-01 00:00", argv=[])
    once = run_all.merge(old, [_result("bench_b", 0.75, stdout="new b"),
                               _result("bench_d", 3.0)],
                         quick=True, tf_version="2.21.0", started="2026-01-02 00:00",
                         argv=["--only", "bench_b,bench_d", "--merge"],
                         order=["bench_a", "bench_b", "bench_c", "bench_d"])
    assert "- date: 2026-01-01 00:00 UTC" in once
    assert "- re-run at 2026-01-02 00:00 UTC: bench_b, bench_d (`python bench/run_all.py " \
           "--only bench_b,bench_d --merge`; quick" in once
    assert "TensorFlow 2.21.0)" in once
    assert "| bench_b | rate | 0.750 |" in once and "0.500" not in once
    assert "new b" in once and "old b" not in once
    for kept in ("| bench_a | rate | 1.500 |", "| bench_c | x plain | >= 1.0 | 2.500 | met |"):
        assert kept in once
    _, _, order = run_all.parse(once)
    assert order == ["bench_a", "bench_b", "bench_c", "bench_d"]
    # A later re-run of bench_b: the earlier line names only bench_d; a benchmark gone from
    # the order (bench_c) leaves the page.
    twice = run_all.merge(once, [_result("bench_b", 0.8)], quick=False, tf_version="2.15.1",
                          started="2026-01-03 00:00", argv=[],
                          order=["bench_a", "bench_b", "bench_d"])
    assert "- re-run at 2026-01-02 00:00 UTC: bench_d (`" in twice
    assert "- re-run at 2026-01-03 00:00 UTC: bench_b (`" in twice
    assert "bench_c" not in twice
    assert run_all.parse(twice)[2] == ["bench_a", "bench_b", "bench_d"]


def test_merge_refuses_a_page_it_did_not_write(tmp_path, capsys):
    with pytest.raises(ValueError, match="no '## Goals' heading"):
        run_all.parse("# Some notes\n\n| a | b |\n")
    page = tmp_path / "R.md"
    page.write_text("# Some notes\n")
    for argv, said in ((["--merge", "--out", str(page)], "--merge needs --only"),
                       (["--merge", "--only", "bench_gather", "--out", str(tmp_path / "none")],
                        "no page to merge into"),
                       (["--merge", "--only", "bench_gather", "--out", str(page)],
                        "no '## Goals' heading")):
        with pytest.raises(SystemExit):
            run_all.main(argv)
        assert said in capsys.readouterr().err


def test_several_hosts_where_hosts_cannot_be_simulated(tmp_path, monkeypatch, capsys):
    """bench_multiworker --hosts says why it did not run, as its one figure, and exits 0;
    fewer than 2 hosts is refused."""
    from bench import bench_multiworker, simulated_hosts

    monkeypatch.setattr(simulated_hosts, "unavailable", lambda: "simulated hosts need root")
    path = tmp_path / "figures.json"
    assert bench_multiworker.main(["--hosts", "2", "--json", str(path)]) == 0
    assert json.loads(path.read_text()) == {"2 hosts: not run": "simulated hosts need root",
                                            "goals": []}
    assert "--hosts 2: not run: simulated hosts need root" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_multiworker.main(["--hosts", "1"])
    assert "--hosts must be at least 2, got 1" in capsys.readouterr().err
