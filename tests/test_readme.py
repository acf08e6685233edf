"""README.md's example runs as written, and does what it says."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Example\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == [
        "bash scripts/demo.sh", "bash scripts/test.sh"]


def test_readme_example_runs(tmp_path):
    source = _example()
    assert len(source.strip().splitlines()) <= 32
    script = tmp_path / "example.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"loss (\d+\.\d+) after 20 steps, (\d+) IDs with a row", result.stdout)
    assert found, result.stdout
    # The same draws as the example: every distinct ID of its 20 batches got a row.
    rng = np.random.default_rng(0)
    vocab = rng.integers(-2**63, 2**63 - 1, size=1_000, dtype=np.int64)
    seen = np.unique(np.concatenate([rng.choice(vocab, (64, 3)).ravel() for _ in range(20)]))
    assert int(found.group(2)) == len(seen)
    assert 0.0 < float(found.group(1)) < 1.0


def test_readme_links_exist():
    """Every docs/ link of README.md names a file, except the two other engineers write
    today (docs/SERVING.md, docs/INSTALL.md)."""
    text = (ROOT / "README.md").read_text()
    pending = {"docs/SERVING.md", "docs/INSTALL.md"}
    links = set(re.findall(r"\]\(((?:docs|bench)/[A-Za-z_./]+)\)", text))
    assert "docs/ARCHITECTURE.md" in links
    missing = sorted(link for link in links - pending if not (ROOT / link).exists())
    assert not missing, missing
