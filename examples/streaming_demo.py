"""The streaming loop on MovieLens-100k: daily partitions in, versions out, a predictor serving.

    bash scripts/demo.sh --streaming [--days 30] [--workdir DIR] [--delta_export delta_only]

1. MovieLens-100k from the recbole 1.2.1 wheel (pip download, no install), written as daily
   partitions ROOT/yyyyMMdd/ with _SUCCESS (scripts/movielens_partitions.py), outside the
   repository (its licence forbids redistribution).
2. A predictor (`python -m mxrec.serving`) on 127.0.0.1 following the export base.
3. The streaming trainer (`python -m mxrec.streaming train`) over the first --days days:
   progressive validation, admission and eviction, a checkpoint and a serving version per
   day; the predictor picks each version up while training goes on.
4. `python -m mxrec.streaming replay` sends the next day (not trained on) to the predictor
   and prints its AUC.
5. One raw-feature request (the held-out day's first rating, its columns as strings, signature
   "raw") and the curl line that sends it (docs/SERVING.md).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import movielens_partitions  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_request(url: str, partition: str) -> None:
    """Scores the partition's first row through the "raw" signature; prints the curl line."""
    columns = [item.split(":") for item in movielens_partitions.SCHEMA.split(",")]
    with open(os.path.join(partition, "part-00000")) as f:
        fields = f.readline().rstrip("\n").split("\t")
    instance = {name: value if kind == "categorical" else float(value or 0)
                for (name, kind), value in zip(columns, fields)
                if kind in ("categorical", "dense")}
    body = json.dumps({"signature_name": "raw", "instances": [instance]})
    request = urllib.request.Request(url + ":predict", data=body.encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = response.read().decode()
    print(f"raw-feature request: curl -s {url}:predict -d '{body}'\n  -> {answer}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=30, help="days to train on (30)")
    parser.add_argument("--workdir", default=None,
                        help="where data, checkpoints and versions go (default: a new temp "
                             "folder)")
    parser.add_argument("--source", default=None,
                        help="a folder with ml-100k.inter/.user/.item instead of downloading")
    parser.add_argument("--delta_export", choices=("savedmodel", "delta_only"),
                        default="savedmodel", help="serving versions of delta days")
    parser.add_argument("--access_threshold", type=int, default=2, help="admission (2)")
    parser.add_argument("--eviction_threshold", type=int, default=30 * 86400,
                        help="eviction after this many seconds unseen (30 days)")
    args = parser.parse_args(argv)
    if args.days < 1:
        parser.error("--days must be >= 1")
    work = args.workdir or tempfile.mkdtemp(prefix="mxrec_streaming_demo_")
    data, export = os.path.join(work, "data"), os.path.join(work, "export")
    source = args.source or movielens_partitions.download(os.path.join(work, "download"))
    if os.path.isdir(data):
        shutil.rmtree(data)
    summary = movielens_partitions.write_partitions(source, data, args.days + 1)
    days = sorted(os.listdir(data))
    # The last day is held back: the replay scores it after training.
    held_out = os.path.join(work, "held_out", days[-1])
    os.makedirs(os.path.dirname(held_out), exist_ok=True)
    if os.path.isdir(held_out):
        shutil.rmtree(held_out)
    os.rename(os.path.join(data, days[-1]), held_out)
    print(f"MovieLens-100k: {summary['rows']:,} ratings in {summary['days']} daily partitions "
          f"under {data} (held out: {days[-1]})", flush=True)
    os.makedirs(export, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1/models/movielens"
    server = subprocess.Popen(
        [sys.executable, "-m", "mxrec.serving", "--export-base", export, "--model-name",
         "movielens", "--port", str(port), "--poll-interval", "0.5", "--max-seconds", "3600"],
        env=env)
    try:
        train = [sys.executable, "-m", "mxrec.streaming", "train", "--data", data, "--workdir",
                 os.path.join(work, "train"), "--export_base", export, "--schema",
                 movielens_partitions.SCHEMA, "--batch_size", "256", "--model", "wide_deep",
                 "--hidden", "32,16", "--vocabulary", "20000", "--access_threshold",
                 str(args.access_threshold), "--eviction_threshold",
                 str(args.eviction_threshold), "--evict_daily", "--full_every", "7",
                 "--delta_export", args.delta_export, "--sparse_lr", "0.3", "--dense_lr", "0.02",
                 "--report", os.path.join(work, "report.png")]
        if subprocess.run(train, env=env).returncode != 0:
            print("streaming demo: training failed", file=sys.stderr)
            return 1
        served = None
        for _ in range(120):  # bounded wait for the last version
            try:
                status = json.loads(urllib.request.urlopen(url, timeout=5).read())
                served = status["model_version_status"][0]["version"]
                if served == str(args.days):
                    break
            except (OSError, KeyError, IndexError, ValueError):
                pass
            time.sleep(0.5)
        print(f"predictor at {url} serves version {served}", flush=True)
        replay = subprocess.run(
            [sys.executable, "-m", "mxrec.streaming", "replay", "--data", held_out, "--url",
             url, "--schema", movielens_partitions.SCHEMA, "--batch_size", "256"], env=env,
            capture_output=True, text=True)
        print(f"replay of the held-out day {days[-1]}: {replay.stdout.strip()}"
              + (f" {replay.stderr.strip()[-500:]}" if replay.returncode else ""))
        raw_request(url, held_out)
        print(f"work folder: {work} (donefile: train/donefile.jsonl, report.png, "
              f"TensorBoard: train/tensorboard)")
        return replay.returncode
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
