"""Several workers: ranks and collectives, the launcher, sharded and replicated tables.

- `communication`: this rank, its `tf.distribute.Server` and the collectives
  (old path and mx_rec's: `mxrec.util.communication`); `hccl_ops`: mx_rec's names for them.
- `launch`: `python -m mxrec.distributed.launch -n N script.py` (also `python -m mxrec.launch`).
- `id_exchange`: tables sharded across ranks by ID (route, exchange, send back).
- `replicated`: `is_dp=True` tables, a replica on every rank.
- `sharded_state`: the saveable of a sharded table (the whole table, by ID).
- `sharded_pipeline`: the graph modifier on several ranks.

Nothing here is imported by importing `mxrec.distributed` itself, so the launcher stays a
plain process starter.
"""
