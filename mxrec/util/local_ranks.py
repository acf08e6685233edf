"""The ranks that share this host's cores, and each one's share: the sizes of a rank's pools.

Several ranks on one host share its cores; each rank's thread pools (TensorFlow's intra- and
inter-op pools, mxrec's key stage, OpenMP) default to its share, `cores // local ranks` (at
least 1), where `local ranks` counts the ranks of the job on this host, not in the job:
8 ranks on 2 hosts of 16 cores give each rank 4 threads, not 2.

Where the count comes from (the first one set):
- `OMPI_COMM_WORLD_LOCAL_SIZE`: Open MPI's `mpirun` (also under `python -m mxrec.launch`,
  which runs mpirun for the MPI engine, on one host or several);
- `PMIX_LOCAL_SIZE`: a PMIx launcher (PRRTE's `prterun`, Slurm's `srun --mpi=pmix`);
- `MXREC_LOCAL_SIZE`: `python -m mxrec.launch` for the gRPC engine's local ranks.

`MXREC_THREADS_PER_RANK` overrides the share (the launcher's `--threads_per_rank` sets it):
a positive number is every pool's size, 0 leaves TensorFlow's and mxrec's own defaults.
A pool variable already in the environment is left as the user set it.
"""

import os
from typing import Dict, Optional

LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_LOCAL_SIZE", "MXREC_LOCAL_SIZE")
ENV_THREADS_PER_RANK = "MXREC_THREADS_PER_RANK"
# The pools a rank's share sizes: TensorFlow's (read when the process's first session or
# eager context is made), mxrec's key stage (init()), OpenMP's.
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "KEY_PROCESS_THREAD_NUM",
                    "OMP_NUM_THREADS")
# init() refuses a key stage of more threads (mxrec.util.config); a larger share is capped.
_KEY_STAGE_MAX = 64


def _positive_int(name: str, raw: str, allow_zero: bool = False) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"environment variable {name} must be an integer >= "
                         f"{0 if allow_zero else 1}, got {raw!r}")
    return value


def local_rank_count(environ: Optional[Dict[str, str]] = None) -> Optional[int]:
    """The ranks of this job on this host, from the launcher's environment; None when no
    launcher said (one process, or ranks given by MXREC_RANK/MXREC_SIZE alone)."""
    environ = os.environ if environ is None else environ
    for name in LOCAL_SIZE_VARIABLES:
        raw = environ.get(name, "").strip()
        if raw:
            return _positive_int(name, raw)
    return None


def host_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's cpuset or
    `taskset` narrows), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share_of_cores(local_ranks: int, cores: Optional[int] = None) -> int:
    """Each of `local_ranks` ranks' share of the cores, at least 1; 0 for a rank alone on its
    host (nothing to share: the pools keep their own defaults)."""
    if local_ranks <= 1:
        return 0
    return max(1, (host_cores() if cores is None else cores) // local_ranks)


def threads_per_rank(environ: Optional[Dict[str, str]] = None) -> int:
    """This rank's pool size: MXREC_THREADS_PER_RANK when set, else its share of the cores
    among the ranks on its host (0: leave every pool's default)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_THREADS_PER_RANK, "").strip()
    if raw:
        return _positive_int(ENV_THREADS_PER_RANK, raw, allow_zero=True)
    count = local_rank_count(environ)
    return 0 if count is None else share_of_cores(count)


def pool_sizes(environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """{variable: size} of the pool variables this rank should set: its share for each of
    THREAD_VARIABLES the environment does not set already ({} when the share is 0).

    Example (on a host of 16 cores):
        >>> sorted(pool_sizes({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMP_NUM_THREADS": "1"}).items())
        [('KEY_PROCESS_THREAD_NUM', '4'), ('TF_NUM_INTEROP_THREADS', '4'),
         ('TF_NUM_INTRAOP_THREADS', '4')]
    """
    environ = os.environ if environ is None else environ
    return unset_pools(environ, threads_per_rank(environ))


def unset_pools(environ: Dict[str, str], threads: int) -> Dict[str, str]:
    """{variable: size} for each of THREAD_VARIABLES not set in `environ`, at `threads`
    (the key stage at most 64); {} for `threads` 0."""
    if threads <= 0:
        return {}
    return {name: str(min(threads, _KEY_STAGE_MAX) if name == "KEY_PROCESS_THREAD_NUM"
                      else threads)
            for name in THREAD_VARIABLES if not environ.get(name, "").strip()}
