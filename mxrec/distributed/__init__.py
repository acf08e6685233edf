"""Several workers: ranks and collectives, sharded and replicated tables.

- `communication`: this rank, its `tf.distribute.Server` and the collectives
  (mx_rec's path: `mxrec.util.communication`); `hccl_ops`: mx_rec's names for them.
- `multirank`: what `init()` installs on several ranks (the wing's behaviour).
- `sharded_lookup`: the lookup planners of several ranks (sharded and replicated tables).
- Tables sharded across ranks by ID, a lookup in three phases: `routing` (which rank owns
  an ID, the rank-local plan of what goes where), `id_exchange` (the IDs to their
  owners), `send_back` (the embeddings back, the gradients in reverse);
  `sharded_ops` wraps their TensorFlow ops.
- `replicated`: `is_dp=True` tables, a replica on every rank.
- `sharded_state`: the saveable of a sharded table (the whole table, by ID).
- `sharded_pipeline`: the graph modifier on several ranks.

Nothing here is imported by importing `mxrec.distributed` itself. The launcher that starts
the ranks is `mxrec.launch` (`python -m mxrec.launch -n N script.py`).
"""
