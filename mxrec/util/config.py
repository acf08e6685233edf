"""The configuration in force: what `init()` (mxrec.initialize) set up, read by every layer.

`MxrecConfig` holds one init()'s settings, checked; `ConfigInitializer` is what that init()
set up (the settings, the host tables created under it); `get_config_initializer()` answers
which one is in force. The parameter names follow mx_rec's `init`. Every setting either
takes effect, or is refused with NotImplementedError naming it (core binding, ...);
`use_hot`, which mx_rec documents as a placement hint, only warns. docs/MX_REC_COMPAT.md
lists each setting.

`init()` itself is a floor above: it starts what the settings ask for (this rank's server,
the wing's behaviour on several ranks) and then puts its ConfigInitializer in force here
(`start`).
"""

import contextlib
import dataclasses
import itertools
import os
from typing import Dict, List, Optional

import tensorflow as tf

from mxrec._lib import loader
from mxrec.constants.constants import ENV_KEY_PROCESS_THREAD_NUM as _ENV_THREADS
from mxrec.constants.constants import EVAL_CHANNEL_ID, SPARSE_TABLE_COLLECTION, TRAIN_CHANNEL_ID
from mxrec.util import eos as _eos  # noqa: F401 (adds mx_rec's Dataset.eos_map)
from mxrec.util import ops as _ops
from mxrec.util import registry

_MAX_THREADS = 64


def _default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 6))


