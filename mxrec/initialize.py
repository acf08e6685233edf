"""`init()`: configures mxrec for this process and starts what its settings ask for.

`init()` sits on a floor above what it installs: it reads the ranks from the launcher's
environment and starts this rank's server (mxrec.distributed.communication), puts the
behaviour of that many ranks in force (mxrec.distributed.multirank) and then the new
configuration (mxrec.util.config, which the layers below read). Several ranks
(`rank_size > 1`, `use_mpi=True`) train one model sharded across them (`mxrec.distributed`,
docs/MULTIWORKER.md).

mx_rec's scripts import `init` and the configuration's functions from
`mxrec.util.initialize`, which is this module (mxrec.compat); so the configuration's public
names are this module's too.
"""

import dataclasses
import os
import socket
import warnings
from typing import Optional

from mxrec.constants.constants import ENV_KEY_PROCESS_THREAD_NUM as _ENV_THREADS
from mxrec.constants.constants import ENV_USE_COMBINE_FAAE as _ENV_COMBINE_FAAE
from mxrec.distributed import communication, multirank
from mxrec.util import config as _config
from mxrec.util import local_ranks
from mxrec.util.config import (
    ConfigInitializer,
    MxrecConfig,
    TrainParamsConfig,
    clear_channel,
    get_config_initializer,
    get_eval_steps,
    get_host_pipeline_ops,
    get_initializer,
    get_max_steps,
    get_prefetch_batch_number,
    get_rank_id,
    get_rank_size,
    get_save_steps,
    get_train_steps,
    get_training_mode_channel_id,
    get_use_dynamic,
    get_use_dynamic_expansion,
    is_initialized,
    scoped_config_initializer,
    set_if_load,
    terminate_config_initializer,
)
from mxrec.util.log import logger

__all__ = [
    "ConfigInitializer", "MxrecConfig", "TrainParamsConfig", "clear_channel",
    "get_config_initializer", "get_eval_steps", "get_host_pipeline_ops", "get_initializer",
    "get_max_steps", "get_prefetch_batch_number", "get_rank_id", "get_rank_size",
    "get_save_steps", "get_train_steps", "get_training_mode_channel_id", "get_use_dynamic",
    "get_use_dynamic_expansion", "init", "is_initialized", "scoped_config_initializer",
    "set_if_load", "terminate_config_initializer",
]


def _env_int(name: str) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _share_host_cores() -> None:
    """Sizes this rank's thread pools by the ranks on its host (mxrec.util.local_ranks), where
    a launcher says how many there are and the environment does not set a pool already:
    TensorFlow reads its variables when the process's first session is made, so init()
    comes first. A launcher's own settings (mxrec.launch on one host) are kept."""
    sizes = local_ranks.pool_sizes()
    if not sizes:
        return
    os.environ.update(sizes)
    logger.info("%s ranks on host %s share its %d cores: thread pools of %s (%s)",
                local_ranks.local_rank_count() or "several", socket.gethostname(),
                local_ranks.host_cores(), next(iter(sizes.values())), ", ".join(sorted(sizes)))


def init(use_mpi: bool = False, **kwargs) -> ConfigInitializer:
    """Configures mxrec for this process.

    Args:
        use_mpi: the processes were started by `mpirun` or `python -m mxrec.launch`: take
            rank and size from their environment (OMPI_COMM_WORLD_RANK/SIZE or
            MXREC_RANK/MXREC_SIZE); under either launcher that environment wins over
            rank_id/rank_size anyway.
        **kwargs: any field of `MxrecConfig` (mx_rec's names: train_steps, eval_steps,
            save_steps, max_steps, prefetch_batch_number, use_dynamic,
            use_dynamic_expansion, rank_id, rank_size, ...).

    Returns:
        The ConfigInitializer now in force.

    Raises:
        TypeError: an unknown setting, or a value of the wrong type.
        ValueError: a value out of range.
        NotImplementedError: a setting mxrec does not offer (bind_cpu=True, use_lccl=True,
            recent_key_count_threshold > 0).

    Example:
        >>> init(train_steps=100, eval_steps=10, prefetch_batch_number=2)
    """
    known = {f.name for f in dataclasses.fields(MxrecConfig)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(f"init() got unknown setting(s) {unknown}; known: {sorted(known)}")
    _share_host_cores()
    env_threads = _env_int(_ENV_THREADS)
    if env_threads is not None and "key_process_thread_num" not in kwargs:
        kwargs["key_process_thread_num"] = env_threads
    env_faae = _env_int(_ENV_COMBINE_FAAE)
    if env_faae is not None and "use_combine_faae" not in kwargs:
        kwargs["use_combine_faae"] = bool(env_faae)
    rank, size = communication.ranks_from_environment(
        use_mpi, kwargs.get("rank_id", 0), kwargs.get("rank_size", 1))
    kwargs["rank_id"], kwargs["rank_size"] = rank, size
    config = MxrecConfig(use_mpi=use_mpi, **kwargs)
    multirank.setup(config.rank_id, config.rank_size)
    if kwargs.get("use_hot") is True:
        warnings.warn("init(use_hot=True): mxrec has no hot-embedding cache; the hint has no "
                      "effect (every row is read from the table)", UserWarning, stacklevel=2)
    return _config.start(config)
