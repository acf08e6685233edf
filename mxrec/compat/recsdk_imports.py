"""What RecSDK's examples and Python unit tests import from mx_rec, across its releases.

{mx_rec's module path (renamed `mxrec`): the public names imported from it}, collected from
Ascend/RecSDK and a fork that holds later releases (examples/: DLRM, Wide&Deep, DCNv2, MMoE,
little_demo, little_demo_estimator, model_common; tests/mx_rec/: core, data, graph,
optimizers, saver, util, validator). mx_rec's own internals that only its white-box tests
import are listed too: each path and name either imports on mxrec or is refused with the
reason. `mxrec.compat.table` resolves every entry and writes docs/MX_REC_PATHS.md
from the result.
"""

from typing import Dict, Tuple

IMPORTS: Dict[str, Tuple[str, ...]] = {
    "mxrec": ("ASCEND_GLOBAL_HASHTABLE_COLLECTION",),
    "mxrec.constants.constants": (
        "ASCEND_GLOBAL_HASHTABLE_COLLECTION", "ASCEND_TIMESTAMP", "ASCEND_SPARSE_LOOKUP_LOCAL_EMB",
        "ASCEND_SPARSE_LOOKUP_ID_OFFSET", "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS", "BaseEnum",
        "CacheModeEnum", "All2allGradientsOp", "ApplyGradientsStrategy", "LIBREC_EOS_OPS_SO",
        "LIBASC_OPS_SO", "TRAIN_CHANNEL_ID", "EVAL_CHANNEL_ID", "LIBREC_TF_REC_V1_CPU_SO",
        "ASCAnchorAttr", "ASCEND_CUTTING_POINT_INITIALIZER", "ASCEND_SPARSE_LOOKUP_ENTRANCE",
        "DataAttr", "DataName", "EnvOption", "RecPyLogLevel"),
    "mxrec.util.constants": ("ASCEND_GLOBAL_HASHTABLE_COLLECTION",),
    "mxrec.util.initialize": (
        "init", "ConfigInitializer", "terminate_config_initializer", "get_rank_id",
        "get_rank_size", "set_if_load", "get_initializer", "get_host_pipeline_ops",
        "clear_channel", "get_use_dynamic_expansion"),
    "mxrec.util.config_utils.optimizer_utils": ("OptimizerConfig",),
    "mxrec.util.config_utils.train_param": ("TrainParamsConfig",),
    "mxrec.util.config_utils.embedding_utils": ("SparseEmbedConfig",),
    "mxrec.util.config_utils.feature_spec_utils": ("FeatureSpecConfig",),
    "mxrec.util.config_utils.hybrid_mgmt_utils": ("HybridManagerConfig",),
    "mxrec.util.global_env_conf": ("global_env", "get_global_env_conf"),
    "mxrec.util.log": ("logger", "get_logger"),
    "mxrec.util.ops": ("import_host_pipeline_ops",),
    "mxrec.util.variable": ("get_dense_and_sparse_variable", "check_and_get_config_via_var"),
    "mxrec.util.tf_version_adapter": ("hccl_ops", "npu_ops"),
    "mxrec.util.communication.hccl_ops": ("get_rank_id", "get_rank_size", "allreduce"),
    "mxrec.util.communication.hccl_mgmt": ("parse_hccl_json", "set_hccl_info_without_json"),
    "mxrec.util.model_common": (
        "Config", "LearningRateScheduler", "CacheModeEnum", "SSD_DATA_PATH", "sess_config",
        "get_npu_run_config", "make_batch_and_iterator", "create_feature_spec_list",
        "clear_saved_model", "evaluate", "evaluate_fix", "add_timestamp_func"),
    "mxrec.util.atomic": (),
    "mxrec.util.normalization": (),
    "mxrec.util.perf": ("performance",),
    "mxrec.util.perf_factory.bind_cpu": (),
    "mxrec.core.embedding": ("create_table", "sparse_lookup", "SparseEmbedding"),
    "mxrec.core.asc": ("FeatureSpec",),
    "mxrec.core.asc.helper": ("FeatureSpec", "get_asc_insert_func"),
    "mxrec.core.asc.feature_spec": ("FeatureSpec", "set_temporary_feature_spec_attribute"),
    "mxrec.core.asc.manager": ("start_asc_pipeline",),
    "mxrec.core.asc.merge_table": (),
    "mxrec.core.feature_process": ("EvictHook",),
    "mxrec.core.emb.sparse_embedding": ("HBMSparseEmbedding", "ExternalStorageSparseEmbedding"),
    "mxrec.core.emb.dynamic_sparse_embedding": ("HBMDynamicSparseEmbedding",),
    "mxrec.core.emb.base_sparse_embedding": ("BaseSparseEmbedding",),
    "mxrec.data.dataset": ("EosDataset",),
    "mxrec.graph": ("OrphanLookupKeySlicerHook", "LookupSubgraphSlicerHook"),
    "mxrec.graph.modifier": (
        "modify_graph_and_start_emb_cache", "GraphModifierHook", "AnchorRecord",
        "find_make_iterator_op", "find_target_dataset_op", "find_target_instance_dataset",
        "generate_get_next_op_specs", "get_dataset_op", "get_input_index_list",
        "get_passing_tensor_list", "get_preprocessing_map_func", "get_src_dataset",
        "get_tgt_dataset", "get_timestamp_index", "modify_graph_for_asc"),
    "mxrec.graph.hooks": ("OrphanLookupKeySlicerHook", "LookupSubgraphSlicerHook"),
    "mxrec.graph.acg_push_ops": ("ACGPushOpsToDatasetHook",),
    "mxrec.graph.merge_lookup": ("do_merge_lookup",),
    "mxrec.graph.patch": (),
    "mxrec.optimizers.base": ("CustomizedOptimizer",),
    "mxrec.optimizers.gradient_descent": ("create_hash_optimizer",),
    "mxrec.optimizers.gradient_descent_by_addr": ("create_hash_optimizer_by_addr",),
    "mxrec.optimizers.lazy_adam": ("create_hash_optimizer",),
    "mxrec.optimizers.lazy_adam_by_addr": ("create_hash_optimizer_by_address",),
    "mxrec.optimizers.adagrad": ("create_hash_optimizer",),
    "mxrec.optimizers.ftrl": ("create_hash_optimizer",),
    "mxrec.saver.saver": ("Saver",),
    "mxrec.saver.sparse": ("export",),
    "mxrec.saver.patch": (),
    "mxrec.saver.warm_start": (),
    "mxrec.validator.validator": ("para_checker_decorator",),
    "mxrec.validator.emb_validator": (),
}
