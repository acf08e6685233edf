"""Several training processes: ranks, their exchange engine and its collectives.

Two engines. **MPI** (the default under `mpirun` and `python -m mxrec.launch`, which starts
the MPI job itself, where mxrec's MPI ops were built): the exchanges are mxrec's own MPI
ops (`mxrec.distributed.mpi_ops`: variable-size all-to-all and all-reduce as
AsyncOpKernels, every wait bounded by the collective timeout); no server, so a plain
`tf.compat.v1.Session(config=...)` runs them.
**gRPC** (`MXREC_EXCHANGE=grpc`, or ranks given by MXREC_RANK/MXREC_SIZE/MXREC_CLUSTER
without an MPI job): TensorFlow's collective ops, as described below.
MXREC_EXCHANGE=mpi|grpc picks one explicitly.

gRPC engine:

mxrec runs multi-worker training on TensorFlow's own collective ops over its gRPC
runtime (CPU; no NCCL path is built): each rank starts one in-process `tf.distribute.Server` of a
`ClusterSpec` with one task per rank, and its sessions run on that server. Collectives
(`CollectiveAllToAllV2`, and `CollectiveReduce`, see `allreduce`) need, per graph, one
instance key per collective, the same on every rank: ranks must build their graphs in the
same order, which the same script does.

Ranks and addresses come from the launcher:
- `python -m mxrec.launch -n N script.py` sets MXREC_RANK, MXREC_SIZE and MXREC_CLUSTER
  (comma-separated host:port, one per rank);
- `mpirun -n N python script.py` sets OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (as
  mx_rec reads them); the addresses are then gathered with mpi4py (each rank offers a free
  port on its host) unless MXREC_CLUSTER is set.

Every collective has a timeout (MXREC_COLLECTIVE_TIMEOUT seconds, default 300): a rank that
died or never joined ends the others with DeadlineExceededError instead of a hang.

Where the server listens: TensorFlow's gRPC server (2.15 and 2.21 alike) always listens on
every interface, "0.0.0.0:PORT" (gRPC makes it the dual-stack "[::]:PORT"); ServerDef can
change the port, never the address. So where this rank's address in the cluster spec is a
loopback one (the launcher's local ranks), `setup` confines the listening socket to the
loopback interface (SO_BINDTODEVICE) before the server serves: connections from other
hosts are refused, as if the server had bound 127.0.0.1. Other addresses stay reachable on
every interface (docs/MULTIWORKER.md, "What the engines do not protect").
"""

import dataclasses
import functools
import ipaddress
import os
import socket
import weakref
from typing import Dict, List, Optional

import tensorflow as tf

from mxrec.util import env, registry
from mxrec.util.gradients import custom_gradient
from mxrec.util.log import logger

_GROUP_KEY = 7301
DEFAULT_TIMEOUT = 300.0
_ENV_TIMEOUT = "MXREC_COLLECTIVE_TIMEOUT"


@dataclasses.dataclass
class Cluster:
    """This process among the ranks, and its server."""

    rank: int
    size: int
    addresses: List[str]
    server: object = None
    engine: str = "grpc"  # "mpi": mxrec's MPI ops; "grpc": TF collectives on the server

    @property
    def device(self) -> str:
        return f"/job:worker/replica:0/task:{self.rank}"


_CLUSTER: Optional[Cluster] = None
# graph -> next collective instance key
_INSTANCE_KEYS = weakref.WeakKeyDictionary()


