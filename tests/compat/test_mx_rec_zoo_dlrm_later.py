"""RecSDK's later DLRM (examples/mx_rec_zoo/dlrm_later/main_mxrec.py, which takes its Config,
input, evaluation and FeatureSpecs from mx_rec.util.model_common) and mxrec's own
model_common (mxrec/compat/model_common.py).

The later script builds the same graph as the earlier one from the same pieces moved into
model_common, so on one process and the same data they must agree exactly: every loss, the
AUC, the saved table and dense weights (the earlier port, examples/mx_rec_zoo/dlrm, is the
reference; both order their step alike). The later run sets INTERVAL, so its evaluation is
evaluate_fix, whose saved labels and predictions give the AUC it returned, and a second run
restores what it saved and evaluates to the same AUC. Every run.sh
switch on and off (the earlier port's modes on ranks). Several ranks:
tests/compat/test_mx_rec_zoo_ranks.py.
"""

import importlib.util

import numpy as np
import pytest
import tensorflow as tf
from zoo_support import run_example

from mxrec.compat import model_common
from mxrec.saver.sparse import export
from mxrec.streaming.metrics import roc_auc

SHORT = {  # 8 steps of test_mx_rec_zoo_ranks.py's short DLRM runs, its table rows
    "TRAIN_RANK_SIZE": 1, "ZOO_BATCH_SIZE": 256, "ZOO_LINE_PER_SAMPLE": 64,
    "ZOO_TRAIN_EPOCH": 1, "ZOO_TRAIN_STEPS": 8, "ZOO_EVAL_STEPS": 100,
    "ZOO_LR_STEPS_SCALE": 0.02, "ZOO_LR_SCALE": 0.25, "ZOO_SEND_COUNT": 6000,
    "ZOO_HBM_DEV_VOCAB": 24000, "ZOO_DDR_DEV_VOCAB": 8000, "ZOO_DDR_HOST_VOCAB": 12000,
    "ZOO_SSD_DEV_VOCAB": 8000, "ZOO_SSD_HOST_VOCAB": 1600, "ZOO_SSD_SSD_VOCAB": 12000,
}

