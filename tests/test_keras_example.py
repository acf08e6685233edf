"""examples/keras/checkpoint_and_serve.py runs (in an eager process of its own): it trains,
checkpoints, resumes from its checkpoint after a restart, and its export serves what the
model predicts (the example exits non-zero otherwise)."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_checkpoint_and_serve_example(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "keras" / "checkpoint_and_serve.py"),
         "--steps", "20", "--batch_size", "64", "--workdir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "restarted from step 10: now at step 20" in out, out
    versions = re.search(r"versions: (.*)", out).group(1).split()
    assert versions == ["delta-000000000005", "delta-000000000010", "delta-000000000015",
                        "full-000000000000", "full-000000000020"], versions
    assert sorted(os.listdir(tmp_path / "ckpt")) == versions
    gap = float(re.search(r"max \|served - model.predict\| = (\S+)", out).group(1))
    assert gap <= 1e-5
