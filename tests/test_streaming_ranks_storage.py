"""bfloat16 tables on 2 ranks (sharded by ID) with a host tier against one process without:
the streaming trainer with --storage_dtype bfloat16, admission and daily eviction
(test_streaming_ranks_equal's data and model). Each ID's row lives on its owner, in its 100
device rows or its host tier (2 bytes a value in both), and the owner's update rounds it as
one process does: the served rows are the same bits."""

import numpy as np
from test_streaming_ranks_equal import check, train, write_data
from test_streaming_trainer import _export_state

from mxrec.streaming import donefile


def test_tiered_bfloat16_tables_on_two_ranks_equal_one_device_only_process(tmp_path):
    write_data(tmp_path / "data")
    extra = {1: ["--storage_dtype", "bfloat16"],
             2: ["--storage_dtype", "bfloat16", "--vocabulary", "100", "--host_vocabulary",
                 "4000"]}
    for ranks in (1, 2):
        check(train(ranks, tmp_path / "data", tmp_path / f"work{ranks}",
                    tmp_path / f"export{ranks}", extra=extra[ranks]))
    one, two = (donefile.read(str(tmp_path / f"work{n}" / "donefile.jsonl")) for n in (1, 2))
    assert [e["partition"] for e in one] == [e["partition"] for e in two]
    assert sum(e["evicted"] for e in two) > 0
    want, got = (_export_state(tmp_path / f"export{n}")[1] for n in (1, 2))
    assert sorted(got) == sorted(want)
    tables = [name[:-len("/embeddings")] for name in want if name.endswith("/embeddings")]
    assert tables
    # more IDs than the 2 x 100 device rows: the host tiers held rows
    assert max(len(want[f"{table}/ids"]) for table in tables) > 200
    for table in tables:
        np.testing.assert_array_equal(got[f"{table}/ids"], want[f"{table}/ids"])
        rows = np.asarray(want[f"{table}/embeddings"], np.float32)
        # bfloat16 values (the low 16 bits clear), the same bits on 2 ranks
        assert not (rows.view(np.uint32) & 0xFFFF).any()
        np.testing.assert_array_equal(np.asarray(got[f"{table}/embeddings"]).view(np.uint32),
                                      rows.view(np.uint32))
    for name, value in want.items():
        if "/" not in name or name.split("/")[0] not in tables:
            np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-5, err_msg=name)