@dataclasses.dataclass
class MxrecConfig:
    """Typed settings of one `init()`.

    Attributes:
        use_mpi: the processes were started by a launcher (`mpirun` or `python -m
            mxrec.launch`): rank and size come from its environment.
        rank_id: this process's rank in [0, rank_size).
        rank_size: number of training processes; > 1 shards every table across them
            (mxrec.distributed).
        train_steps: steps of one training round before evaluation; -1 = until the data ends.
        eval_steps: steps of one evaluation round; -1 = until the data ends.
        save_steps: steps between checkpoints; -1 = never by step.
        max_steps: total training steps; -1 = no limit.
        prefetch_batch_number: batches the host key stage runs ahead of the step (0 = in step).
        use_dynamic: dynamic shapes; False pads unique rows to `send_count` per lookup.
        use_hot: hot-embedding placement hint; mxrec has no hot-embedding cache, so True
            (mx_rec's default) only warns when given explicitly.
        use_dynamic_expansion: device storage that grows with the table, updated by address.
        if_load: whether the script should load a checkpoint at start; a flag for the
            script to read (`ConfigInitializer.if_load`), as in mx_rec.
        bind_cpu: pin processes to the cores near their device; not available (mxrec
            does not bind), so only False.
        is_incremental_checkpoint: full saves every `save_checkpoint_due_time` seconds and
            delta saves every `save_delta_checkpoints_secs` seconds.
        save_checkpoint_due_time: seconds between full saves in incremental mode.
        save_delta_checkpoints_secs: seconds between delta saves in incremental mode.
        restore_model_version: step of the checkpoint to restore; None = latest.
        key_process_thread_num: threads of the host key stage (env KEY_PROCESS_THREAD_NUM).
        use_combine_faae: count admission across tables together (env USE_COMBINE_FAAE).
        recent_key_count_threshold: mx_rec's low-frequency filter of delta saves; only 0
            (no filter) is available.
        use_lccl: mx_rec's low-latency collectives for multi-device runs; only False.
    """

    use_mpi: bool = False
    rank_id: int = 0
    rank_size: int = 1
    train_steps: int = -1
    eval_steps: int = -1
    save_steps: int = -1
    max_steps: int = -1
    prefetch_batch_number: int = 1
    use_dynamic: bool = True
    use_hot: bool = False
    use_dynamic_expansion: bool = False
    if_load: bool = False
    bind_cpu: bool = False
    is_incremental_checkpoint: bool = False
    save_checkpoint_due_time: int = 0
    save_delta_checkpoints_secs: int = 0
    restore_model_version: Optional[int] = None
    key_process_thread_num: int = dataclasses.field(default_factory=_default_threads)
    use_combine_faae: bool = False
    recent_key_count_threshold: int = 0
    use_lccl: bool = False

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type is bool or field.type == "bool":
                if not isinstance(value, bool):
                    raise TypeError(f"init(): {field.name} must be a bool, got {value!r}")
            elif field.name == "restore_model_version":
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    raise TypeError(f"init(): restore_model_version must be an int, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"init(): {field.name} must be an int, got {value!r}")
        if self.rank_size < 1:
            raise ValueError(f"init(): rank_size must be >= 1, got {self.rank_size}")
        if not 0 <= self.rank_id < self.rank_size:
            raise ValueError(
                f"init(): rank_id must be in [0, rank_size={self.rank_size}), got {self.rank_id}"
            )
        if self.bind_cpu:
            raise NotImplementedError(
                "init(bind_cpu=True): binding processes to the cores of their device is not "
                "available; the key stage's threads run wherever the OS puts them "
                "(KEY_PROCESS_THREAD_NUM sets how many). Pass bind_cpu=False or leave it out")
        if self.use_lccl:
            raise NotImplementedError(
                "init(use_lccl=True): LCCL collectives speed up multi-device runs, which mxrec "
                "does not have; leave use_lccl out")
        if self.recent_key_count_threshold < 0:
            raise ValueError("init(): recent_key_count_threshold must be >= 0, got "
                             f"{self.recent_key_count_threshold}")
        if self.recent_key_count_threshold > 0:
            raise NotImplementedError(
                f"init(recent_key_count_threshold={self.recent_key_count_threshold}): filtering "
                "rarely seen IDs out of delta checkpoints is not available; a delta holds every "
                "ID changed since the previous save")
        for name in ("train_steps", "eval_steps", "save_steps", "max_steps"):
            value = getattr(self, name)
            if value == 0 or value < -1:
                raise ValueError(f"init(): {name} must be a positive count or -1, got {value}")
        if not 0 <= self.prefetch_batch_number <= 64:
            raise ValueError(
                "init(): prefetch_batch_number must be in [0, 64], got "
                f"{self.prefetch_batch_number}"
            )
        if not 1 <= self.key_process_thread_num <= _MAX_THREADS:
            raise ValueError(
                f"init(): key_process_thread_num ({_ENV_THREADS}) must be in "
                f"[1, {_MAX_THREADS}], got {self.key_process_thread_num}"
            )
        for name in ("save_checkpoint_due_time", "save_delta_checkpoints_secs"):
            if getattr(self, name) < 0:
                raise ValueError(f"init(): {name} must be >= 0, got {getattr(self, name)}")
        if self.is_incremental_checkpoint and self.save_delta_checkpoints_secs <= 0:
            raise ValueError(
                "init(): is_incremental_checkpoint=True needs save_delta_checkpoints_secs > 0"
            )


class ConfigInitializer:
    """What one `init()` set up: the configuration and the tables created under it.

    Tables are registered in the host engine under `<prefix>/<table name>`, the
    prefix unique to this initializer, so that a later `init()` in the same
    process starts from empty tables.
    """

    _serial = itertools.count()

    @staticmethod
    def get_instance() -> "ConfigInitializer":
        """The ConfigInitializer in force (mx_rec's spelling of get_config_initializer())."""
        return get_config_initializer()

    @property
    def if_load(self) -> bool:
        """The `if_load` given to init() or set_if_load(): whether the script loads a model."""
        return self.config.if_load

    @if_load.setter
    def if_load(self, value: bool) -> None:
        """mx_rec's `ConfigInitializer.get_instance().if_load = found_checkpoint`: the same
        flag as set_if_load (checked to be a bool). mxrec restores through any TF Saver's
        restore(), whatever the flag says; scripts read it to decide whether to call one."""
        if not isinstance(value, bool):
            raise TypeError(f"ConfigInitializer.if_load must be a bool, got {value!r}")
        self.config.if_load = value

    @property
    def use_dynamic(self) -> bool:
        return self.config.use_dynamic

    @property
    def use_static(self) -> bool:
        """mx_rec's name for init(use_dynamic=False)."""
        return not self.config.use_dynamic

    @property
    def use_dynamic_expansion(self) -> bool:
        return self.config.use_dynamic_expansion

    @property
    def host_pipeline_ops(self) -> "_ops.HostPipelineOps":
        """mx_rec's object of host ops (set_threshold, return_timestamp, clear_channel)."""
        return _ops.import_host_pipeline_ops()

    @property
    def train_params_config(self) -> "TrainParamsConfig":
        """mx_rec's training parameters: get_initializer, get_training_mode_channel_id,
        get_target_batch (one object per init(), as in mx_rec)."""
        return self._sub_configs["train_params_config"]

    @train_params_config.setter
    def train_params_config(self, value: "TrainParamsConfig") -> None:
        self._set_sub_config("train_params_config", TrainParamsConfig, value)

    @property
    def optimizer_config(self) -> "OptimizerConfig":
        """mx_rec's record of the sparse optimizer a script created (`optimizer_instance`),
        which RecSDK's later optimizers set in their create_hash_optimizer."""
        return self._sub_configs["optimizer_config"]

    @optimizer_config.setter
    def optimizer_config(self, value: "OptimizerConfig") -> None:
        self._set_sub_config("optimizer_config", OptimizerConfig, value)

    @property
    def sparse_embed_config(self) -> "SparseEmbedConfig":
        """mx_rec's registry of the tables created under this init() (read-only here)."""
        return self._sub_configs["sparse_embed_config"]

    @sparse_embed_config.setter
    def sparse_embed_config(self, value: "SparseEmbedConfig") -> None:
        self._set_sub_config("sparse_embed_config", SparseEmbedConfig, value)

    def _set_sub_config(self, name: str, kind: type, value) -> None:
        """mx_rec's scripts and tests replace a sub-config with a fresh one of its class; one
        made for another init() keeps that init()'s state, so it is refused too."""
        if not isinstance(value, kind):
            raise TypeError(f"ConfigInitializer.{name} must be a {kind.__name__}, got "
                            f"{type(value).__name__}")
        value.attach(self)
        self._sub_configs[name] = value

    def __getattr__(self, name: str):
        # Only reached for attributes ConfigInitializer does not have.
        reason = _REFUSED_SUB_CONFIGS.get(name)
        if reason is not None:
            raise AttributeError(f"ConfigInitializer.{name} is not available: {reason}")
        raise AttributeError(f"ConfigInitializer has no attribute {name!r}")

    # The attributes __init__ sets; with the properties that have setters, the only ones
    # that may be assigned (see __setattr__).
    _ATTRIBUTES = frozenset({
        "config", "prefix", "tables", "admission_configs", "shared_key_stage_chain",
        "train_iterator_initializers", "lookup_modes", "eval_iterator_initializers",
        "_sub_configs"})

    def __setattr__(self, name: str, value) -> None:
        """Refuses attributes ConfigInitializer does not have. mx_rec scripts assign some
        (`max_steps`, `train_steps`, `modify_graph`, ...) that mx_rec reads nowhere either;
        a new attribute would silently do nothing, so it is an AttributeError naming it."""
        prop = getattr(type(self), name, None)
        if isinstance(prop, property):
            if prop.fset is None:
                raise AttributeError(
                    f"ConfigInitializer.{name} is read-only: it comes from init({name}=...) "
                    "(or is derived from the settings of init())")
            prop.fset(self, value)
            return
        if name not in self._ATTRIBUTES:
            settings = sorted(f.name for f in dataclasses.fields(MxrecConfig))
            hint = (f"; {name} is a setting of init({name}=...)" if name in settings else
                    "; mxrec's settings are the parameters of init(): " + ", ".join(settings))
            raise AttributeError(
                f"ConfigInitializer has no attribute {name!r}: assigning it would change "
                f"nothing{hint}")
        object.__setattr__(self, name, value)

    def __init__(self, config: MxrecConfig):
        self.config = config
        self.prefix = f"mxrec{os.getpid()}_{next(self._serial)}"
        self.tables: Dict[str, object] = {}
        self.admission_configs: Dict[str, Dict] = {}
        self.shared_key_stage_chain: Dict = {}
        self.train_iterator_initializers: List[object] = []
        # is_train of the lookups built under this init() (mx_rec's channels in use).
        self.lookup_modes = set()
        self.eval_iterator_initializers: List[object] = []
        self._sub_configs = {}
        for name, kind in (("train_params_config", TrainParamsConfig),
                           ("optimizer_config", OptimizerConfig),
                           ("sparse_embed_config", SparseEmbedConfig)):
            self._set_sub_config(name, kind, kind())
        loader.engine().set_num_threads(config.key_process_thread_num)

    def table_key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def close(self):
        engine = loader.engine()
        engine.drop_prefix(self.prefix + "/")
        engine.drop_dynamic_stores(self.prefix + "/")
        self.tables.clear()
        self.admission_configs.clear()
        self.shared_key_stage_chain.clear()


class _SubConfig:
    """One of mx_rec's sub-configs of ConfigInitializer. mx_rec's library writes most of
    their attributes as it builds its pipeline; the ones mxrec has no counterpart for are
    refused by name, read or assigned (`_REFUSED`), never accepted and dropped."""

    _REFUSED: Dict[str, str] = {}

    def __init__(self):
        object.__setattr__(self, "_runtime", None)

    def attach(self, runtime: "ConfigInitializer") -> None:
        """Binds this sub-config to the init() whose state it answers (once)."""
        if self._runtime is not None and self._runtime is not runtime:
            raise ValueError(f"this {type(self).__name__} belongs to another init(); assign "
                             f"a new {type(self).__name__}()")
        object.__setattr__(self, "_runtime", runtime)

    def _refusal(self, name: str) -> str:
        reason = self._REFUSED.get(name)
        what = f"{type(self).__name__}.{name}"
        if reason is None:
            return f"{what}: mx_rec's {type(self).__name__} has no such attribute"
        return f"{what} is not available on mxrec: {reason}"

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(self._refusal(name))

    def __setattr__(self, name: str, value) -> None:
        prop = getattr(type(self), name, None)
        if isinstance(prop, property) and prop.fset is not None:
            prop.fset(self, value)
            return
        if isinstance(prop, property):
            raise AttributeError(f"{type(self).__name__}.{name} is read-only on mxrec: "
                                 f"{self._REFUSED.get(name, 'it is derived from mxrec state')}")
        raise AttributeError(self._refusal(name))


_MODIFIER_STATE = ("state of mx_rec's own graph modifier and pipeline, which mxrec's graph "
                   "modifier keeps in the graph it rewrites")


class TrainParamsConfig(_SubConfig):
    """mx_rec's `ConfigInitializer.get_instance().train_params_config`.

    Works: `get_initializer`, `get_target_batch` (answered by the rewritten graph),
    `get_training_mode_channel_id` / `insert_training_mode_channel_id` (the channels whose
    lookups exist), `ascend_global_hashtable_collection` (read). mx_rec's pipeline state
    (`iterator_type`, `is_last_round`, `sparse_dir`, ...) is refused by name.
    """

    _REFUSED = {
        **{name: _MODIFIER_STATE for name in (
            "iterator_type", "is_last_round", "is_graph_modify_hook_running", "sparse_dir",
            "dataset_element_spec", "experimental_mode", "bool_gauge_set",
            "insert_bool_gauge", "insert_merged_multi_lookup", "get_merged_multi_lookup")},
        "set_target_batch": "get_target_batch answers from the graph the modifier rewrote "
                            "(the `batch=` given to the lookups), so it cannot be set",
        "set_initializer": "get_initializer answers the rewritten iterators' initializer, so "
                           "it cannot be set",
        "ascend_global_hashtable_collection": "mxrec puts every table variable in one "
                                              "collection, mxrec.ASCEND_GLOBAL_HASHTABLE_"
                                              "COLLECTION; another name cannot be chosen",
    }

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "_modes", set())

    def attach(self, runtime: "ConfigInitializer") -> None:
        super().attach(runtime)
        runtime.lookup_modes |= self._modes
        object.__setattr__(self, "_modes", runtime.lookup_modes)

    @property
    def ascend_global_hashtable_collection(self) -> str:
        """The graph collection of the tables' variables (mx_rec's value differs: the name is
        mxrec's own, `mxrec.ASCEND_GLOBAL_HASHTABLE_COLLECTION`)."""
        return SPARSE_TABLE_COLLECTION

    @staticmethod
    def get_initializer(is_training: bool):
        """See `get_initializer` (the rewritten iterators' initializer)."""
        return get_initializer(is_training)

    @staticmethod
    def get_target_batch(is_training: bool):
        """mx_rec's batch of the rewritten training (True) or evaluation (False) iterator:
        the `batch=` given to that mode's `sparse_lookup(..., modify_graph=True)`, each of
        its tensors swapped for the new iterator's output that replaced it (fetch these, not
        the old batch, after `modify_graph_and_start_emb_cache()`).

        Raises:
            TypeError: is_training is not a bool.
            RuntimeError: the graph was not rewritten, or no lookup of that mode was given
                `batch=`.
        """
        if not isinstance(is_training, bool):
            raise TypeError(f"get_target_batch: is_training must be a bool, got {is_training!r}")
        provider = registry.provided(registry.TARGET_BATCH)
        if provider is None:
            raise RuntimeError(
                "get_target_batch: the graph has no rewritten iterator; call "
                "modify_graph_and_start_emb_cache() (mxrec.graph.modifier) after building the "
                "model with sparse_lookup(..., modify_graph=True, batch=batch)")
        return provider(is_training)

    def insert_training_mode_channel_id(self, is_training: bool) -> None:
        """Marks the channel of training (True) or evaluation (False) as in use, as building
        a lookup of that mode does."""
        if not isinstance(is_training, bool):
            raise TypeError(f"insert_training_mode_channel_id: is_training must be a bool, "
                            f"got {is_training!r}")
        self._modes.add(is_training)

    def get_training_mode_channel_id(self, is_training: bool) -> Optional[int]:
        """0 (training) or 1 (evaluation) once a lookup of that mode was built under this
        init(), else None, as in mx_rec."""
        if not isinstance(is_training, bool):
            raise TypeError(f"get_training_mode_channel_id: is_training must be a bool, got "
                            f"{is_training!r}")
        if is_training not in self._modes:
            return None
        return TRAIN_CHANNEL_ID if is_training else EVAL_CHANNEL_ID


