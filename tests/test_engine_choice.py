"""Which exchange engine a rank and the launcher pick: MXREC_EXCHANGE when set; else MPI
inside an MPI job (launcher: where an mpirun is found) when mxrec's MPI ops were built;
else gRPC (ranks given by MXREC_RANK/MXREC_SIZE/MXREC_CLUSTER, or no MPI)."""

import pathlib

import pytest

from mxrec import launch
from mxrec._lib import loader
from mxrec.distributed import communication

_NAMES = ("MXREC_EXCHANGE", "MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER",
          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


@pytest.fixture
def env(monkeypatch, tmp_path):
    for name in _NAMES:
        monkeypatch.delenv(name, raising=False)
    built = tmp_path / "_mxrec_mpi_ops.so"
    built.write_bytes(b"")
    monkeypatch.setattr(loader, "mpi_op_library_path", lambda: built)
    monkeypatch.setattr(launch, "mpirun_path", lambda: "/usr/bin/mpirun")
    return monkeypatch


def _no_library(monkeypatch, tmp_path):
    monkeypatch.setattr(loader, "mpi_op_library_path",
                        lambda: pathlib.Path(tmp_path) / "absent.so")


@pytest.mark.parametrize("value, want", [("mpi", "mpi"), ("grpc", "grpc"), (" MPI ", "mpi"),
                                         ("GRPC", "grpc")])
def test_explicit_choice_wins(env, value, want):
    env.setenv("MXREC_EXCHANGE", value)
    env.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert communication._engine() == want  # noqa: SLF001
    assert launch.default_engine() == want


def test_a_bad_choice_names_the_setting(env):
    env.setenv("MXREC_EXCHANGE", "nccl")
    with pytest.raises(ValueError, match="MXREC_EXCHANGE must be 'mpi' or 'grpc'"):
        communication._engine()  # noqa: SLF001


@pytest.mark.parametrize("name", ["OMPI_COMM_WORLD_RANK", "PMIX_RANK"])
def test_an_mpi_job_uses_mpi(env, name):
    env.setenv(name, "1")
    assert communication._engine() == "mpi"  # noqa: SLF001


def test_an_mpi_job_without_the_library_uses_grpc(env, tmp_path):
    env.setenv("OMPI_COMM_WORLD_RANK", "1")
    _no_library(env, tmp_path)
    assert communication._engine() == "grpc"  # noqa: SLF001


def test_ranks_given_by_address_use_grpc(env):
    env.setenv("MXREC_RANK", "0")
    env.setenv("MXREC_SIZE", "2")
    env.setenv("MXREC_CLUSTER", "127.0.0.1:1,127.0.0.1:2")
    assert communication._engine() == "grpc"  # noqa: SLF001
    env.setenv("OMPI_COMM_WORLD_RANK", "0")  # addresses given inside an MPI job: still gRPC
    assert communication._engine() == "grpc"  # noqa: SLF001


def test_outside_an_mpi_job_grpc(env):
    assert communication._engine() == "grpc"  # noqa: SLF001


def test_launcher_default(env, tmp_path):
    assert launch.default_engine() == "mpi"
    env.setattr(launch, "mpirun_path", lambda: None)
    assert launch.default_engine() == "grpc"
    env.setattr(launch, "mpirun_path", lambda: "/usr/bin/mpirun")
    _no_library(env, tmp_path)
    assert launch.default_engine() == "grpc"
