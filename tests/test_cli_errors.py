"""The command lines' errors and spellings: `python -m mxrec.streaming train` on data it
cannot train (an empty folder, flat files, partitions without their done marker), with
--watch on such a folder, `--format criteo` on a CSV with a header, `replay` against a
predictor that refuses, both spellings of every flag, no prefix matching."""

import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from mxrec.serving.__main__ import build_parser as serving_parser
from mxrec.streaming.__main__ import build_parser as streaming_parser

REPO = str(pathlib.Path(__file__).resolve().parent.parent)
# The shared data sets lie beside the checkout (../shared/data, as in CI), or beside the
# folder of worktrees.
SHARED_SAMPLE = next(
    (p for p in (pathlib.Path(REPO).parent / "shared", pathlib.Path(REPO).parent.parent / "shared",
                 pathlib.Path(REPO) / "shared") if (p / "data" / "criteo_sample.csv").is_file()),
    pathlib.Path(REPO).parent / "shared") / "data" / "criteo_sample.csv"
HEADER = ",".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])


def _criteo_csv(path: pathlib.Path, rows: int = 6) -> None:
    lines = [HEADER] + [",".join([str(r % 2)] + [str(r + i) for i in range(13)]
                                 + [f"{(r * 31 + i):08x}" for i in range(26)])
                        for r in range(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _streaming(*argv, timeout=180):
    return subprocess.run([sys.executable, "-m", "mxrec.streaming", *argv],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))


def _train(data, tmp_path, *extra):
    return _streaming("train", "--data", str(data), "--model-dir", str(tmp_path / "model"),
                      "--no-progress", "--no-tensorboard", *extra)


LAYOUT_WORDS = ("yyyyMMdd/", "yyyyMMdd/hh/", "'_SUCCESS'")


def test_train_on_an_empty_folder_says_what_it_expects(tmp_path):
    (tmp_path / "data").mkdir()
    result = _train(tmp_path / "data", tmp_path)
    assert result.returncode == 1, result.stderr
    assert "nothing to train: no ready partition" in result.stderr
    assert "it is empty" in result.stderr
    for word in LAYOUT_WORDS:
        assert word in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "model" / "donefile.jsonl").exists()


def test_train_on_flat_files_names_them(tmp_path):
    for name in ("part-0.csv", "part-1.csv"):
        _criteo_csv(tmp_path / "data" / name)
    result = _train(tmp_path / "data", tmp_path, "--format", "criteo_csv")
    assert result.returncode == 1, result.stderr
    assert "data files directly in" in result.stderr
    assert "part-0.csv, part-1.csv" in result.stderr
    for word in LAYOUT_WORDS:
        assert word in result.stderr


def test_train_on_partitions_without_their_marker_names_them(tmp_path):
    for partition in ("20240101/00", "20240101/01", "20240102"):
        _criteo_csv(tmp_path / "data" / partition / "part-0.csv")
    result = _train(tmp_path / "data", tmp_path, "--format", "criteo_csv")
    assert result.returncode == 1, result.stderr
    assert ("3 partition folder(s) without their done marker '_SUCCESS', not ready yet "
            "(20240101/00, 20240101/01, 20240102)") in result.stderr
    # Another marker name is named as such.
    result = _train(tmp_path / "data", tmp_path, "--format", "criteo_csv", "--done-marker",
                    "_READY")
    assert result.returncode == 1 and "'_READY'" in result.stderr


def test_train_warns_about_what_it_skips(tmp_path):
    """One ready partition trains; the stray file and the unready hour are named."""
    _criteo_csv(tmp_path / "data" / "20240101" / "00" / "part-0.csv")
    (tmp_path / "data" / "20240101" / "00" / "_SUCCESS").write_text("")
    _criteo_csv(tmp_path / "data" / "20240101" / "01" / "part-0.csv")
    _criteo_csv(tmp_path / "data" / "stray.csv")
    result = _train(tmp_path / "data", tmp_path, "--format", "criteo_csv", "--batch-size", "4",
                    "--vocabulary", "1000", "--hidden", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning" in result.stderr and "stray.csv" in result.stderr
    assert "(20240101/01)" in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["partitions"] == 1


def test_watch_on_an_empty_folder_says_it_waits_and_for_what(tmp_path):
    (tmp_path / "data").mkdir()
    result = _train(tmp_path / "data", tmp_path, "--watch", "--poll-interval", "0.2",
                    "--deadline", "1", "--vocabulary", "1000", "--hidden", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stderr.splitlines() if "warning" in line)
    assert "no ready partition" in line and "waiting for" in line and "every 0.2 s" in line
    for word in LAYOUT_WORDS:
        assert word in line


@pytest.mark.parametrize("sample", ["written", "shared"])
def test_format_criteo_on_a_csv_with_a_header_names_criteo_csv(tmp_path, sample):
    csv = tmp_path / "data" / "20240101" / "part-0.csv"
    if sample == "shared":
        if not SHARED_SAMPLE.is_file():
            pytest.skip(f"no shared sample at {SHARED_SAMPLE}")
        csv.parent.mkdir(parents=True)
        csv.write_bytes(SHARED_SAMPLE.read_bytes())
    else:
        _criteo_csv(csv)
    (csv.parent / "_SUCCESS").write_text("")
    result = _train(tmp_path / "data", tmp_path)  # --format criteo is the default
    assert result.returncode == 2, result.stderr[-3000:]
    assert "use --format criteo_csv" in result.stderr
    assert "with a header line" in result.stderr and "Traceback" not in result.stderr
    result = _streaming("replay", "--data", str(csv.parent), "--url", "http://127.0.0.1:9")
    assert result.returncode == 2 and "use --format criteo_csv" in result.stderr


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"error": "input 'sparse' has 26 columns; the model takes 3"})
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_replay_prints_the_predictors_refusal(tmp_path):
    csv = tmp_path / "part" / "part-0.csv"
    _criteo_csv(csv)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/models/ctr"
        result = _streaming("replay", "--data", str(csv.parent), "--url", url, "--format",
                            "criteo_csv", "--batch-size", "4")
    finally:
        server.shutdown()
    assert result.returncode == 1, result.stderr[-3000:]
    assert (f"replay: {url}:predict refused the request (HTTP 400): input 'sparse' has 26 "
            "columns; the model takes 3") in result.stderr