class OptimizerConfig(_SubConfig):
    """mx_rec's `ConfigInitializer.get_instance().optimizer_config`: the sparse optimizer a
    script's `create_hash_optimizer` made. mx_rec sizes its host slots from it; mxrec finds
    each table's optimizer when that optimizer applies, so the record is only read back."""

    _REFUSED = {name: "mx_rec's slot bookkeeping; mxrec's slots are TF slot variables that "
                      "the optimizer makes when it first applies (optimizer.get_slot)"
                for name in ("set_optimizer_for_table", "get_optimizer_by_table_name")}

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "_instance", None)

    @property
    def optimizer_instance(self):
        """The optimizer assigned last (None before any)."""
        return self._instance

    @optimizer_instance.setter
    def optimizer_instance(self, optimizer) -> None:
        if optimizer is not None and not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise TypeError("optimizer_config.optimizer_instance must be a "
                            "tf.compat.v1.train.Optimizer (a hash optimizer) or None, got "
                            f"{type(optimizer).__name__}")
        object.__setattr__(self, "_instance", optimizer)

    @property
    def optim_params_list(self) -> List[str]:
        """The optimizer's slot names (its `optim_param_list` where it has one, else the
        slots TF made so far); [] without an optimizer."""
        if self._instance is None:
            return []
        names = getattr(self._instance, "optim_param_list", None)
        return list(names if names is not None else self._instance.get_slot_names())


