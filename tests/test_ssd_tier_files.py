"""The SSD tier's files (tests/cc/ssd_tier_files_test.cc, built against the engine library):
a private 0700 directory per tier under ssd_data_path, files created with O_EXCL and
O_NOFOLLOW (a symlink or file planted at a name is neither followed, truncated nor removed,
and the error names the path and ssd_data_path), and dropping a tier removes only what it
created."""

import subprocess

from support import build_cc_test, needs_gxx


@needs_gxx
def test_ssd_tier_files(tmp_path):
    binary = build_cc_test("ssd_tier_files_test", tmp_path)
    scratch = tmp_path / "ssd"
    scratch.mkdir()
    result = subprocess.run([str(binary), str(scratch)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "private directory: ok", "planted compaction file: ok",
        "drop removes only its own: ok", "directory errors: ok"]
    assert not list(scratch.iterdir())
