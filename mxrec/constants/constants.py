"""Names shared by mxrec's layers: graph collections, environment variables, mx_rec's enums.

A leaf module: it imports nothing of mxrec, so every layer may import it. The
ASCEND_* names and the enums are mx_rec's (`mx_rec.constants.constants`), with
its values, so that a script written for mx_rec finds them here.
"""

import enum

# The device variables of mxrec tables (not in TRAINABLE_VARIABLES).
SPARSE_TABLE_COLLECTION = "mxrec_sparse_tables"
# mx_rec's name of that collection (`from mx_rec import ASCEND_GLOBAL_HASHTABLE_COLLECTION`):
# the same collection; its value is mxrec's.
ASCEND_GLOBAL_HASHTABLE_COLLECTION = SPARSE_TABLE_COLLECTION
# A tensor of batch times (seconds, any shape); the batch's time is its max.
# Without one, the host key stage stamps IDs with the wall clock. mx_rec's name:
# its scripts run tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, batch["timestamp"]).
ASCEND_TIMESTAMP = "ASCEND_TIMESTAMP"
TIMESTAMP_COLLECTION = ASCEND_TIMESTAMP

# Dynamic expansion: each training lookup's unique rows [U, dim] and their int64
# addresses [U], for the by-address optimizers (mx_rec's names, and mxrec's).
ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
# The same addresses again: a lookup's addresses are already unique (the key stage
# deduplicates), so they are mx_rec's unique keys too; a script that picks this collection
# under ApplyGradientsStrategy.SUM_SAME_ID_GRADIENTS_AND_APPLY gets the same update.
ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS = "ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS"
LOCAL_EMB_COLLECTION = "mxrec_sparse_lookup_local_emb"
ID_OFFSET_COLLECTION = "mxrec_sparse_lookup_id_offset"

# Environment variables init() reads.
ENV_KEY_PROCESS_THREAD_NUM = "KEY_PROCESS_THREAD_NUM"
ENV_USE_COMBINE_FAAE = "USE_COMBINE_FAAE"

# mx_rec's names of its host-op libraries (mx_rec.constants.constants), which scripts pass
# to mx_rec.util.ops.import_host_pipeline_ops(path): the ASC ops and the end-of-sequence
# dataset op behind Dataset.eos_map. mxrec's ops are in its own library (mxrec/_lib).
LIBASC_OPS_SO = "libasc_ops.so"
LIBREC_EOS_OPS_SO = "librec_eos_ops.so"

# mx_rec's channel ids of training and evaluation (ConfigInitializer's
# train_params_config.get_training_mode_channel_id).
TRAIN_CHANNEL_ID = 0
EVAL_CHANNEL_ID = 1


class BaseEnum(enum.Enum):
    """mx_rec's enum base: `mapping(key)` finds the member whose value (or member) is `key`."""

    @classmethod
    def mapping(cls, key):
        """The member equal to `key` (a member or a value).

        Raises:
            KeyError: no member has that value (None included), naming the valid ones.
        """
        value = key.value if isinstance(key, BaseEnum) else key
        for member in cls:
            if member.value == value:
                return member
        raise KeyError(f"{cls.__name__}: no member has the value {key!r}; valid values: "
                       f"{[m.value for m in cls]}")


class CacheModeEnum(BaseEnum):
    """Where a table's rows live: device only, device + host memory, + SSD."""

    HBM = "HBM"
    DDR = "DDR"
    SSD = "SSD"


class All2allGradientsOp(BaseEnum):
    """create_table(all2all_gradients_op=...): how the ranks' gradients of an ID combine."""

    SUM_GRADIENTS = "sum_gradients"
    SUM_GRADIENTS_AND_DIV_BY_RANKSIZE = "sum_gradients_and_div_by_ranksize"


class ApplyGradientsStrategy(BaseEnum):
    """mx_rec's env APPLY_GRADIENTS_STRATEGY, which picks the address collection a
    dynamic-expansion script trains from. In mxrec a lookup's addresses are unique, so both
    collections hold the same tensors and both strategies give the same update."""

    DIRECT_APPLY = "direct_apply"
    SUM_SAME_ID_GRADIENTS_AND_APPLY = "sum_same_id_gradients_and_apply"