class SparseEmbedConfig(_SubConfig):
    """mx_rec's `ConfigInitializer.get_instance().sparse_embed_config`: the tables created
    under this init(), read-only (create_table registers them)."""

    _REFUSED = {name: "tables are registered by create_table; mx_rec's library writes this"
                for name in ("insert_table_instance", "insert_dangling_table",
                             "insert_removing_var_list", "dangling_table", "removing_var_list",
                             "name_to_var_dict", "insert_table_instance_to_tensor_dict")}

    @property
    def table_instance_dict(self) -> Dict[str, object]:
        """{table name: table} (a copy)."""
        return dict(self._runtime.tables) if self._runtime is not None else {}

    @property
    def table_name_set(self) -> set:
        return set(self.table_instance_dict)

    def get_table_instance_by_name(self, name: str):
        """The table named `name`; None when there is none (as mx_rec)."""
        return self.table_instance_dict.get(name)

    def get_table_instance(self, var):
        """The table whose device variable is `var`.

        Raises:
            KeyError: `var` is not a table's variable.
        """
        table = getattr(var, "_mxrec_table", None)
        if table is None or table not in self.table_instance_dict.values():
            raise KeyError(f"{getattr(var, 'name', var)!r} is not the variable of a table of "
                           "this init()")
        return table


