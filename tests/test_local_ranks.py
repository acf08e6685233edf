"""A rank's thread pools are sized by the ranks on its own host (mxrec.util.local_ranks,
applied by init()), whoever started it: Open MPI's mpirun, a PMIx launcher or mxrec.launch."""

import os

import pytest

from mxrec import initialize
from mxrec.util import local_ranks

_COUNTS = local_ranks.LOCAL_SIZE_VARIABLES
_POOLS = local_ranks.THREAD_VARIABLES


@pytest.fixture
def environ(monkeypatch):
    """No launcher variable and no pool variable from the caller; whatever init() sets in
    os.environ is undone after the test."""
    for name in (*_COUNTS, *_POOLS, local_ranks.ENV_THREADS_PER_RANK):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    return monkeypatch


@pytest.mark.parametrize("variables, count", [
    ({}, None),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),
    ({"PMIX_LOCAL_SIZE": "3"}, 3),
    ({"MXREC_LOCAL_SIZE": "2"}, 2),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PMIX_LOCAL_SIZE": "8"}, 4),  # Open MPI's first
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": " ", "PMIX_LOCAL_SIZE": "8"}, 8),
])
def test_local_rank_count(variables, count):
    assert local_ranks.local_rank_count(variables) == count


@pytest.mark.parametrize("raw", ["two", "0", "-1", "1.5"])
def test_a_bad_count_names_the_variable(raw):
    with pytest.raises(ValueError, match=f"PMIX_LOCAL_SIZE must be an integer >= 1, got '{raw}'"):
        local_ranks.local_rank_count({"PMIX_LOCAL_SIZE": raw})


def test_share_of_the_hosts_cores_not_of_the_job(environ):
    # 8 ranks on 2 hosts of 16 cores: 4 on this host, 4 threads each (not 16 // 8).
    job = {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert local_ranks.threads_per_rank(job) == 4
    assert local_ranks.threads_per_rank({"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}) == 0  # alone
    assert local_ranks.threads_per_rank({"OMPI_COMM_WORLD_LOCAL_SIZE": "32"}) == 1
    assert local_ranks.threads_per_rank({}) == 0  # no launcher: nothing to share
    assert local_ranks.pool_sizes(dict(job, OMP_NUM_THREADS="1")) == {
        "TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "4",
        "KEY_PROCESS_THREAD_NUM": "4"}


def test_the_override(environ):
    job = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert local_ranks.threads_per_rank(dict(job, MXREC_THREADS_PER_RANK="3")) == 3
    assert local_ranks.pool_sizes(dict(job, MXREC_THREADS_PER_RANK="0")) == {}
    assert local_ranks.pool_sizes({"MXREC_THREADS_PER_RANK": "200"})["KEY_PROCESS_THREAD_NUM"] \
        == "64"  # init() takes at most 64 key-stage threads
    with pytest.raises(ValueError, match="MXREC_THREADS_PER_RANK must be an integer >= 0"):
        local_ranks.threads_per_rank({"MXREC_THREADS_PER_RANK": "-2"})


def test_init_sizes_the_pools_by_the_ranks_on_this_host(environ):
    """init() under mpirun (Open MPI's variables, no launcher of mxrec): the pools it sets
    before TensorFlow makes them, the key stage's threads, a pool the user set kept."""
    environ.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    environ.setenv("TF_NUM_INTEROP_THREADS", "2")
    config = initialize.init()
    assert config.config.key_process_thread_num == 4
    assert os.environ["TF_NUM_INTRAOP_THREADS"] == "4"
    assert os.environ["OMP_NUM_THREADS"] == "4"
    assert os.environ["TF_NUM_INTEROP_THREADS"] == "2"
    initialize.terminate_config_initializer()
    assert initialize.init(key_process_thread_num=2).config.key_process_thread_num == 2


def test_init_alone_changes_nothing(environ):
    default = initialize.init().config.key_process_thread_num
    assert default == max(1, min(os.cpu_count() or 1, 6))  # the single process's default
    assert not any(name in os.environ for name in _POOLS)
