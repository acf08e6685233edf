"""No bad tensor kills the process.

Every registered mxrec op is called eagerly (where no shape function runs) and in a graph
fed through placeholders of unknown shape, with wrong list lengths, wrong ranks, negative
and huge sizes, out-of-range indices and empty tensors (tests/op_robustness_cases.py).
Each call must end in the error its case names, with a message naming the input and the
numbers, or (empty tensors, edge values) in outputs of the stated shapes; and the process
must live on. The cases run in child processes: one that dies is named with its signal,
and the run goes on with the next case.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import op_robustness_cases as cases
import pytest
import tensorflow as tf

from mxrec._lib import loader
from mxrec.util import ops as mxrec_ops

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(cases.__file__).resolve()
_TIMEOUT = 300


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), str(SCRIPT.parent), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["KEY_PROCESS_THREAD_NUM"] = "1"
    return env


def _mpi_built():
    return loader.mpi_op_library_path().exists()


def _registered_ops():
    """The Mxrec* ops of the loaded libraries (the wrappers TensorFlow generated for them)."""
    libraries = [loader.op_library()] + ([loader.mpi_op_library()] if _mpi_built() else [])
    return {name for lib in libraries for name in dir(lib) if re.fullmatch(r"Mxrec\w+", name)}


def _source_ops():
    """The ops cc_ops/ops/ registers."""
    text = "".join(p.read_text() for p in sorted((REPO / "cc_ops" / "ops").glob("*.cc")))
    return set(re.findall(r'REGISTER_OP\("(Mxrec\w+)"\)', text))


def _run_cases(mode, names):
    """{case: outcome record} of the cases run in child processes, and {case: how its
    process died} for each case that killed one (the next process goes on after it)."""
    outcomes, deaths = {}, {}
    remaining = list(names)
    while remaining:
        proc = subprocess.run([sys.executable, str(SCRIPT), mode, *remaining], env=_env(),
                              capture_output=True, text=True, timeout=_TIMEOUT)
        running = None
        for line in proc.stdout.splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "start" in record:
                running = record["start"]
            else:
                outcomes[record["case"]] = record
                running = None
        if proc.returncode == 0:
            break
        assert running is not None, (
            f"the {mode} cases' process failed outside any case (exit {proc.returncode}):\n"
            f"{proc.stderr[-3000:]}")
        deaths[running] = f"exit {proc.returncode}: {_why(proc.stderr)}"
        remaining = remaining[remaining.index(running) + 1:]
    return outcomes, deaths


def _why(stderr):
    """The line of a dead process's stderr that says why it died."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for pattern in (r"Check failed", r"terminate called|what\(\)", r"Fatal|Abort"):
        said = [line for line in lines if re.search(pattern, line)]
        if said:
            return said[0][:300]
    return lines[-1][:300] if lines else "nothing on stderr"


def _mismatch(name, case, record, mode):
    """Why the outcome `record` of case `name` is not what the case expects, or None."""
    if case.expect is None:
        if "error" in record:
            return f"{name}: failed with {record['error']}: {record['message'][-400:]}"
        if case.shapes is not None and [tuple(s) for s in record["shapes"]] != list(case.shapes):
            return f"{name}: output shapes {record['shapes']}, want {list(case.shapes)}"
        return None
    if "error" not in record:
        return f"{name}: succeeded with shapes {record['shapes']}, want {case.expect}"
    if mode == "graph" and record["at"] == "build":
        return None  # a shape function or the wrapper refused it: no kernel ran
    if record["error"] != case.expect or not re.search(case.match, record["message"]):
        return (f"{name}: {record['error']}: {record['message'][-400:]!r}, want {case.expect} "
                f"matching {case.match!r}")
    return None


def test_every_registered_op_has_good_and_bad_cases():
    """The cases cover every op cc_ops/ops/ registers and every op the loaded libraries
    hold, so an op added without cases fails here; each op has a call that works, and
    each op that takes an input or an attribute has calls that must fail."""
    by_op = {}
    for case in cases.CASES.values():
        by_op.setdefault(case.op, []).append(case)
    assert set(by_op) == _source_ops()
    registered = _registered_ops()
    assert registered <= set(by_op)
    if _mpi_built():
        assert registered == set(by_op)
    for op, op_cases in by_op.items():
        assert any(c.expect is None for c in op_cases), f"{op} has no case that works"
        takes_something = any(c.inputs or c.attrs for c in op_cases)
        assert not takes_something or any(c.expect for c in op_cases), (
            f"{op} has no case that must fail")


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_bad_inputs_end_in_errors_and_the_process_lives(mode):
    names = [name for name, case in cases.CASES.items()
             if _mpi_built() or case.op not in cases.MPI_OPS]
    outcomes, deaths = _run_cases(mode, names)
    wrong = [f"{name}: killed the process ({how})" for name, how in deaths.items()]
    wrong += [_mismatch(name, cases.CASES[name], outcomes[name], mode)
              for name in names if name not in deaths]
    wrong = [w for w in wrong if w]
    assert not wrong, f"{len(wrong)} of {len(names)} {mode} cases:\n" + "\n".join(wrong)