_HYBRID = ("mx_rec's manager of its C++ host pipeline (mxrec_pybind.HybridMgmt, set up on "
           "the NPU's host); mxrec's key stage runs inside the dataset's map and its tables "
           "save and restore through TF savers, so there is no manager object")
# Sub-configs of mx_rec's ConfigInitializer that mxrec does not have: {name: why}.
_REFUSED_SUB_CONFIGS: Dict[str, str] = {
    "hybrid_manager_config": _HYBRID,
    "feature_spec_config": "mx_rec's registry of FeatureSpecs, written by its library; "
                           "mxrec keeps each FeatureSpec's plan with the FeatureSpec itself",
}


_current: Optional[ConfigInitializer] = None


def start(config: MxrecConfig) -> ConfigInitializer:
    """Puts a new ConfigInitializer of `config` in force, closing the one before (its host
    tables dropped); `init()` calls it once it has started what `config` asks for."""
    global _current
    if _current is not None:
        _current.close()
    _current = ConfigInitializer(config)
    return _current


def terminate_config_initializer() -> None:
    """Releases what `init()` set up: the host tables and the configuration."""
    global _current
    if _current is not None:
        _current.close()
        _current = None


@contextlib.contextmanager
def scoped_config_initializer(config: Optional[MxrecConfig] = None):
    """A ConfigInitializer in force for a block only, with host tables of its own.

    The one in force before (if any) is back in force afterwards, its tables
    untouched; serving export builds the model again under one of these.
    """
    global _current
    previous = _current
    runtime = ConfigInitializer(config or (previous.config if previous else MxrecConfig()))
    _current = runtime
    try:
        yield runtime
    finally:
        runtime.close()
        _current = previous


