"""Names shared by mxrec's layers: graph collections and environment variables.

A leaf module: it imports nothing of mxrec, so every layer may import it.
"""

# The device variables of mxrec tables (not in TRAINABLE_VARIABLES).
SPARSE_TABLE_COLLECTION = "mxrec_sparse_tables"
# A tensor of batch times (seconds, any shape); the batch's time is its max.
# Without one, the host key stage stamps IDs with the wall clock.
TIMESTAMP_COLLECTION = "mxrec_batch_timestamp"

# Dynamic expansion: each training lookup's unique rows [U, dim] and their int64
# addresses [U], for the by-address optimizers (mx_rec's names, and mxrec's).
ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"
LOCAL_EMB_COLLECTION = "mxrec_sparse_lookup_local_emb"
ID_OFFSET_COLLECTION = "mxrec_sparse_lookup_id_offset"

# Environment variables init() reads.
ENV_KEY_PROCESS_THREAD_NUM = "KEY_PROCESS_THREAD_NUM"
ENV_USE_COMBINE_FAAE = "USE_COMBINE_FAAE"
