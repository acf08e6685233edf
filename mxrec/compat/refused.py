"""mx_rec's paths and names that mxrec does not have, each with the reason (NPU only, or an
internal of mx_rec's with no counterpart). `mxrec.compat`'s finder refuses them with
`RefusedImport`; `mxrec.compat.table` lists them in docs/MX_REC_PATHS.md."""

from typing import Dict

_NPU = "Ascend NPU only"
_TABLE_CLASSES = ("mx_rec's table classes, one per storage (HBM, DDR/SSD, dynamic expansion); "
                  "mxrec's create_table returns one class for every storage "
                  "(mxrec.core.embedding.SparseEmbedding)")
_VALIDATORS = ("mx_rec's argument-validator library; mxrec checks each function's arguments "
               "in the function and raises ValueError/TypeError naming them")
_PATCHES = ("mx_rec's patches of TensorFlow's classes (Saver, Session, Dataset, ...), "
            "applied by `import mx_rec`; mxrec uses hooks and its own Saver instead")
_SLICERS = ("NPUEstimator only (mx_rec's documentation): they move the subgraphs that "
            "compute lookup keys into the NPU's data pipeline")
_INTERNAL = "an internal of mx_rec's host pipeline, with no counterpart on mxrec"

REFUSED_MODULES: Dict[str, str] = {
    "mxrec.util.config_utils.hybrid_mgmt_utils": (
        "mx_rec's manager of its C++ host pipeline (mxrec_pybind.HybridMgmt); mxrec's key "
        "stage runs in the dataset's map and has no manager object"),
    "mxrec.util.config_utils.feature_spec_utils": (
        "mx_rec's registry of FeatureSpecs, written by its library; mxrec keeps each "
        "FeatureSpec's plan with the FeatureSpec"),
    "mxrec.util.communication.hccl_mgmt": f"{_NPU}: the HCCL rank table of the devices",
    "mxrec.util.atomic": _INTERNAL,
    "mxrec.util.normalization": _INTERNAL,
    "mxrec.util.perf": "mx_rec's timing decorator of its own functions",
    "mxrec.util.perf_factory": f"{_NPU}: binding processes to the cores near their device",
    "mxrec.core.asc.merge_table": (
        "mx_rec's search for tables no lookup uses, for its merged host pipeline; mxrec "
        "plans each table on its own"),
    "mxrec.core.emb": _TABLE_CLASSES,
    "mxrec.data": ("mx_rec's EosDataset behind Dataset.eos_map; use dataset.eos_map(...) "
                   "(mxrec.util.eos)"),
    "mxrec.graph.hooks": _SLICERS,
    "mxrec.graph.merge_lookup": (
        "mx_rec merges several lookups of one table in the modified graph; mxrec's graph "
        "modifier plans each lookup on its own, so there is nothing to merge"),
    "mxrec.graph.patch": _PATCHES,
    "mxrec.saver.patch": _PATCHES,
    "mxrec.validator": _VALIDATORS,
}

_MODIFIER = ("an internal of mx_rec's graph modifier (a subject of its white-box tests); "
             "mxrec's graph modifier is modify_graph_and_start_emb_cache and GraphModifierHook")

REFUSED_NAMES: Dict[str, str] = {
    **{f"mxrec.graph.modifier.{name}": _MODIFIER for name in (
        "AnchorRecord", "find_make_iterator_op", "find_target_dataset_op",
        "find_target_instance_dataset", "generate_get_next_op_specs", "get_dataset_op",
        "get_input_index_list", "get_passing_tensor_list", "get_preprocessing_map_func",
        "get_src_dataset", "get_tgt_dataset", "get_timestamp_index", "modify_graph_for_asc")},
    "mxrec.graph.OrphanLookupKeySlicerHook": _SLICERS,
    "mxrec.graph.LookupSubgraphSlicerHook": _SLICERS,
    "mxrec.constants.constants.LIBREC_TF_REC_V1_CPU_SO": (
        "a later release's library of CPU host ops; import_host_pipeline_ops() (LIBASC_OPS_SO) "
        "gives the same return_timestamp"),
    "mxrec.constants.constants.ASCAnchorAttr": _INTERNAL,
    "mxrec.constants.constants.ASCEND_CUTTING_POINT_INITIALIZER": _INTERNAL,
    "mxrec.constants.constants.ASCEND_SPARSE_LOOKUP_ENTRANCE": _INTERNAL,
    "mxrec.constants.constants.DataAttr": "mx_rec's checkpoint file layout; mxrec's is "
                                          "mxrec.saver.schema",
    "mxrec.constants.constants.DataName": "mx_rec's checkpoint file layout; mxrec's is "
                                          "mxrec.saver.schema",
    "mxrec.constants.constants.EnvOption": ("mx_rec's enum of its environment variables; "
                                            "mxrec's are read through mxrec.util.global_env_conf"),
    "mxrec.constants.constants.RecPyLogLevel": ("mx_rec's enum of MXREC_LOG_LEVEL values; "
                                                "mxrec.util.log.get_logger names the valid ones"),
    "mxrec.core.asc.feature_spec.set_temporary_feature_spec_attribute": (
        "mx_rec's FeatureSpec bookkeeping, set by its insert function"),
    # The host is the module that answers mx_rec.util.model_common.
    "mxrec.compat.model_common.get_npu_run_config": (
        f"{_NPU}: npu_bridge's NPURunConfig for NPUEstimator; use tf.estimator.RunConfig"),
    "mxrec.util.variable.check_and_get_config_via_var": (
        "mx_rec's lookup of a table by its variable; use ConfigInitializer.get_instance()"
        ".sparse_embed_config.get_table_instance(var)"),
}