def get_config_initializer() -> ConfigInitializer:
    """The ConfigInitializer in force; raises if `init()` was not called."""
    if _current is None:
        raise RuntimeError("mxrec is not initialised: call mxrec.util.initialize.init() first")
    return _current


def is_initialized() -> bool:
    return _current is not None


registry.provide(registry.CONFIG, get_config_initializer)


def set_if_load(if_load: bool) -> None:
    """Sets the `if_load` flag of the init() in force (mx_rec: scripts set it once they
    found a checkpoint; `ConfigInitializer.get_instance().if_load` reads it)."""
    if not isinstance(if_load, bool):
        raise TypeError(f"set_if_load: if_load must be a bool, got {if_load!r}")
    get_config_initializer().config.if_load = if_load


def get_host_pipeline_ops() -> "_ops.HostPipelineOps":
    """mx_rec's host ops object (set_threshold, return_timestamp, clear_channel); the same
    as mxrec.util.ops.import_host_pipeline_ops()."""
    return _ops.import_host_pipeline_ops()


def get_training_mode_channel_id(is_training: bool) -> Optional[int]:
    """See TrainParamsConfig.get_training_mode_channel_id."""
    return get_config_initializer().train_params_config.get_training_mode_channel_id(is_training)


def clear_channel(is_train_channel: bool = False) -> None:
    """mx_rec resets its evaluation (or training) channel's batch counter before a new
    round. mxrec has no per-channel counters: every evaluation round reads its iterator
    from the start, so there is nothing to reset. Checks its argument and that init() ran.

    Raises:
        TypeError: is_train_channel is not a bool.
        RuntimeError: init() was not called.
    """
    if not isinstance(is_train_channel, bool):
        raise TypeError(f"clear_channel: is_train_channel must be a bool, got "
                        f"{is_train_channel!r}")
    get_config_initializer()


def _getter(name):
    def get():
        return getattr(get_config_initializer().config, name)

    get.__name__ = f"get_{name}"
    get.__doc__ = f"The `{name}` given to init()."
    return get


get_rank_id = _getter("rank_id")
get_rank_size = _getter("rank_size")
get_train_steps = _getter("train_steps")
get_eval_steps = _getter("eval_steps")
get_save_steps = _getter("save_steps")
get_max_steps = _getter("max_steps")
get_prefetch_batch_number = _getter("prefetch_batch_number")
get_use_dynamic = _getter("use_dynamic")
get_use_dynamic_expansion = _getter("use_dynamic_expansion")


def get_initializer(is_training: bool):
    """The initializer op of the rewritten training (True) or evaluation (False) iterator.

    Run it instead of `iterator.initializer` after `modify_graph_and_start_emb_cache()`;
    see `mxrec.graph.modifier.get_initializer`.

    Raises:
        RuntimeError: no graph was rewritten (the graph modifier was never used).
    """
    provider = registry.provided(registry.ITERATOR_INITIALIZER)
    if provider is None:
        raise RuntimeError(
            "get_initializer: the graph has no rewritten iterator; call "
            "modify_graph_and_start_emb_cache() (mxrec.graph.modifier) after building the "
            "model with sparse_lookup(..., modify_graph=True)")
    return provider(is_training)