def _subcommand(name):
    return streaming_parser()._subparsers._group_actions[0].choices[name]


@pytest.mark.parametrize("command", ["train", "replay"])
def test_every_flag_takes_both_spellings(command):
    for action in _subcommand(command)._actions:
        names = [n for n in action.option_strings if n.startswith("--") and n != "--help"]
        for name in names:
            if "-" in name[2:] or "_" in name[2:]:
                assert "--" + name[2:].replace("-", "_") in names, names
                assert "--" + name[2:].replace("_", "-") in names, names


def test_model_dir_and_export_base_spellings():
    parser = streaming_parser()
    for model_flag in ("--model-dir", "--model_dir", "--workdir"):
        for export_flag in ("--export-base", "--export_base"):
            args = parser.parse_args(["train", "--data", "d", model_flag, "m", export_flag, "e",
                                      "--max-bad-lines", "3", "--batch_size", "7"])
            assert (args.workdir, args.export_base) == ("m", "e")
            assert (args.max_bad_lines, args.batch_size) == (3, 7)
    args = serving_parser().parse_args(["--export_base", "e", "--model-name", "n"])
    assert (args.export_base, args.model_name) == ("e", "n")


@pytest.mark.parametrize("argv, message", [
    (["train", "--data", "d", "--model-dir", "m", "--max-part", "3"],
     "unrecognized arguments: --max-part 3"),
    (["train", "--data", "d", "--model", "dlrm", "--model-d", "m"],
     "the following arguments are required: --model-dir"),
    (["replay", "--data", "d", "--url", "u", "--max_req", "2"],
     "unrecognized arguments: --max_req 2")])
def test_no_prefix_matching(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        streaming_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_serving_takes_no_prefix(capsys):
    with pytest.raises(SystemExit):
        serving_parser().parse_args(["--export-base", "e", "--model-name", "n",
                                     "--max-sec", "3"])
    assert "unrecognized arguments: --max-sec 3" in capsys.readouterr().err


def _ready(root: pathlib.Path, partition: str) -> None:
    _criteo_csv(root / partition / "part-0.csv")
    (root / partition / "_SUCCESS").write_text("")


def test_daily_and_hourly_pick_partitions(tmp_path):
    from mxrec.streaming import donefile

    _ready(tmp_path / "data", "20240101/00")
    _ready(tmp_path / "data", "20240102")
    small = ("--format", "criteo_csv", "--batch-size", "4", "--vocabulary", "1000", "--hidden",
             "4")
    result = _train(tmp_path / "data", tmp_path, "--daily", *small)
    assert result.returncode == 0, result.stderr[-3000:]
    entries = donefile.read(str(tmp_path / "model" / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == ["20240102"]
    only_daily = tmp_path / "daily"
    _ready(only_daily, "20240103")
    result = _train(only_daily, tmp_path / "other", "--hourly", *small)
    assert result.returncode == 1
    assert "1 ready partition(s) not hourly (20240103) skipped by --hourly" in result.stderr
    result = _train(only_daily, tmp_path / "other", "--hourly", "--daily")
    assert result.returncode == 2 and "not allowed with argument" in result.stderr


def test_stream_config_refuses_another_granularity():
    from mxrec.streaming import parsers
    from mxrec.streaming.trainer import StreamConfig

    with pytest.raises(ValueError, match="granularity must be None, 'daily' or 'hourly'"):
        StreamConfig(data="d", schema=parsers.named_schema("criteo"), workdir="w",
                     granularity="weekly")