def ranks_from_environment(use_mpi: bool, rank_id: int, rank_size: int):
    """(rank, size) from the launcher's environment, else the arguments."""
    for rank_name, size_name in (("MXREC_RANK", "MXREC_SIZE"),
                                 ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_name in os.environ and size_name in os.environ:
            try:
                return int(os.environ[rank_name]), int(os.environ[size_name])
            except ValueError:
                raise ValueError(f"init(): {rank_name}/{size_name} must be integers, got "
                                 f"{os.environ[rank_name]!r}/{os.environ[size_name]!r}") from None
    if use_mpi:
        raise ValueError(
            "init(use_mpi=True): no rank in the environment; launch with "
            "`python -m mxrec.launch -n N script.py` or `mpirun -n N python script.py` (which set "
            "MXREC_RANK/MXREC_SIZE or OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE), or pass "
            "rank_id and rank_size with MXREC_CLUSTER set")
    return rank_id, rank_size


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _addresses(rank: int, size: int) -> List[str]:
    raw = os.environ.get("MXREC_CLUSTER")
    if raw:
        addresses = [a.strip() for a in raw.split(",") if a.strip()]
        if len(addresses) != size:
            raise ValueError(f"MXREC_CLUSTER lists {len(addresses)} addresses for rank_size {size}")
        return addresses
    try:
        from mpi4py import MPI  # noqa: PLC0415 (optional: only under mpirun)
    except ImportError:
        raise ValueError(
            "multi-worker training needs the ranks' addresses: set MXREC_CLUSTER "
            "(host:port per rank, comma-separated), launch with `python -m mxrec.launch`, or "
            "install mpi4py to gather them under mpirun") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != size or comm.Get_rank() != rank:
        raise ValueError(f"mpirun gives rank {comm.Get_rank()} of {comm.Get_size()}, init() "
                         f"rank {rank} of {size}")
    return comm.allgather(f"{socket.gethostname()}:{_free_port()}")


_ENV_ENGINE = "MXREC_EXCHANGE"


def _engine() -> str:
    """"mpi" or "grpc" for this process (engine_choice)."""
    return engine_choice()[0]


def engine_choice():
    """(engine, why, chosen): "mpi" or "grpc" for this process, the reason in words, and
    whether the user chose it. MXREC_EXCHANGE when set; else "mpi" inside an MPI job
    (mpirun, or `python -m mxrec.launch`, which starts one) where mxrec's MPI ops can be
    used; else "grpc" (ranks given by MXREC_RANK/MXREC_SIZE/MXREC_CLUSTER, or no MPI)."""
    choice = os.environ.get(_ENV_ENGINE, "").strip().lower()
    if choice not in ("", "mpi", "grpc"):
        raise ValueError(f"{_ENV_ENGINE} must be 'mpi' or 'grpc', got {choice!r}")
    if choice:
        return choice, f"{_ENV_ENGINE}={choice}", True
    if "MXREC_CLUSTER" in os.environ:
        return "grpc", "MXREC_CLUSTER names the ranks' addresses", True
    if not _in_mpi_job():
        return "grpc", ("the ranks were not started by mpirun (MXREC_RANK/MXREC_SIZE without "
                        f"{_ENV_ENGINE}=mpi)"), False
    from mxrec._lib import loader  # noqa: PLC0415

    missing = loader.mpi_ops_missing()
    if missing is not None:
        return "grpc", missing, False
    return "mpi", "an MPI job, and mxrec's MPI ops are built", False


def _say_engine(rank: int, size: int, engine: str, why: str, chosen: bool) -> None:
    """Rank 0 says once which engine the job's ranks exchange over and why; a warning where
    the MPI engine was wanted but cannot be had here."""
    if rank != 0:
        return
    name = "MPI (mxrec's MPI ops)" if engine == "mpi" else "gRPC (TensorFlow's collectives)"
    if engine == "grpc" and not chosen:
        logger.warning("%d ranks exchange over the %s engine, not MPI: %s. The gRPC engine "
                       "works, more slowly; set %s=grpc to choose it and silence this",
                       size, name, why, _ENV_ENGINE)
    else:
        logger.info("%d ranks exchange over the %s engine: %s", size, name, why)


def _in_mpi_job() -> bool:
    """Whether this process is a rank of an MPI job (Open MPI's or PMIx's environment)."""
    return any(name in os.environ for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"))


def _setup_mpi(rank: int, size: int) -> Cluster:
    from mxrec.distributed import mpi_ops  # noqa: PLC0415 (loads the MPI library)

    mpi_rank, mpi_size = mpi_ops.rank_and_size(timeout_seconds())
    if (mpi_rank, mpi_size) != (rank, size):
        raise ValueError(
            f"init(): rank {rank} of {size}, but the MPI job gives this process rank "
            f"{mpi_rank} of {mpi_size}; start the job with `mpirun -n {size}` or "
            f"`python -m mxrec.launch -n {size}` (or set {_ENV_ENGINE}=grpc with MXREC_CLUSTER)")
    return Cluster(rank=rank, size=size, addresses=[], engine="mpi")


def uses_mpi() -> bool:
    """Whether this process's exchanges are mxrec's MPI ops."""
    return _CLUSTER is not None and _CLUSTER.engine == "mpi"


def session_config(config: Optional[tf.compat.v1.ConfigProto] = None
                   ) -> tf.compat.v1.ConfigProto:
    """`config` (or a new ConfigProto) set up for this rank's collectives."""
    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    if _CLUSTER is not None and _CLUSTER.size > 1 and _CLUSTER.engine == "grpc":
        out.experimental.collective_group_leader = "/job:worker/replica:0/task:0"
        # This rank's session places and runs ops on its own task only.
        del out.device_filters[:]
        out.device_filters.append(_CLUSTER.device)
    return out


def setup(rank: int, size: int) -> Optional[Cluster]:
    """Starts this rank's server (size > 1); called by init()."""
    global _CLUSTER
    if size <= 1:
        _CLUSTER = None
        return None
    if _CLUSTER is not None:
        if (_CLUSTER.rank, _CLUSTER.size) != (rank, size):
            raise ValueError(f"init(): this process is rank {_CLUSTER.rank} of {_CLUSTER.size} "
                             f"already; it cannot become rank {rank} of {size}")
        return _CLUSTER
    engine, why, chosen = engine_choice()
    _say_engine(rank, size, engine, why, chosen)
    if engine == "mpi":
        _CLUSTER = _setup_mpi(rank, size)
        return _CLUSTER
    addresses = _addresses(rank, size)
    cluster = Cluster(rank=rank, size=size, addresses=addresses)
    _CLUSTER = cluster
    cluster.server = _start_server(addresses, rank)
    return cluster


def _start_server(addresses: List[str], rank: int):
    """This rank's server, confined to the loopback interface where its address is loopback.

    The socket listens from the server's construction on; start=False keeps TensorFlow
    from serving requests until the confinement is in place."""
    spec = tf.train.ClusterSpec({"worker": addresses})
    server = tf.distribute.Server(spec, job_name="worker", task_index=rank,
                                  config=session_config(), start=False)
    host, port = split_address(addresses[rank])
    if not is_loopback_host(host):
        logger.info("rank %d: TensorFlow's gRPC server listens on port %d of every interface, "
                    "not only %s; keep the ranks on a private network (docs/MULTIWORKER.md)",
                    rank, port, host)
    elif not confine_to_loopback(port):
        logger.warning("rank %d: the gRPC server for %s listens on every interface (TensorFlow "
                       "binds 0.0.0.0) and could not be confined to loopback; see "
                       "docs/MULTIWORKER.md, \"What the engines do not protect\"",
                       rank, addresses[rank])
    server.start()
    return server


def split_address(address: str):
    """(host, port) of "host:port" or "[v6]:port"."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"MXREC_CLUSTER: {address!r} is no host:port address")
    return host.strip("[]"), int(port)


def is_loopback_host(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(found) and all(
        ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in found)


def _loopback_interface() -> str:
    """The name of the loopback interface ("lo" on Linux)."""
    for name in sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else ():
        try:
            with open(f"/sys/class/net/{name}/type") as f:
                if f.read().strip() == "772":  # ARPHRD_LOOPBACK
                    return name
        except OSError:
            continue
    return "lo"


def _listening_sockets(port: int) -> List[socket.socket]:
    """This process's TCP sockets listening on `port` (duplicates: close them)."""
    found = []
    for entry in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{entry}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(entry)))
        except OSError:
            continue  # closed meanwhile, or not a socket Python can wrap
        try:
            if (sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET,
                                                                    socket.AF_INET6)
                    and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                    and sock.getsockname()[1] == port):
                found.append(sock)
                continue
        except OSError:
            pass
        sock.close()
    return found


