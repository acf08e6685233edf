"""RecSDK's Wide&Deep example (examples/mx_rec_zoo/wide_deep, a port with every edit
marked) in the modes its run.sh offers off the NPU, on the same synthetic TFRecords.

As tests/compat/test_mx_rec_zoo_dlrm.py: each mode trains, evaluates, saves, restores (the
restored evaluation gives the training run's AUC exactly), and its AUC is compared with
the direct run of the same settings (tensor IDs, modify_graph=False), within four standard
errors of the AUC on the test set. The FeatureSpec modes go through the example's
`dataset.eos_map(librec, channel, max_train_steps, max_eval_steps)` (max_train_steps is
the data's 120 batches here; its cap is tested in tests/compat/test_mx_rec_zoo_api.py).
The example's dropout draws differ between the paths (another graph, other op seeds),
part of the noise the tolerance allows.
"""

import pytest
from zoo_support import ZOO, check_mode

SIZES = {
    "TRAIN_RANK_SIZE": 1, "ZOO_BATCH_SIZE": 128, "ZOO_TRAIN_EPOCH": 4, "ZOO_TEST_EPOCH": 1,
    "ZOO_MAX_TRAIN_STEPS": 120, "ZOO_TRAIN_STEPS": 120, "ZOO_EVAL_STEPS": 8,
    "ZOO_SEND_COUNT": 3000, "ZOO_ACCESS_THRESHOLD": 2,
    # 2,650 IDs in each table, about 1,900 a batch: DDR and SSD swap, SSD spills
    "ZOO_HBM_DEV_VOCAB": 6000, "ZOO_DDR_DEV_VOCAB": 2400, "ZOO_DDR_HOST_VOCAB": 6000,
    "ZOO_SSD_DEV_VOCAB": 2400, "ZOO_SSD_HOST_VOCAB": 300, "ZOO_SSD_SSD_VOCAB": 6000,
}

# (USE_MODIFY_GRAPH, CACHE_MODE, USE_DYNAMIC, USE_FAAE, USE_DYNAMIC_EXPANSION,
# USE_MULTI_LOOKUP); run.sh's defaults first (it sets USE_MODIFY_GRAPH=1).
MODES = [  # admission/eviction halves the device rows (the example's own): HBM only
    (1, "HBM", 0, 0, 0, 0),
    (0, "HBM", 1, 1, 0, 1),
    (0, "DDR", 0, 0, 0, 0),
    (1, "SSD", 1, 0, 0, 0),
    (1, "HBM", 1, 0, 1, 1),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    import gen_data_loader

    out = tmp_path_factory.mktemp("wide_deep_data")
    gen_data_loader.load().write(str(out), "wide_deep", line_per_sample=1,
                                 train_records=3840, test_records=1024, ids_per_field=100,
                                 seed=1)
    return out


@pytest.mark.parametrize("modify_graph, cache, dynamic, faae, expansion, multi", MODES)
def test_mode_trains_evaluates_saves_restores(tmp_path, data, modify_graph, cache, dynamic,
                                              faae, expansion, multi):
    env = dict(SIZES, DLRM_CRITEO_DATA_PATH=data, CACHE_MODE=cache, USE_DYNAMIC=dynamic,
               USE_FAAE=faae, USE_DYNAMIC_EXPANSION=expansion, USE_MULTI_LOOKUP=multi)
    check_mode("wide_deep", tmp_path, data, env, modify_graph, steps=120)


def test_the_port_marks_every_edit():
    for path in sorted((ZOO / "wide_deep").glob("*.py")):
        text = path.read_text()
        assert text.startswith("# coding=utf-8\n# Copyright 2024. Huawei"), path
        assert "mxrec port" in text, path
