"""Several workers: ranks and collectives, the launcher, sharded and replicated tables.

- `communication`: this rank, its `tf.distribute.Server` and the collectives
  (old path and mx_rec's: `mxrec.util.communication`); `hccl_ops`: mx_rec's names for them.
- `launch`: `python -m mxrec.distributed.launch -n N script.py` (also `python -m mxrec.launch`).
- Tables sharded across ranks by ID, a lookup in three phases: `routing` (which rank owns
  an ID, the rank-local plan of what goes where), `id_exchange` (the IDs to their
  owners), `send_back` (the embeddings back, the gradients in reverse);
  `sharded_ops` wraps their TensorFlow ops.
- `replicated`: `is_dp=True` tables, a replica on every rank.
- `sharded_state`: the saveable of a sharded table (the whole table, by ID).
- `sharded_pipeline`: the graph modifier on several ranks.

Nothing here is imported by importing `mxrec.distributed` itself, so the launcher stays a
plain process starter.
"""