# The issue's two rows through the public wrappers (mxrec.util.ops, mxrec.distributed.sharded_ops)
# and the raw ops, eagerly.
_ISSUE_ROWS = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow as tf
    from mxrec._lib import loader
    from mxrec.distributed import sharded_ops
    from mxrec.util import ops

    loader.engine().create_table(key="issue/t", name="t", dim=4, capacity=10)
    lib = loader.op_library()
    ids = tf.constant([1, 2], tf.int64)
    weights = tf.constant([1, 1], tf.int64)
    nothing = np.zeros((0, 2**40), np.float32)
    calls = {
        "key_stage": lambda: ops.key_stage([ids], ["issue/t"], True, weights=[weights] * 2),
        "gather_rows_grad": lambda: lib.mxrec_gather_rows_grad(
            grad=np.zeros((1, 4), np.float32), restore=np.zeros(1, np.int64),
            num_unique=np.int64(2**62)),
        "scatter_rows": lambda: sharded_ops.scatter_rows(
            nothing, np.zeros(0, np.int32), np.zeros(0, np.int32), np.int32(2**31 - 1)),
        "gather_sum_rows": lambda: sharded_ops.gather_sum_rows(
            tf.constant(nothing), np.zeros(0, np.int32), np.zeros(0, np.int32),
            np.int32(2**31 - 1)),
        "pack_send": lambda: sharded_ops.pack_send([tf.constant([[1, 0]], tf.int32)],
                                                   [tf.constant([[7, 2]], tf.int64)],
                                                   tf.constant([1]), 2**62),
        "rows_by_id": lambda: lib.mxrec_rows_by_id(ids=ids, dim=2**62, seed=0,
                                                    distribution="normal", a=0.0, b=1.0),
    }
    for name, call in calls.items():
        try:
            call()
        except tf.errors.OpError as err:
            print(json.dumps([name, type(err).__name__, err.message]), flush=True)
        else:
            print(json.dumps([name, None, ""]), flush=True)
""")
_ISSUE_WANT = {
    "key_stage": "MxrecKeyStage .* 2 weight tensors for 1 ID tensors",
    "gather_rows_grad": rf"MxrecGatherRowsGrad .*num_unique = {2**62}.*more than 2\^63 - 1",
    "scatter_rows": rf"MxrecScatterRows .*rows = {2**31 - 1}.*more than 2\^63 - 1",
    "gather_sum_rows": rf"MxrecGatherSumRows .*owned = {2**31 - 1}.*more than 2\^63 - 1",
    "pack_send": rf"MxrecPackSend .*size = {2**62}.*more than 2\^63 - 1",
    "rows_by_id": rf"MxrecRowsById .*dim = {2**62}.*more than 2\^63 - 1",
}


def test_the_issues_bad_list_and_huge_sizes_are_invalid_arguments():
    """Eagerly, 1 ID tensor with 2 weight tensors to key_stage, and sizes whose product
    with a row's width passes int64 (num_unique = 2**62, rows, owned, size, dim) ended
    the process in a CHECK; each is an InvalidArgumentError naming the op, the input and
    its value now, and the process goes on to the next call."""
    proc = subprocess.run([sys.executable, "-c", _ISSUE_ROWS], env=_env(), capture_output=True,
                          text=True, timeout=_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {name: (error, message) for name, error, message in
           (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))}
    assert set(got) == set(_ISSUE_WANT)
    for name, pattern in _ISSUE_WANT.items():
        error, message = got[name]
        assert error == "InvalidArgumentError" and re.search(pattern, message), (name, got[name])


def test_commit_of_a_batch_never_planned_is_refused_and_changes_nothing(engine, make_session):
    """MxrecCommitBatches of an id no key stage handed out (or a negative one) is an
    InvalidArgumentError naming the table and the ids planned; the table's pending batches
    stay pending (a refused commit of a later id would otherwise retire the next batches
    before their steps run)."""
    key = "test_op_robustness_commit/t"
    engine.create_table(key=key, name="t", dim=4, capacity=16)
    try:
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        _, _, _, planned = mxrec_ops.key_stage([ids], [key], True, deferred=True)
        batch_id = tf.compat.v1.placeholder(tf.int64, [1])
        commit = mxrec_ops.commit_batches(batch_id, [key])
        sess = make_session()
        first = sess.run(planned, {ids: [1, 2]})
        assert first.tolist() == [1] and engine.pending_batches(key) == 1
        for bad, pattern in [(2, "batch 2, .*never planned .it planned batches 1 to 1"),
                             (2**62, f"batch {2**62}, .*never planned"),
                             (-1, r"batch_ids\[0\] = -1")]:
            with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
                sess.run(commit, {batch_id: [bad]})
        second = sess.run(planned, {ids: [3]})
        assert second.tolist() == [2]
        assert engine.pending_batches(key) == 2  # both still wait for their steps
        sess.run(commit, {batch_id: second})
        assert engine.pending_batches(key) == 0
        with pytest.raises(ValueError, match="batch 9, .*never planned"):
            engine.commit(key, 9)
    finally:
        engine.drop_prefix("test_op_robustness_commit/")


def test_an_empty_lookup_gradient_sums_nothing():
    """The gradient op on an empty batch gives the unique rows zeros of the right shape
    (NumPy's reference), for rows no position names too."""
    lib = loader.op_library()
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        grad = lib.mxrec_gather_rows_grad(grad=np.zeros((0, 3), np.float64),
                                          restore=np.zeros(0, np.int32), num_unique=np.int32(4))
        np.testing.assert_array_equal(sess.run(grad), np.zeros((4, 3)))
