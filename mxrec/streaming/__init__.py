"""Streaming training: time-partitioned data in, full/delta checkpoints and serving versions out.

Modules: `partitions` (ready partitions in time order), `parsers` (tf.data parsers for
Criteo, Avazu and declared schemas), `donefile`, `models` (built-in wide_deep, dlrm, dcn),
`trainer` (the loop), `__main__` (`python -m mxrec.streaming train|replay`).
"""
