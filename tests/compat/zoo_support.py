"""Runs the ports of RecSDK's model examples (examples/mx_rec_zoo/).

Each run is what `run.sh` does for one process: the example's environment, its working
directory, `python main_mxrec.py`; the port writes its results (AUC per evaluation,
steps, losses) as JSON to ZOO_RESULT.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZOO = ROOT / "examples" / "mx_rec_zoo"


def example_path(example: str, overlay: str = None) -> str:
    """The PYTHONPATH a port runs with (run.sh runs in the example's folder)."""
    folders = [ROOT, ZOO] + ([ZOO / overlay] if overlay else []) + [ZOO / example]
    return os.pathsep.join(str(folder) for folder in folders)


def _example_env(example: str, env: dict, result: str, overlay: str = None) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ZOO_", "USE_"))}
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE"):
        full.pop(name, None)
    full.update({k: str(v) for k, v in env.items()})
    full.update(ZOO_RESULT=result, MXREC_LOG_LEVEL="ERROR", TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONPATH=example_path(example, overlay))
    return full


def run_ranks(example: str, workdir: pathlib.Path, env: dict, ranks: int,
              launcher: str = "mxrec.launch", overlay: str = None, main: str = None) -> list:
    """Runs the example on `ranks` ranks as its run.sh does with TRAIN_RANK_SIZE=ranks
    (`python -m mxrec.launch -n N` or `mpirun -n N`); each rank's results, by rank.
    `overlay` and `main` as run_example's."""
    from mxrec import launch

    workdir.mkdir(parents=True, exist_ok=True)
    script = [str(ZOO / (main or example) / "main_mxrec.py")]
    if launcher == "mxrec.launch":
        command = [sys.executable, "-m", "mxrec.launch", "-n", str(ranks)] + script
    else:
        command = launch.mpirun_command(ranks, [sys.executable] + script)
    full = _example_env(example, dict(env, TRAIN_RANK_SIZE=ranks, MXREC_COLLECTIVE_TIMEOUT=300),
                        str(workdir / "result-{rank}.json"), overlay)
    done = subprocess.run(command, cwd=workdir, env=full, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise AssertionError(f"{example} on {ranks} ranks failed ({done.returncode}) with "
                             f"{env}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return [json.loads((workdir / f"result-{rank}.json").read_text()) for rank in range(ranks)]


def run_example(example: str, workdir: pathlib.Path, env: dict, overlay: str = None,
                main: str = None) -> dict:
    """Runs examples/mx_rec_zoo/<example>/main_mxrec.py in `workdir` with `env`, in a
    process of its own (as run.sh does; the examples set process-wide TF behaviour).
    `overlay`, a folder of examples/mx_rec_zoo, comes first on the path: its files (another
    RecSDK version's) replace the example's; `main`, the folder whose main_mxrec.py runs
    (default: the example's)."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = workdir / "result.json"
    if result.exists():
        result.unlink()
    full = _example_env(example, env, str(result), overlay)
    script = ZOO / (main or example) / "main_mxrec.py"
    done = subprocess.run([sys.executable, str(script)], cwd=workdir,
                          env=full, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"{example} failed ({done.returncode}) with {env}:\n"
                             f"{done.stderr[-6000:]}")
    return json.loads(result.read_text())


def auc_tolerance(positives: int, negatives: int, auc: float) -> float:
    """Four standard errors of an AUC (Hanley and McNeil, 1982) on an evaluation set of
    that many positive and negative samples."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc)
                + (negatives - 1) * (q2 - auc * auc)) / (positives * negatives)
    return 4 * math.sqrt(variance)


def label_counts(data_dir: pathlib.Path):
    """(positives, negatives) of the test records."""
    positives = total = 0
    for path in sorted((data_dir / "test").glob("*.tfrecord")):
        for record in tf.compat.v1.io.tf_record_iterator(str(path)):
            example = tf.train.Example.FromString(record)
            labels = example.features.feature["label"].int64_list.value
            positives += sum(labels)
            total += len(labels)
    return positives, total - positives


def check_mode(example: str, tmp_path: pathlib.Path, data: pathlib.Path, env: dict,
               modify_graph: int, steps: int, overlay: str = None) -> None:
    """One of run.sh's modes: trains, evaluates and saves, then restores and evaluates again.

    The AUC must be within auc_tolerance of the one-process direct run of the same model
    (ZOO_DIRECT), above 0.6, and the restored run's AUC the training run's, exactly.
    """
    direct = "modify_graph" if modify_graph else 1
    reference = run_example(example, tmp_path / "direct", dict(env, ZOO_DIRECT=direct))
    trained = run_example(example, tmp_path / "run", dict(env, USE_MODIFY_GRAPH=modify_graph),
                          overlay)
    assert trained["steps"] == reference["steps"] == steps and len(trained["auc"]) == 1
    assert (tmp_path / "run" / "saved-model" / "sparse-model-0").is_dir()
    assert np.all(np.isfinite(trained["losses"]))
    auc, want = trained["auc"][0], reference["auc"][0]
    assert min(auc, want) > 0.6, f"the mode did not learn: AUC {auc}, direct {want}"
    positives, negatives = label_counts(data)
    assert abs(auc - want) <= auc_tolerance(positives, negatives, want), (auc, want)
    # The script's IF_LOAD finds ./saved-model/sparse-model-0: restore, evaluate only.
    restored = run_example(example, tmp_path / "run", dict(env, USE_MODIFY_GRAPH=modify_graph),
                           overlay)
    assert restored["restored_step"] == trained["saved_step"]
    assert restored["auc"] == trained["auc"]