def confine_to_loopback(port: int) -> bool:
    """Restricts this process's listening sockets on `port` to the loopback interface.

    SO_BINDTODEVICE on a listening socket makes the kernel match it only for connections
    that arrive on that interface, which from another host none do (nor do connections
    to this host's own non-loopback addresses). A socket already bound to a loopback
    address is left as it is.

    Returns:
        Whether at least one socket listens on `port` and each is loopback-only now; False
        when none is found or the kernel refuses the option (before Linux 5.7 it needs
        CAP_NET_RAW).
    """
    sockets = _listening_sockets(port)
    confined = bool(sockets)
    device = _loopback_interface().encode()
    for sock in sockets:
        try:
            if not ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_loopback:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device)
        except OSError:
            confined = False
        finally:
            sock.close()
    return confined


def cluster() -> Optional[Cluster]:
    """The cluster of this process, or None in single-process training."""
    return _CLUSTER


def get_rank_id() -> int:
    """This process's rank (0 in single-process training)."""
    return 0 if _CLUSTER is None else _CLUSTER.rank


def get_rank_size() -> int:
    """The number of training processes (1 in single-process training)."""
    return 1 if _CLUSTER is None else _CLUSTER.size


registry.provide(registry.RANKS, (get_rank_id, get_rank_size))  # read by mxrec.util.ranks


