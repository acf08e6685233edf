"""Settings read from the environment, checked where they are read; mx_rec's global_env."""

import os


def seconds(name: str, default: float, allow_zero: bool = False) -> float:
    """The number of seconds in environment variable `name`, or `default` when it is unset or
    empty. A value that is not a number (NaN included), is negative, or is zero where
    `allow_zero` is False raises ValueError naming the variable and the value; "inf" is
    accepted (no limit)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value != value:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {raw!r}")
    return value


# mx_rec's global_env fields that mxrec reads: {field: (environment variable, default)}.
_GLOBAL_ENV = {
    "mxrec_log_level": ("MXREC_LOG_LEVEL", "INFO"),
    "key_process_thread_num": ("KEY_PROCESS_THREAD_NUM", ""),
    "use_combine_faae": ("USE_COMBINE_FAAE", "0"),
}
_NPU_ENV = "Ascend NPU only"
# The other fields of mx_rec's RecEnv, with why mxrec has no such setting.
_GLOBAL_ENV_ABSENT = {
    "rank_table_file": f"{_NPU_ENV} (the HCCL rank table)",
    "cm_chief_device": f"{_NPU_ENV} (the cluster manager's chief device)",
    "cm_worker_size": f"{_NPU_ENV} (the cluster manager's device count)",
    "tf_device": f"{_NPU_ENV} (mx_rec's choice of device type); TensorFlow places mxrec's ops",
    "acl_timeout": f"{_NPU_ENV} (the ACL runtime's timeout)",
    "hd_channel_size": f"{_NPU_ENV} (the host-to-device channel's depth); the prefetch depth is "
                       "init(prefetch_batch_number)",
    "max_unique_thread_num": "mx_rec's deduplication threads; the key stage's threads are "
                             "KEY_PROCESS_THREAD_NUM",
    "fast_unique": "mx_rec's deduplication switch; mxrec's key stage always deduplicates",
    "hot_emb_update_step": "mx_rec's hot-embedding cache, which mxrec does not have",
    "glog_stderrthreahold": "mx_rec's C++ log level; mxrec's engine reports through Python "
                            "errors and MXREC_LOG_LEVEL",
    "record_key_count": "mx_rec's key counts for its low-frequency delta filter, which mxrec "
                        "does not have (init(recent_key_count_threshold) is refused)",
    "ssd_save_compact_level": "mx_rec's compaction of its SSD files on save; mxrec's SSD tier "
                              "saves through the checkpoint",
}


class GlobalEnv:
    """mx_rec's `mx_rec.util.global_env_conf.global_env`: the environment variables mxrec
    reads, as strings, read when asked (so a value set before init() is the one seen).

    Reading one of mx_rec's other fields is an AttributeError saying why mxrec has no such
    setting; assigning any field is an AttributeError (set the environment variable).
    """

    def __getattr__(self, name: str) -> str:
        if name in _GLOBAL_ENV:
            variable, default = _GLOBAL_ENV[name]
            return os.environ.get(variable, default)
        if name in _GLOBAL_ENV_ABSENT:
            raise AttributeError(f"global_env.{name} is not available on mxrec: "
                                 f"{_GLOBAL_ENV_ABSENT[name]}")
        raise AttributeError(f"global_env has no field {name!r}; mxrec's are "
                             f"{sorted(_GLOBAL_ENV)}")

    def __setattr__(self, name: str, value) -> None:
        if name in _GLOBAL_ENV:
            raise AttributeError(f"global_env.{name} is read from the environment: set "
                                 f"{_GLOBAL_ENV[name][0]} before init()")
        self.__getattr__(name)  # raises, naming why the field is absent


global_env = GlobalEnv()


def get_global_env_conf() -> GlobalEnv:
    """mx_rec's get_global_env_conf(): the environment settings mxrec reads."""
    return global_env
