"""A partition that trains the model into NaN is never saved or delivered: the trainer stops
naming it, or (on_nonfinite="skip") goes back to the last good checkpoint, records the
partition as skipped and trains on exactly as a stream without it."""

import json
import os

import numpy as np
import pytest
from nan_model_trainer import NAN_BELOW, config, nan_model_fn
from test_streaming_trainer import _export_state, write_stream

from mxrec.serving import versions
from mxrec.streaming import donefile, report
from mxrec.streaming.trainer import NonFiniteModelError, StreamingTrainer, summary

DAY = ["20240101/00", "20240101/01", "20240101/02", "20240101/03"]


def _poison(root, partition):
    """Adds one valid record whose d0 turns the model NaN."""
    with open(os.path.join(root, partition, "part-00000"), "a") as f:
        f.write(f"1\t{NAN_BELOW * 10:g}\t3\tv1\tv2\tv3\n")


def _run(data, work, export, **overrides):
    return StreamingTrainer(config(data, work, export, **overrides), nan_model_fn()).run()


def _assert_finite(export):
    for v in versions.list_versions(str(export)):
        _, state = _export_state_of(export, v)
        for name, value in state.items():
            assert np.isfinite(value).all(), (v, name)


def _export_state_of(export, version):
    """_export_state of one version (it reads the newest): the others moved aside."""
    aside = {v for v in versions.list_versions(str(export)) if v > version}
    for v in aside:
        os.rename(export / str(v), export / f".aside-{v}")
    try:
        return _export_state(export)
    finally:
        for v in aside:
            os.rename(export / f".aside-{v}", export / str(v))


def test_stop_names_the_partition_and_delivers_nothing_of_it(tmp_path):
    data = tmp_path / "data"
    write_stream(str(data), DAY[:3], rows=64)
    _poison(str(data), DAY[1])
    work, export = tmp_path / "work", tmp_path / "export"
    with pytest.raises(NonFiniteModelError, match=rf"partition {DAY[1]} \(step 2\) trained "
                       r"the model into non-finite values; nothing of it was saved or "
                       r"delivered \(serving version 1 stays the newest\).*--on-nonfinite skip"):
        _run(data, work, export)
    assert [e["partition"] for e in donefile.read(str(work / "donefile.jsonl"))] == DAY[:1]
    assert sorted(os.listdir(work / "checkpoints")) == ["full-000000000001"]
    assert versions.list_versions(str(export)) == [1]
    assert not [n for n in os.listdir(export) if n.startswith(".tmp-")]
    _assert_finite(export)
    # A restart stops on the same partition, naming it again: nothing was recorded.
    with pytest.raises(NonFiniteModelError, match=DAY[1]):
        _run(data, work, export)
    assert versions.list_versions(str(export)) == [1]


@pytest.mark.parametrize("poisoned", [DAY[0], DAY[2]], ids=["first", "middle"])
def test_skip_goes_back_and_equals_the_stream_without_the_partition(tmp_path, poisoned):
    data, clean = tmp_path / "data", tmp_path / "clean"
    write_stream(str(data), DAY, rows=64)
    write_stream(str(clean), DAY, rows=64)
    _poison(str(data), poisoned)
    os.rename(clean / poisoned, tmp_path / "removed")  # the reference never sees it

    entries = _run(data, tmp_path / "work", tmp_path / "export", on_nonfinite="skip")
    reference = _run(clean, tmp_path / "ref_work", tmp_path / "ref_export")
    assert [e["partition"] for e in entries] == DAY
    skipped = [e for e in entries if e.get("skipped")]
    assert [e["partition"] for e in skipped] == [poisoned]
    assert "non-finite" in skipped[0]["skipped"] and skipped[0]["checkpoint"] is None
    trained = [e for e in entries if not e.get("skipped")]
    assert [e["step"] for e in trained] == [e["step"] for e in reference] == [1, 2, 3]
    assert [e["export_version"] for e in trained] == [1, 2, 3]
    for got, want in zip(trained, reference):
        assert got["partition"] == want["partition"] and got["rows"] == want["rows"]
        assert got["table_rows"] == want["table_rows"]
        np.testing.assert_allclose(got["metrics"]["auc"], want["metrics"]["auc"], atol=1e-6)
    version, state = _export_state(tmp_path / "export")
    ref_version, ref_state = _export_state(tmp_path / "ref_export")
    assert version == ref_version == 3 and sorted(state) == sorted(ref_state)
    for name in ref_state:
        np.testing.assert_allclose(state[name], ref_state[name], atol=1e-5, err_msg=name)
    _assert_finite(tmp_path / "export")

    # A restart reads the skip from the donefile: nothing is trained again.
    assert _run(data, tmp_path / "work", tmp_path / "export", on_nonfinite="skip") == []
    assert json.loads(summary(entries))["skipped"] == [poisoned]
    png = report.write_png(str(tmp_path / "work" / "donefile.jsonl"), str(tmp_path / "r.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