def session_kwargs(config: Optional[tf.compat.v1.ConfigProto] = None) -> Dict:
    """Keyword arguments for `tf.compat.v1.Session(**kwargs)`: this rank's server as target
    and its collective settings; {} in single-process training (a `config` passes through)."""
    if _CLUSTER is None:
        return {} if config is None else {"config": config}
    if _CLUSTER.engine == "mpi":  # no server: a plain session runs the MPI ops
        return {"config": session_config(config)}
    return {"target": _CLUSTER.server.target, "config": session_config(config)}


def rank_directory(directory: str) -> str:
    """Where this rank writes TF checkpoints: `directory` on rank 0 (and in one process),
    `directory/rank-R` on rank R > 0.

    On several ranks every rank runs TF's Saver (the save of a sharded table gathers the
    ranks' IDs, a collective), and every rank's checkpoint holds the whole model; several
    processes writing one path would corrupt it, so each writes its own. Any of them
    restores on any number of ranks (`mxrec.distributed.sharded_state`). The directory is
    created (TensorFlow 2.21's Saver no longer creates it).
    """
    own = directory if get_rank_id() == 0 else os.path.join(directory, f"rank-{get_rank_id()}")
    tf.io.gfile.makedirs(own)
    return own


def run_config(model_dir: str, **kwargs):
    """A tf.estimator.RunConfig for this rank: its server as the Estimator's master, its
    session config (`session_config`), and `rank_directory(model_dir)` as model_dir.

    Every rank is its own chief (each runs its hooks, saves and restores; no TF_CONFIG
    cluster of Estimator's, whose non-chief workers wait for a chief to initialise their
    variables). Checkpoints are saved by steps: a save is collective, and ranks saving by
    time would save at different steps and wait for each other (save_checkpoints_secs is
    refused). A rank whose directory has no checkpoint, or an older one than rank 0's
    (a restore on more ranks than saved), starts from rank 0's latest checkpoint.

    Args:
        model_dir: the model directory of rank 0 (the same on every rank).
        **kwargs: any other RunConfig argument (session_config is merged with this
            rank's collective settings).

    Example:
        >>> estimator = tf.estimator.Estimator(model_fn, config=run_config(
        ...     "/data/model", save_checkpoints_steps=1000))
    """
    if kwargs.get("save_checkpoints_secs") is not None and get_rank_size() > 1:
        raise ValueError(
            "run_config(): save_checkpoints_secs is refused on several ranks: every rank "
            "saves at once (the save is collective), which a timer cannot promise; use "
            "save_checkpoints_steps")
    if get_rank_size() > 1:
        kwargs.setdefault("save_checkpoints_steps", 1000)  # instead of RunConfig's 600 s
        kwargs["save_checkpoints_secs"] = None
        kwargs["session_config"] = session_config(kwargs.get("session_config"))
        own = rank_directory(model_dir)
        _start_from_rank0(model_dir, own)
        model_dir = own
    config = _rank_run_config_class()(model_dir=model_dir, **kwargs)
    config._mxrec_master = "" if _CLUSTER is None or _CLUSTER.server is None else \
        _CLUSTER.server.target  # noqa: SLF001
    return config