# run.sh's switches: (USE_MODIFY_GRAPH, CACHE_MODE, USE_DYNAMIC, USE_FAAE,
# USE_DYNAMIC_EXPANSION, USE_MULTI_LOOKUP); the first is run.sh's defaults. With USE_FAAE,
# model_common's FeatureSpecs admit an ID after 1000 accesses (RecSDK's), so in 8 steps no ID
# enters the table (in both scripts): that mode checks the timestamps, the FeatureSpecs and
# the MonitoredTrainingSession with EvictHook, not admitted rows.
MODES = [
    (0, "HBM", 0, 0, 0, 0),
    (1, "DDR", 1, 0, 0, 1),
    (0, "HBM", 1, 1, 0, 0),
    (0, "HBM", 0, 0, 1, 0),
    (0, "SSD", 0, 0, 0, 0),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    import gen_data_loader

    out = tmp_path_factory.mktemp("dlrm_short")
    gen_data_loader.load().write(str(out), "dlrm", line_per_sample=64, train_records=32,
                                 test_records=16, ids_per_field=400, seed=0)
    return out


def _saved(directory):
    """({table: (sorted ids, rows)}, {dense name: array}) of mxrec's checkpoint of a run."""
    tables = {}
    for name, arrays in export(checkpoint=str(directory / "saved-model" / "mxrec")).items():
        order = np.argsort(arrays["ids"])
        tables[name] = (arrays["ids"][order], arrays["embeddings"][order])
    version = sorted((directory / "saved-model" / "mxrec").glob("full-*"))[-1]
    with np.load(version / "dense.npz") as arrays:
        dense = {name: arrays[name] for name in arrays.files if name.startswith("mlp/")}
    return tables, dense


@pytest.mark.parametrize("mode", MODES, ids=["-".join(map(str, mode)) for mode in MODES])
def test_later_script_equals_the_earlier_port(tmp_path, data, mode):
    names = ("USE_MODIFY_GRAPH", "CACHE_MODE", "USE_DYNAMIC", "USE_FAAE",
             "USE_DYNAMIC_EXPANSION", "USE_MULTI_LOOKUP")
    env = dict(SHORT, DLRM_CRITEO_DATA_PATH=data, **dict(zip(names, mode)))
    default = mode == MODES[0]  # the later run evaluates with evaluate_fix (INTERVAL set)
    earlier = run_example("dlrm", tmp_path / "earlier", env)
    later = run_example("dlrm", tmp_path / "later", dict(env, **({"INTERVAL": 8} if default
                                                                 else {})),
                        overlay="dlrm_later", main="dlrm_later")
    assert later["steps"] == earlier["steps"] == 8
    assert later["losses"] == earlier["losses"]
    assert later["auc"] == earlier["auc"] and len(later["auc"]) == 1
    (want_tables, want_dense), (tables, dense) = (_saved(tmp_path / "earlier"),
                                                  _saved(tmp_path / "later"))
    assert sorted(tables) == sorted(want_tables) == ["sparse_embeddings"]
    for name, (ids, rows) in want_tables.items():
        np.testing.assert_array_equal(tables[name][0], ids)
        np.testing.assert_array_equal(tables[name][1], rows)
    assert sorted(dense) == sorted(want_dense) and len(dense) == 16
    for name, weights in want_dense.items():
        np.testing.assert_array_equal(dense[name], weights)
    if not default:
        return
    # The script's IF_LOAD finds ./saved-model/sparse-model-0: restore, evaluate only.
    restored = run_example("dlrm", tmp_path / "later", env, overlay="dlrm_later",
                           main="dlrm_later")
    assert restored["restored_step"] == later["saved_step"] == 8
    assert restored["auc"] == later["auc"]
    # evaluate_fix saved this rank's labels and predictions of the evaluation at step 8
    folder = tmp_path / "later" / "interval_8" / "numpy_8"
    labels, preds = np.load(folder / "label_0.npy"), np.load(folder / "pred_0.npy")
    assert len(labels) == len(preds) == 16 * 64
    assert roc_auc(labels, preds) == later["auc"][0]


def _fresh_module(monkeypatch, **env):
    """A fresh copy of model_common, its module-level switches read from `env`."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("model_common_probe", model_common.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, says", [("USE_SHM_SWAP", "PCIe shared-memory queue"),
                                        ("HUGE_TLB_ENABLE", "huge pages")])
def test_npu_switches_are_refused_by_name(monkeypatch, name, says):
    with pytest.raises(ValueError, match=f"{name}=1 is not supported on mxrec: Ascend NPU "
                                         f"only: .*{says}"):
        _fresh_module(monkeypatch, **{name: "1"})
    assert _fresh_module(monkeypatch, **{name: "0"}).MODIFY_GRAPH_FLAG is False


def test_the_switches_read_as_recsdk_reads_them(monkeypatch):
    """USE_DP is the flag scripts pass to create_table(is_dp=...) (a replicated table)."""
    module = _fresh_module(monkeypatch, USE_DP="1", USE_FAAE="1", USE_MODIFY_GRAPH="1",
                           USE_MULTI_LOOKUP="1", USE_DYNAMIC_EXPANSION="0", INTERVAL="5")
    assert (module.USE_DP, module.use_faae, module.MODIFY_GRAPH_FLAG, module.use_multi_lookup,
            module.use_dynamic_expansion, module.interval) == (True, True, True, True, False, 5)


def test_a_switch_other_than_0_or_1_names_itself(monkeypatch):
    with pytest.raises(ValueError, match="USE_FAAE='2'; only 0 or 1"):
        _fresh_module(monkeypatch, USE_FAAE="2")


def test_npu_session_options_are_refused():
    with pytest.raises(ValueError, match=r"sess_config\(dump_data=True\).*Ascend NPU only"):
        model_common.sess_config(dump_data=True)
    config = model_common.sess_config()
    assert config.inter_op_parallelism_threads == 1 and config.allow_soft_placement
    from mxrec import compat

    with pytest.raises(compat.RefusedImport, match="Ascend NPU only: npu_bridge's NPURunConfig"):
        from mxrec.util.model_common import get_npu_run_config  # noqa: F401


def _schedule_reference(step, base, warmup, decay_start, decay_steps, clip):
    """RecSDK's schedule in NumPy: warm-up, constant, decay (power 2), then 1/decay_steps."""
    if step < warmup:
        factor = 1 - (warmup - step) / warmup
    elif step < decay_start:
        factor = 1.0
    elif step < decay_start + decay_steps:
        factor = ((decay_start + decay_steps - step) / decay_steps) ** 2
    else:
        factor = 1 / decay_steps
    value = base * factor
    return min(max(value, 0.0), 10.0) if clip else value


@pytest.mark.parametrize("model_name", ["DLRM", None])
def test_learning_rate_schedule_matches_a_numpy_reference(monkeypatch, model_name):
    """DLRM's sparse rate is clipped to [0, 10] (RecSDK's); without MODEL_NAME, not."""
    monkeypatch.setattr(model_common, "MODEL_NAME", model_name)
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int32, [])
        dense, sparse = model_common.LearningRateScheduler(2.0, 30.0, 4, 10, 6).calc(step)
        with tf.compat.v1.Session() as sess:
            for value in (0, 1, 3, 4, 9, 10, 13, 15, 16, 40):
                got = sess.run([dense, sparse], {step: value})
                np.testing.assert_allclose(got, [
                    _schedule_reference(value, 2.0, 4, 10, 6, False),
                    _schedule_reference(value, 30.0, 4, 10, 6, model_name == "DLRM")],
                    rtol=1e-6, err_msg=str(value))


def test_config_and_inputs_name_what_is_wrong(monkeypatch):
    monkeypatch.setattr(model_common, "MODEL_NAME", "DLRM")
    monkeypatch.setenv("CACHE_MODE", "HBM")
    monkeypatch.setenv("TRAIN_RANK_SIZE", "2")
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="TRAIN_RANK_SIZE=2, but 1 ranks run"):
            model_common.Config()
        monkeypatch.setenv("TRAIN_RANK_SIZE", "1")
        monkeypatch.setenv("CACHE_MODE", "PMEM")
        with pytest.raises(ValueError, match="CACHE_MODE:PMEM"):
            model_common.Config()
        monkeypatch.setenv("CACHE_MODE", "SSD")
        cfg = model_common.Config()
        assert cfg.get_emb_table_cfg() == {
            "device_vocabulary_size": 100_000, "host_vocabulary_size": 2_000_000,
            "ssd_vocabulary_size": 24_000_000, "ssd_data_path": ["ssd_data"]}
        monkeypatch.setattr(model_common, "MODEL_NAME", "WideDeep")
        with pytest.raises(ValueError, match="MODEL_NAME='WideDeep'.*not available"):
            model_common.create_feature_spec_list(cfg)
