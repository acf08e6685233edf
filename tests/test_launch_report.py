"""The launcher names the failing rank from mpirun's (prterun's) report."""

import pytest

from mxrec import launch

# As prterun prints it: the sentence wraps before "signal 9".
WRAPPED = """--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 22210 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize("report, rank", [
    (WRAPPED, 1),
    ("prterun noticed that process rank 3 with PID 7 on node a-b.c exited on signal 15 "
     "(Terminated).\n", 3),
    ("  Process name: [prterun-vm-123@1,0]\n  Exit code: 2\n", 0),
    ("[0] a rank's own output\nTraceback (most recent call last):\n", None),
])
def test_failed_rank_from_the_report(report, rank):
    job = launch._Job(grace=1.0)  # noqa: SLF001
    for line in report.splitlines(keepends=True):
        job._note(line)  # noqa: SLF001
    assert job.failed_rank == rank


def test_the_first_report_wins():
    job = launch._Job(grace=1.0)  # noqa: SLF001
    job._note("prterun noticed that process rank 2 with PID 1 on node vm exited on\n")  # noqa: SLF001
    job._note("prterun noticed that process rank 0 with PID 2 on node vm exited on\n")  # noqa: SLF001
    assert job.failed_rank == 2
