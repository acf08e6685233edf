"""The streaming trainer on 2 ranks in watch mode and with malformed lines: the rank that
parses a bad line names it (file and line number, as one process does) and the run stops
before the partition's donefile line; allowed, the partition's count is the sum over the
ranks; a partition that becomes ready while the ranks wait is trained by both (rank 0 decides
and the other follows), and the run ends by itself at its deadline. The rank's uncaught error
ends the whole job at once (mxrec._lib.loader.abort_job_on_uncaught_exception), not after the
other rank's exchange times out."""

import os
import subprocess
import time

from test_streaming_ranks_equal import command
from test_streaming_trainer import PARTITIONS, write_stream

from mxrec.streaming import donefile


def _run(data, work, export, extra):
    argv, env = command(2, data, work, export, extra)
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_bad_lines_and_a_partition_that_lands_while_watching(tmp_path):
    data, work, export = tmp_path / "data", tmp_path / "w", tmp_path / "e"
    write_stream(str(data), PARTITIONS[:2], rows=60, bad=("20240101/01",))
    start = time.monotonic()
    proc = _run(data, work, export, ["--max_bad_lines", "0"])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    # The failing rank ends the job (MPI_Abort from its uncaught exception) instead of
    # waiting in MPI_Finalize until the other rank's exchange times out (120 s here).
    assert time.monotonic() - start < 90, (out + err)[-3000:]
    # Line 6 of the file lies in rank 0's slice of the first batch.
    assert "20240101/01/part-00000:6: column d0 is not a valid dense value" in out + err
    assert len(donefile.read(str(work / "donefile.jsonl"))) == 1

    proc = _run(data, work, export, ["--max_bad_lines", "1", "--watch", "--poll_interval",
                                     "0.5", "--deadline", "40"])
    deadline = time.time() + 240
    while time.time() < deadline and len(donefile.read(str(work / "donefile.jsonl"))) < 2:
        time.sleep(0.5)
    write_stream(str(tmp_path / "late"), ["20240101/02"], rows=60, seed=3)
    os.rename(tmp_path / "late" / "20240101" / "02", data / "20240101" / "02")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (out + err)[-3000:]  # stopped at the deadline, idle
    entries = donefile.read(str(work / "donefile.jsonl"))
    assert [e["partition"] for e in entries] == PARTITIONS[:2] + ["20240101/02"]
    assert entries[1]["bad_lines"] == 1 and entries[1]["rows"] == 60
    assert entries[1]["lines"] == 61 and entries[2]["rows"] == 60
    # Both ranks trained the late partition: each printed the summary of 2 partitions.
    summaries = [line for line in out.splitlines() if '"partitions": 2' in line]
    assert len(summaries) == 2, out[-3000:]
