"""A table larger than its processes' memory limit: trained, saved (full and delta), restored
into a new process, resharded onto 2 ranks and exported (SavedModel), inside a memory
cgroup (cgroup v1, as a pod's limit holds a trainer; page cache counted), never killed for
memory, every value equal to Adagrad's closed form.

3 M IDs x dim 128 with Adagrad (2.9 GiB of rows and slots: device cache and host tier of
128 Ki rows per rank each, the rest on the SSD tier) in a cgroup of 1.5 GiB (2.25 GiB for
the two ranks together, each with its own TensorFlow). The phases run in
`big_table_worker.py`, which joins the cgroup before it builds anything; the saved chain
is also checked here, outside the cgroup, file by file against the closed form.

Skipped where the memory cgroup is not writable (not root, cgroup v2 only) or the disk
lacks room for the checkpoint and the SSD files (about 8 GiB).
"""

import os
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest

from mxrec.saver import fold, stream

# It starts processes of its own; its subject (how much memory a checkpoint takes) does not
# change with the TensorFlow version. Serial: beside other tests its disk traffic (its table is
# twice its memory limit) slowed every test that writes files about 2x (measured in CI).
pytestmark = [pytest.mark.serial, pytest.mark.one_tf]

CGROUPS = "/sys/fs/cgroup/memory"
LIMIT = 1536 << 20
LIMIT_TWO_RANKS = 2304 << 20
IDS = 3_000_000
DIM = 128
LR, ACC0, INIT = 0.1, 0.9, 0.01
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "big_table_worker.py")
DISK_NEEDED = 12 << 30


def _weight(keys):
    return ((keys * 2654435761) % 1000003).astype(np.float64) / 1000003 + 0.5


@pytest.fixture
def cgroup():
    if not os.access(CGROUPS, os.W_OK) or not os.path.exists(
            os.path.join(CGROUPS, "memory.limit_in_bytes")):
        pytest.skip(f"needs a writable cgroup v1 memory controller at {CGROUPS} (root)")
    path = os.path.join(CGROUPS, f"mxrec-big-table-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    try:
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(str(LIMIT))
        yield path
    finally:
        os.rmdir(path)  # its processes are gone: the worker runs to its end


def _oom_kills(path):
    with open(os.path.join(path, "memory.oom_control")) as f:
        fields = dict(line.split() for line in f)
    return int(fields.get("oom_kill", 0))


def _run(path, ckpt, ssd, phase, ranks=1):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.path.dirname(os.path.dirname(WORKER)))
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER"):
        env.pop(name, None)
    command = [WORKER, path, ckpt, ssd, str(IDS), phase]
    if ranks > 1:
        command = ["-m", "mxrec.launch", "-n", str(ranks)] + command
    done = subprocess.run([sys.executable] + command, env=env, capture_output=True, text=True,
                          timeout=400)
    assert _oom_kills(path) == 0, f"{phase}: killed for memory\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"{phase}: exit {done.returncode}\n{done.stderr[-3000:]}"
    lines = [line for line in done.stdout.splitlines() if "OK " in line]
    assert len(lines) == ranks, done.stdout[-3000:]
    return " ".join(lines)


def _check_saved_chain(ckpt):
    """The chain's files against the closed form: every ID's embedding and accumulator
    after one update (two for the IDs divisible by 3), read a chunk at a time."""
    copies = stream.LocalCopies()
    try:
        folded = fold.whole_table(fold.open_chain(ckpt, None, copies), "big")
        np.testing.assert_array_equal(np.sort(folded.keys), np.arange(IDS))
        for begin in range(0, IDS, 1 << 18):
            positions = np.arange(begin, min(IDS, begin + (1 << 18)))
            value, acc = _closed_form(folded.keys[positions])
            emb, held = folded.values(positions, "embedding", DIM)
            slot, slot_held = folded.values(positions, "Adagrad/accumulator", DIM)
            assert held.all() and slot_held.all()
            np.testing.assert_allclose(emb, np.broadcast_to(value[:, None], emb.shape),
                                       atol=2e-5)
            np.testing.assert_allclose(slot, np.broadcast_to(acc[:, None], slot.shape),
                                       rtol=1e-5)
    finally:
        copies.close()


def _closed_form(keys):
    """(embedding, accumulator) after one update of every ID, two of those divisible by 3."""
    w = _weight(keys)
    twice = keys % 3 == 0
    acc1 = ACC0 + w * w
    value = INIT - LR * w / np.sqrt(acc1)
    acc = np.where(twice, acc1 + w * w, acc1)
    return np.where(twice, value - LR * w / np.sqrt(acc), value), acc


def _check_export(export_dir):
    """The SavedModel's table (IDs, then embeddings read in slices) against the closed form."""
    import tensorflow as tf

    prefix = os.path.join(export_dir, "variables", "variables")
    name = "mxrec_serving/big/"
    reader = tf.train.load_checkpoint(prefix)
    keys = reader.get_tensor(name + "ids")
    np.testing.assert_array_equal(keys, np.arange(IDS))
    assert reader.get_variable_to_shape_map()[name + "embeddings"] == [IDS + 1, DIM]
    graph = tf.Graph()
    with graph.as_default():
        spec = tf.compat.v1.placeholder(tf.string, [])
        read = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name + "embeddings"],
                                    shape_and_slices=tf.reshape(spec, [1]),
                                    dtypes=[tf.float32])[0]
        with tf.compat.v1.Session(graph=graph) as sess:
            for begin in range(0, IDS + 1, 1 << 18):
                count = min(IDS + 1, begin + (1 << 18)) - begin
                got = sess.run(read, {spec: f"{IDS + 1} {DIM} {begin},{count}:-"})
                want = np.zeros([count], np.float64)
                real = min(count, IDS - begin)  # the last row is the zero row
                want[:real] = _closed_form(keys[begin:begin + real])[0]
                np.testing.assert_allclose(got, np.broadcast_to(want[:, None], got.shape),
                                           atol=2e-5)


def test_a_table_larger_than_the_memory_limit_trains_saves_restores_and_exports(cgroup,
                                                                              tmp_path):
    assert IDS * DIM * 4 * 2 > 1.8 * LIMIT  # rows and Adagrad slots: far beyond the limit
    if shutil.disk_usage(tmp_path).free < DISK_NEEDED:
        pytest.skip(f"needs {DISK_NEEDED >> 30} GiB free under {tmp_path}")
    ckpt = str(tmp_path / "ckpt")
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    trained = _run(cgroup, ckpt, str(ssd), "train")
    shutil.rmtree(ssd)  # each phase's SSD file: the disk the next one needs
    ssd.mkdir()
    restored = _run(cgroup, ckpt, str(ssd), "restore")
    shutil.rmtree(ssd)
    ssd.mkdir()
    with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as f:
        f.write(str(LIMIT_TWO_RANKS))
    assert IDS * DIM * 4 * 2 > LIMIT_TWO_RANKS
    resharded = _run(cgroup, ckpt, str(ssd), "restore", ranks=2)
    with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as f:
        f.write(str(LIMIT))
    exported = _run(cgroup, ckpt, str(ssd), "export")
    print(trained, "|", restored, "|", resharded, "|", exported)
    _check_saved_chain(ckpt)
    _check_export(str(tmp_path / "export"))
