"""C++ unit tests of the SSD tier (tests/cc/ssd_tier_test.cc), built against the engine
library: its fixed-size records at caller-given numbers (batched puts, per-component reads,
releases and reuse, the file widened for a new component) against a std::map reference; the
runs and pages a batch's write counts; the record allocator's order (a spill after scattered
frees goes to the file's end) and a random run against a reference set."""

import subprocess

from support import build_cc_test, needs_gxx


@needs_gxx
def test_ssd_tier_units(tmp_path):
    binary = build_cc_test("ssd_tier_test", tmp_path)
    scratch = tmp_path / "ssd"
    scratch.mkdir()
    result = subprocess.run([str(binary), str(scratch)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:1] == ["ssd tier records: ok"]
    assert not list(scratch.iterdir()), "the tier's file outlives the tier"
