"""Model dirs and export bases are owned: a second model, a lost or stale donefile, a second
trainer on one folder are refused with nothing deleted, and a crash's leftovers of this
model alone are cleaned."""

import hashlib
import json
import os
import signal
import time

import pytest
from test_streaming_trainer import PARTITIONS, _cli, write_stream

from mxrec.serving import versions
from mxrec.streaming import donefile, models, ownership, parsers
from mxrec.streaming.trainer import FAULT_ENV, StreamConfig, StreamingTrainer

SCHEMA = "y:label,d0:dense,d1:dense,c0:categorical,c1:categorical,c2:categorical"


def _snapshot(root):
    """{relative path: sha256} of every file under root (but the trainers' lock files)."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name == ownership.LOCK_FILE:
                continue
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _train(data, work, export, max_partitions=None):
    config = StreamConfig(data=str(data), schema=parsers.parse_schema_spec(SCHEMA),
                          workdir=str(work), export_base=None if export is None else str(export),
                          batch_size=64, progress=False, tensorboard=False, threads=1,
                          max_partitions=max_partitions)
    model = models.ModelConfig("wide_deep", dim=4, hidden=(8,), vocabulary=4000)
    return StreamingTrainer(config, models.make_model_fn(model)).run()


@pytest.fixture
def stream(tmp_path):
    data = tmp_path / "data"
    write_stream(str(data), PARTITIONS[:3], rows=64)
    return data


def test_second_model_on_the_same_export_base_is_refused(tmp_path, stream):
    export = tmp_path / "serving"
    _train(stream, tmp_path / "a", export, max_partitions=2)
    served = _snapshot(export)
    assert sorted(versions.list_versions(str(export))) == [1, 2]

    proc = _cli(stream, tmp_path / "b", export)  # the documented CLI, a second model
    _, err = proc.communicate(timeout=240)
    assert proc.returncode != 0
    assert proc.returncode == 1 and "Traceback" not in err  # a refusal, said plainly
    assert f"export base {export} belongs to model" in err and str(tmp_path / "a") in err
    assert str(tmp_path / "b") in err and "Nothing was changed" in err
    assert _snapshot(export) == served  # versions 1 and 2 of model a untouched
    # Model a goes on delivering into its base.
    entries = _train(stream, tmp_path / "a", export)
    assert [e["partition"] for e in entries] == PARTITIONS[2:3]
    assert versions.list_versions(str(export)) == [1, 2, 3]
    owner = json.loads((export / ownership.OWNER_FILE).read_text())
    model = json.loads((tmp_path / "a" / ownership.MODEL_FILE).read_text())
    assert owner["model_id"] == model["model_id"]
    for v in (1, 2, 3):
        assert versions.verify(str(export / str(v)))["model_id"] == model["model_id"]


def test_lost_donefile_is_refused_and_nothing_deleted(tmp_path, stream):
    work, export = tmp_path / "work", tmp_path / "serving"
    _train(stream, work, export, max_partitions=2)
    os.remove(work / "donefile.jsonl")
    before = _snapshot(tmp_path)
    with pytest.raises(ownership.OwnershipError, match="donefile.jsonl is missing, but .* "
                       "holds checkpoint versions up to step 2: nothing was deleted"):
        _train(stream, work, export)
    assert _snapshot(tmp_path) == before


def test_stale_donefile_is_refused_and_nothing_deleted(tmp_path, stream):
    work, export = tmp_path / "work", tmp_path / "serving"
    _train(stream, work, export, max_partitions=1)
    old = (work / "donefile.jsonl").read_text()
    _train(stream, work, export)  # steps 2 and 3
    (work / "donefile.jsonl").write_text(old)  # a donefile restored from an old backup
    before = _snapshot(tmp_path)
    with pytest.raises(ownership.OwnershipError, match=r"ends at step 1, but .* holds later "
                       r"checkpoints \[3\]"):
        _train(stream, work, export)
    assert _snapshot(tmp_path) == before
    # A donefile whose last checkpoint is gone is refused too.
    entries = donefile.read(str(work / "donefile.jsonl"))
    (work / "donefile.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    os.rename(work / "checkpoints" / "full-000000000001", tmp_path / "aside")
    with pytest.raises(ownership.OwnershipError, match="has no checkpoint of that step"):
        _train(stream, work, export)


def test_crash_in_the_first_partition_is_cleaned_not_refused(tmp_path, stream):
    """The donefile exists (empty) from the first start, so the leftovers of a crash in the
    first partition are this model's and are removed; the rerun delivers version 1."""
    work, export = tmp_path / "work", tmp_path / "serving"
    proc = _cli(stream, work, export, env={FAULT_ENV: "after_export:1"})
    proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL
    assert (work / "donefile.jsonl").read_text() == ""
    assert versions.list_versions(str(export)) == [1]
    first = versions.verify(str(export / "1"))["time"]
    entries = _train(stream, work, export)
    assert [e["step"] for e in entries] == [1, 2, 3]
    assert versions.verify(str(export / "1"))["time"] > first  # delivered again


def test_versions_another_writer_left_are_never_cleaned(tmp_path, stream):
    """A version above the donefile's step that this model did not write (no model_id of
    its own) is not deleted by the clean-up; an unclaimed base with a foreign version is
    refused."""
    work, export = tmp_path / "work", tmp_path / "serving"
    foreign = tmp_path / "other"
    (foreign / "7").mkdir(parents=True)
    (foreign / "7" / "saved_model.pb").write_bytes(b"not ours")
    with pytest.raises(ownership.OwnershipError, match=r"holds serving versions \[7\] that "
                       "this model .* did not write"):
        _train(stream, work, foreign)
    assert (foreign / "7" / "saved_model.pb").read_bytes() == b"not ours"
    assert not (foreign / ownership.OWNER_FILE).exists()

    _train(stream, work, export, max_partitions=1)
    (export / "9").mkdir()
    (export / "9" / "saved_model.pb").write_bytes(b"someone else's")
    _train(stream, work, export, max_partitions=1)
    assert (export / "9" / "saved_model.pb").read_bytes() == b"someone else's"


def test_an_earlier_mxrec_base_is_adopted_when_its_donefile_lists_every_version(tmp_path,
                                                                             stream):
    work, export = tmp_path / "work", tmp_path / "serving"
    _train(stream, work, export, max_partitions=2)
    # As an earlier mxrec left them: no identity files, versions without a model_id.
    os.remove(export / ownership.OWNER_FILE)
    os.remove(work / ownership.MODEL_FILE)
    for v in (1, 2):
        path = export / str(v) / versions.MANIFEST
        manifest = json.loads(path.read_text())
        del manifest["model_id"]
        path.write_text(json.dumps(manifest))
    entries = _train(stream, work, export)
    assert [e["step"] for e in entries] == [3]
    assert (export / ownership.OWNER_FILE).exists()


def test_second_trainer_on_one_model_dir_is_refused(tmp_path, stream):
    work, export = tmp_path / "work", tmp_path / "serving"
    first = _cli(stream, work, export, ["--watch", "--poll_interval", "0.5", "--deadline", "120"])
    try:
        deadline = time.time() + 200
        while time.time() < deadline and len(donefile.read(str(work / "donefile.jsonl"))) < 3:
            assert first.poll() is None, first.communicate()[1][-2000:]
            time.sleep(0.5)
        with pytest.raises(ownership.OwnershipError, match=r"model dir .* is in use by another "
                           rf"trainer \(.*\"pid\": {first.pid}"):
            _train(stream, work, export)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert [e["step"] for e in donefile.read(str(work / "donefile.jsonl"))] == [1, 2, 3]
