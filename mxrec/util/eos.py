"""mx_rec's `Dataset.eos_map(librec, channel_id, max_train_steps, max_eval_steps)`.

mx_rec adds `eos_map` to tf.data datasets (mx_rec.data.patch: an EosDataset over its
librec_eos_ops.so); RecSDK's Wide&Deep calls it before get_asc_insert_func so that a
FeatureSpec run with dynamic shapes ends cleanly, every rank together. mxrec adds the
same method (when mxrec.util.config is imported):

- the channel's dataset ends with its data or after the channel's maximum number of
  batches (`max_train_steps` for channel 0, `max_eval_steps` for channel 1; -1: no
  maximum), whichever comes first: exactly the batches of `dataset.take(max)`;
- on several ranks every rank's dataset ends at the first batch some rank lacks, as mx_rec's
  EosDataset ends them: the ranks agree on each batch inside the input pipeline
  (`mxrec.distributed.end_of_data`, the MPI engine; a round must be read to its end before
  its iterator is initialised again).
"""

from tensorflow.python.data.ops import dataset_ops

from mxrec.constants.constants import EVAL_CHANNEL_ID, LIBREC_EOS_OPS_SO, TRAIN_CHANNEL_ID
from mxrec.util import ops as _ops
from mxrec.util import ranks, registry


def _check_steps(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value == 0 or value < -1:
        raise ValueError(f"eos_map: {name} must be a positive number of batches or -1 (no "
                         f"maximum), got {value!r}")
    return value


def eos_map(dataset, librec, channel_id: int, max_train_steps: int = -1,
            max_eval_steps: int = -1):
    """The dataset, ending at its data's end or after the channel's maximum batches.

    Args:
        librec: `import_host_pipeline_ops(LIBREC_EOS_OPS_SO)`.
        channel_id: 0 (training) or 1 (evaluation), as mx_rec.
        max_train_steps, max_eval_steps: the most batches of channel 0 / 1; -1: no maximum.

    Raises:
        TypeError: librec is not import_host_pipeline_ops(LIBREC_EOS_OPS_SO).
        ValueError: another channel id, or a maximum that is not a positive int or -1.
        NotImplementedError: several ranks on the gRPC engine (the agreement needs the MPI
            engine).
    """
    if not isinstance(librec, _ops.HostPipelineOps) or librec.library != LIBREC_EOS_OPS_SO:
        raise TypeError(
            "eos_map: librec must be import_host_pipeline_ops(LIBREC_EOS_OPS_SO) (mx_rec's "
            f"end-of-sequence library), got {librec!r}")
    if isinstance(channel_id, bool) or channel_id not in (TRAIN_CHANNEL_ID, EVAL_CHANNEL_ID):
        raise ValueError(f"eos_map: channel_id must be {TRAIN_CHANNEL_ID} (training) or "
                         f"{EVAL_CHANNEL_ID} (evaluation), got {channel_id!r}")
    limit = _check_steps("max_train_steps", max_train_steps)
    evaluation_limit = _check_steps("max_eval_steps", max_eval_steps)
    if channel_id == EVAL_CHANNEL_ID:
        limit = evaluation_limit
    if limit != -1:
        dataset = dataset.take(limit)
    if ranks.get_rank_size() > 1:
        agreed = registry.provided(registry.END_OF_DATA)(dataset)
        # A TF1 dataset stays one (scripts call make_initializable_iterator on it).
        if isinstance(dataset, dataset_ops.DatasetV1):
            agreed = dataset_ops.DatasetV1Adapter(agreed)
        return agreed
    return dataset


def _method(self, librec, channel_id, max_train_steps=-1, max_eval_steps=-1):
    return eos_map(self, librec, channel_id, max_train_steps, max_eval_steps)


_method.__doc__ = eos_map.__doc__
dataset_ops.DatasetV2.eos_map = _method
