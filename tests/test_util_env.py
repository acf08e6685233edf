"""mxrec.util.env.seconds: the one parser of the launcher's grace and the collective timeout."""

import pytest

from mxrec import launch
from mxrec.distributed import communication, mpi_ops
from mxrec.util import env


def test_unset_and_empty_give_the_default(monkeypatch):
    monkeypatch.delenv("MXREC_TEST_SECONDS", raising=False)
    assert env.seconds("MXREC_TEST_SECONDS", 7.5) == 7.5
    monkeypatch.setenv("MXREC_TEST_SECONDS", "")
    assert env.seconds("MXREC_TEST_SECONDS", 7.5) == 7.5


def test_a_number_is_read(monkeypatch):
    monkeypatch.setenv("MXREC_TEST_SECONDS", "2.25")
    assert env.seconds("MXREC_TEST_SECONDS", 1.0) == 2.25


@pytest.mark.parametrize("raw, allow_zero, message", [
    ("soon", False, r"MXREC_TEST_SECONDS must be a number of seconds, got 'soon'"),
    ("nan", True, r"MXREC_TEST_SECONDS must be a number of seconds, got 'nan'"),
    ("-1", True, r"MXREC_TEST_SECONDS must be >= 0, got '-1'"),
    ("0", False, r"MXREC_TEST_SECONDS must be > 0, got '0'"),
])
def test_bad_values_name_the_variable(monkeypatch, raw, allow_zero, message):
    monkeypatch.setenv("MXREC_TEST_SECONDS", raw)
    with pytest.raises(ValueError, match=message):
        env.seconds("MXREC_TEST_SECONDS", 1.0, allow_zero=allow_zero)


def test_zero_where_allowed(monkeypatch):
    monkeypatch.setenv("MXREC_TEST_SECONDS", "0")
    assert env.seconds("MXREC_TEST_SECONDS", 1.0, allow_zero=True) == 0.0


def test_the_three_readers(monkeypatch):
    monkeypatch.setenv("MXREC_LAUNCH_GRACE", "0")
    assert launch._grace(None) == 0.0
    assert launch._grace(3.0) == 3.0
    monkeypatch.setenv("MXREC_COLLECTIVE_TIMEOUT", "12")
    assert communication.timeout_seconds() == 12.0
    assert mpi_ops._timeout(None) == 12.0
    assert mpi_ops._timeout(4) == 4.0
    monkeypatch.setenv("MXREC_COLLECTIVE_TIMEOUT", "0")
    with pytest.raises(ValueError, match="MXREC_COLLECTIVE_TIMEOUT must be > 0"):
        communication.timeout_seconds()
    with pytest.raises(ValueError, match="MXREC_COLLECTIVE_TIMEOUT must be > 0"):
        mpi_ops._timeout(None)