def _start_from_rank0(model_dir: str, own: str) -> None:
    """Points `own`'s checkpoint state at rank 0's latest checkpoint when `own` has none
    or an older one. all_model_checkpoint_paths stays empty: this rank's Saver never
    deletes rank 0's files (max_to_keep)."""
    if own == model_dir:
        return
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
        return
    mine = tf.train.latest_checkpoint(own)
    if mine is not None and _checkpoint_step(mine) >= _checkpoint_step(latest):
        return
    tf.io.gfile.makedirs(own)
    path = os.path.abspath(latest) if "://" not in latest else latest
    with tf.io.gfile.GFile(os.path.join(own, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{path}"\n')


def _checkpoint_step(path: str) -> int:
    tail = path.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


@functools.cache
def _rank_run_config_class():
    from tensorflow_estimator.python.estimator import run_config as estimator_run_config  # noqa: PLC0415

    class RankRunConfig(estimator_run_config.RunConfig):
        """RunConfig whose master is this rank's server."""

        @property
        def master(self):
            return self._mxrec_master

    return RankRunConfig


def timeout_seconds() -> float:
    return env.seconds(_ENV_TIMEOUT, DEFAULT_TIMEOUT)


def _next_instance_key() -> int:
    graph = tf.compat.v1.get_default_graph()
    # A collective built inside a tf.cond / tf.while_loop branch (a FuncGraph) counts in
    # the graph that holds the branch: one sequence of keys per session graph.
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    key = _INSTANCE_KEYS.get(graph, 1)
    _INSTANCE_KEYS[graph] = key + 1
    return key


def _require_cluster(what: str) -> Cluster:
    if _CLUSTER is None:
        raise ValueError(f"{what}: no multi-worker cluster; call init() with rank_size > 1 "
                         "(or under mxrec.launch / mpirun with use_mpi=True) first")
    return _CLUSTER


def allreduce(tensor, reduction: str = "sum") -> tf.Tensor:
    """The element-wise sum (or max/min/mean) of `tensor` over all ranks (mx_rec's
    `hccl_ops.allreduce`); `tensor` itself in single-process training.

    Gradient: none (reduce gradients, not values that need one).
    """
    merge = {"sum": "Add", "mean": "Add", "max": "Max", "min": "Min"}.get(reduction)
    if merge is None:
        raise ValueError(f"allreduce: reduction must be 'sum', 'mean', 'max' or 'min', "
                         f"got {reduction!r}")
    tensor = tf.convert_to_tensor(tensor)
    if _CLUSTER is None:
        return tensor
    if _CLUSTER.engine == "mpi":
        from mxrec.distributed import mpi_ops  # noqa: PLC0415

        # Rank-order reduction: the same bits on every rank. No gradient is promised here
        # (as on the gRPC engine); mpi_ops.allreduce registers one for sum.
        return tf.stop_gradient(mpi_ops.allreduce(tensor, reduction, name="allreduce",
                                                  timeout_seconds=timeout_seconds()))
    # The first-generation CollectiveReduce, not V2, on purpose: the session runtime gives
    # every step that holds V2 collectives only one shared sequence of step ids, but a step
    # with first-generation collectives a sequence of its own, keyed by their instance keys.
    # A step that fails (an iterator's OutOfRangeError) does not advance its sequence, so the
    # next step of that sequence reuses its step id; a peer still finishing the failed step
    # then tears down that reused step's buffers ("Delete called on non-empty
    # BufRendezvous"), which aborts every rank's collectives for good. With one sequence per
    # kind of step (training, evaluation, an initializer: each has its own all-reduces),
    # the step after a failed evaluation is a training step of another sequence, whose
    # collectives wait for every peer; the evaluation's id is reused only after that.
    return tf.raw_ops.CollectiveReduce(
        input=tensor, group_size=_CLUSTER.size, group_key=_GROUP_KEY,
        instance_key=_next_instance_key(), merge_op=merge,
        final_op="Div" if reduction == "mean" else "Id", subdiv_offsets=[0],
        timeout_seconds=timeout_seconds())


# TensorFlow's collectives keep the shape of an instance (one instance key) from its first
# run: a later step with another shape fails. A varying chunk therefore goes through one of a
# fixed ladder of sizes, each with instance keys of its own (every rank picks the same rung:
# the chunk is the same on every rank), padded up to the rung and cut back after.
_LADDER = [64 << k for k in range(19)]  # 64 ... 16,777,216 rows per peer


def _alltoall_fixed(tensor: tf.Tensor, instance_key: int) -> tf.Tensor:
    return tf.raw_ops.CollectiveAllToAllV2(
        input=tensor, group_size=_CLUSTER.size, group_key=_GROUP_KEY,
        instance_key=instance_key, ordering_token=[], timeout_seconds=timeout_seconds())


def _alltoall_laddered(tensor: tf.Tensor, keys: List[int]) -> tf.Tensor:
    """All-to-all of [size, chunk, ...] with a chunk that may change from step to step."""
    chunk = tf.shape(tensor)[1]
    rung = tf.searchsorted(tf.constant(_LADDER, tf.int32), tf.reshape(chunk, [1]))[0]
    check = tf.debugging.assert_less(
        rung, len(_LADDER), message=f"all-to-all: more than {_LADDER[-1]} rows for one peer")
    rest = tensor.shape[2:]
    paddings_tail = [[0, 0]] * len(rest)

    def branch(k):
        def exchange():
            padded = tf.pad(tensor, [[0, 0], [0, _LADDER[k] - chunk]] + paddings_tail)
            padded.set_shape([_CLUSTER.size, _LADDER[k]] + rest.as_list())
            return _alltoall_fixed(padded, keys[k])[:, :chunk]
        return exchange

    with tf.control_dependencies([check]):
        rung = tf.identity(rung)
    out = tf.switch_case(rung, [branch(k) for k in range(len(_LADDER))])
    out.set_shape(tensor.shape)
    return out


def alltoall(tensor: tf.Tensor, grad_scale: Optional[float] = None) -> tf.Tensor:
    """Exchanges equal chunks: `tensor` [size, chunk, ...]; chunk i goes to rank i, and the
    result's chunk j comes from rank j. `chunk` may change from step to step but must be the
    same on every rank in a step.

    Differentiable for float tensors (the backward pass is the same exchange of the
    gradient, scaled by `grad_scale` when given); integer tensors get no gradient.
    """
    _require_cluster("alltoall")
    tensor = tf.convert_to_tensor(tensor)
    if _CLUSTER.engine == "mpi":
        return _alltoall_mpi(tensor, grad_scale)
    # Keys are reserved at build time, in the same order on every rank.
    forward = [_next_instance_key() for _ in _LADDER]
    if not tensor.dtype.is_floating:
        return _alltoall_laddered(tensor, forward)
    backward = [_next_instance_key() for _ in _LADDER]

    @custom_gradient
    def exchange(x):
        def grad(dy):
            g = _alltoall_laddered(dy, backward)
            return g if grad_scale is None else g * grad_scale

        return _alltoall_laddered(x, forward), grad

    return exchange(tensor)


def _scaled_gradient(x: tf.Tensor, scale: float) -> tf.Tensor:
    @tf.custom_gradient
    def identity(v):
        return tf.identity(v), lambda dy: dy * scale

    return identity(x)


def _alltoall_mpi(tensor: tf.Tensor, grad_scale: Optional[float]) -> tf.Tensor:
    """alltoall on the MPI engine: one variable-size exchange with equal counts (no ladder:
    the MPI op takes any size every step); its gradient is the reverse exchange."""
    from mxrec.distributed import mpi_ops  # noqa: PLC0415

    size = _CLUSTER.size
    if tensor.dtype.is_floating and grad_scale is not None:
        tensor = _scaled_gradient(tensor, grad_scale)
    shape = tf.shape(tensor)
    flat = tf.reshape(tensor, tf.concat([[-1], shape[2:]], axis=0))
    counts = tf.fill([size], shape[1])
    received, _ = mpi_ops.alltoallv(flat, counts, name="alltoall",
                                    timeout_seconds=timeout_seconds())
    if not tensor.dtype.is_floating:
        received = tf.stop_gradient(received)
    out = tf.reshape(received, shape)
    out.set_shape(tensor.shape)
    return out
