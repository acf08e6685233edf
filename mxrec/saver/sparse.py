"""Tables as NumPy arrays: `export` reads each table's admitted IDs and their rows.

Two sources give the same answer for the same state:

* a live session: the host engine gives (ID, device row) pairs and the session
  reads the device table;
* a checkpoint written by any `tf.compat.v1.train.Saver` of an mxrec graph: the
  host arrays `<table>/mxrec_host/{keys,rows}` and the variable `<table>`;
* a directory (or version folder) of mxrec's own Saver, written by any number of ranks:
  every rank's files of the chain folded into the whole table (`fold.whole_table`).

IDs counted but not admitted (row -1 in the host arrays) have no row and are
left out. Rows come in device-row order, as `SparseEmbedding.export_rows` gives
them.

Example:
    >>> tables = export(session=sess)                  # live
    >>> tables = export(checkpoint="/ckpt/model-100")  # offline
    >>> tables["user_table"]["ids"].shape, tables["user_table"]["embeddings"].shape
    ((K,), (K, 16))
"""

from typing import Dict, Iterable, List, Optional

import numpy as np
import tensorflow as tf

from mxrec.constants.constants import SPARSE_TABLE_COLLECTION
from mxrec.saver import fold, merge, stream

HOST_SUFFIX = "/mxrec_host"
_HOST_FIELDS = ("keys", "rows", "counts", "last_seen", "free_rows", "meta", "threshold")
# Tables with a host (and SSD) tier save these after _HOST_FIELDS.
_TIER_FIELDS = ("in_host", "lru_rows", "lru_ages", "tier_components", "tier_present",
                "tier_values")

TableArrays = Dict[str, np.ndarray]


def host_tensor_name(table_name: str, field: str) -> str:
    """Checkpoint key of one host array of a table, e.g. `user_table/mxrec_host/keys`."""
    if field not in _HOST_FIELDS + _TIER_FIELDS:
        raise ValueError(f"unknown host field {field!r}; known: "
                         f"{list(_HOST_FIELDS + _TIER_FIELDS)}")
    return f"{table_name}{HOST_SUFFIX}/{field}"


def host_fields() -> tuple:
    """Names of the host arrays of a table in a checkpoint, in MxrecImportTable's order."""
    return _HOST_FIELDS


def tier_fields() -> tuple:
    """Names of the host-tier arrays of a tiered table, in MxrecImportTableTiered's order
    after host_fields()."""
    return _TIER_FIELDS


def resolve_checkpoint(checkpoint: str) -> str:
    """A checkpoint prefix from a prefix or a directory (its latest checkpoint).

    Raises:
        ValueError: nothing loadable at `checkpoint`.
    """
    if not isinstance(checkpoint, str) or not checkpoint:
        raise ValueError(f"checkpoint must be a non-empty path, got {checkpoint!r}")
    if tf.io.gfile.isdir(checkpoint):
        latest = tf.train.latest_checkpoint(checkpoint)
        if latest is None:
            raise ValueError(f"checkpoint directory {checkpoint!r} holds no checkpoint")
        return latest
    if not tf.io.gfile.exists(checkpoint + ".index"):
        raise ValueError(f"no checkpoint at {checkpoint!r} (no {checkpoint}.index)")
    return checkpoint


def checkpoint_tables(reader) -> List[str]:
    """Names of the mxrec tables whose host state and rows a checkpoint holds."""
    names = reader.get_variable_to_shape_map()
    suffix = f"{HOST_SUFFIX}/keys"
    return sorted(n[: -len(suffix)] for n in names
                  if n.endswith(suffix) and n[: -len(suffix)] in names)


def _table_names(table_list) -> Optional[List[str]]:
    if table_list is None:
        return None
    if isinstance(table_list, str) or not isinstance(table_list, Iterable):
        table_list = [table_list]
    names = []
    for table in table_list:
        name = table if isinstance(table, str) else getattr(table, "table_name", None)
        if not isinstance(name, str):
            raise TypeError(f"export: table_list holds tables or table names, got {table!r}")
        names.append(name)
    return names


def _graph_tables(graph: tf.Graph) -> Dict[str, object]:
    tables = {}
    for variable in graph.get_collection(SPARSE_TABLE_COLLECTION):
        table = variable._mxrec_table  # set by SparseEmbedding for the optimizers too
        tables[table.table_name] = table
    return tables


def _from_session(names, session) -> Dict[str, TableArrays]:
    tables = _graph_tables(session.graph)
    if names is None:
        names = sorted(tables)
    missing = [n for n in names if n not in tables]
    if missing:
        raise ValueError(f"export: no table named {missing} in the session's graph; "
                         f"tables: {sorted(tables)}")
    # Fetching the variable reuses its read op, so a finalized graph works too.
    values = session.run({n: tables[n].variable for n in names})
    out = {}
    for name in names:
        ids, rows = tables[name].export_rows()
        out[name] = {"ids": np.asarray(ids, np.int64),
                     "embeddings": np.asarray(values[name][np.asarray(rows, np.int64)],
                                              np.float32)}
    return out


def table_arrays_from_reader(reader, name: str, checkpoint: str) -> TableArrays:
    """One table's admitted IDs and rows from a checkpoint reader, in row order."""
    try:
        keys = reader.get_tensor(host_tensor_name(name, "keys"))
        rows = reader.get_tensor(host_tensor_name(name, "rows"))
        variable = reader.get_tensor(name)
    except (tf.errors.NotFoundError, ValueError) as err:
        raise ValueError(f"table {name!r} is not in checkpoint {checkpoint!r} (it needs "
                         f"{name!r} and {name}{HOST_SUFFIX}/*): {err}") from None
    admitted = rows >= 0
    keys, rows = keys[admitted], rows[admitted]
    order = np.argsort(rows, kind="stable")
    keys, rows = keys[order], rows[order]
    if len(rows) and rows[-1] >= variable.shape[0]:
        raise ValueError(f"checkpoint {checkpoint!r}: table {name!r} has host row {rows[-1]} "
                         f"beyond its {variable.shape[0]} device rows")
    return {"ids": keys.astype(np.int64),
            "embeddings": variable[rows.astype(np.int64)].astype(np.float32)}


def _from_saver_versions(names, checkpoint, location) -> Dict[str, TableArrays]:
    # Every file verified, then mapped and read a chunk of rows at a time: what is held is
    # the embeddings returned.
    copies = stream.LocalCopies()
    try:
        versions = fold.open_chain(*location, copies)
        tables = fold.table_names(versions)
        dims = {name: meta["dim"] for version in versions
                for name, meta in version.manifest["tables"].items()}
        missing = [n for n in names or () if n not in tables]
        if missing:
            raise ValueError(f"export: no table named {missing} in checkpoint "
                             f"{checkpoint!r}; tables: {tables}")
        out = {}
        for name in names or tables:
            ids, embeddings = fold.admitted(fold.whole_table(versions, name), dims[name])
            out[name] = {"ids": ids, "embeddings": embeddings}
        return out
    finally:
        copies.close()


def _from_checkpoint(names, checkpoint) -> Dict[str, TableArrays]:
    location = merge.locate(checkpoint)
    if location is not None:
        return _from_saver_versions(names, checkpoint, location)
    checkpoint = resolve_checkpoint(checkpoint)
    reader = tf.train.load_checkpoint(checkpoint)
    if names is None:
        names = checkpoint_tables(reader)
    return {name: table_arrays_from_reader(reader, name, checkpoint) for name in names}


def export(table_list=None, session: Optional[tf.compat.v1.Session] = None,
           checkpoint: Optional[str] = None) -> Dict[str, TableArrays]:
    """Each table's admitted IDs and their embedding rows, as NumPy arrays.

    Args:
        table_list: tables (from `create_table`) or table names; None = every table (of the
            session's graph, or of the checkpoint).
        session: read the live tables through this session. Default: the default session,
            when no checkpoint is given.
        checkpoint: read a checkpoint instead: a TF checkpoint (a prefix, or a directory for
            its latest), or a directory or version folder of mxrec's Saver (written by any
            number of ranks; rows then come in ID order).

    Returns:
        {table_name: {"ids": int64 [K], "embeddings": float32 [K, dim]}}, rows in device-row
        order.

    Raises:
        ValueError: both or neither source given, or a named table missing from the source.

    Example:
        >>> export(["user_table"], session=sess)["user_table"]["embeddings"].shape
        (K, 16)
    """
    names = _table_names(table_list)
    if session is not None and checkpoint is not None:
        raise ValueError("export: give either session or checkpoint, not both")
    if checkpoint is not None:
        return _from_checkpoint(names, checkpoint)
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise ValueError("export: give a session or a checkpoint (no default session is set)")
    return _from_session(names, session)


def apply_delta_arrays(base: TableArrays, delta: TableArrays, table_name: str = "") -> TableArrays:
    """A table's arrays after a delta: rows of `delta["ids"]` set or added, `removed` dropped.

    Args:
        base: {"ids": [K], "embeddings": [K, dim]}.
        delta: {"ids": [D], "embeddings": [D, dim], "removed": [R]}; every key optional.

    Returns:
        New arrays: the base's IDs in their order minus the removed ones, then the added IDs
        in the delta's order.
    """
    label = f"delta of table {table_name!r}" if table_name else "delta"
    ids = np.asarray(base["ids"], np.int64)
    emb = np.asarray(base["embeddings"], np.float32)
    dim = emb.shape[1]
    d_ids = np.asarray(delta.get("ids", np.zeros([0], np.int64)), np.int64).reshape(-1)
    d_emb = np.asarray(delta.get("embeddings", np.zeros([0, dim], np.float32)), np.float32)
    removed = np.asarray(delta.get("removed", np.zeros([0], np.int64)), np.int64).reshape(-1)
    unknown = sorted(set(delta) - {"ids", "embeddings", "removed"})
    if unknown:
        raise ValueError(f"{label}: unknown keys {unknown}; known: ids, embeddings, removed")
    if d_emb.ndim != 2 or d_emb.shape != (len(d_ids), dim):
        raise ValueError(f"{label}: embeddings must be [{len(d_ids)}, {dim}], "
                         f"got {list(d_emb.shape)}")
    if len(np.unique(d_ids)) != len(d_ids):
        raise ValueError(f"{label}: an ID appears twice in ids")
    both = np.intersect1d(d_ids, removed)
    if len(both):
        raise ValueError(f"{label}: IDs {both[:5].tolist()} are both changed and removed")
    keep = ~np.isin(ids, removed)
    ids, emb = ids[keep], emb[keep].copy()
    # Each delta ID's position in the base (the last one, should an ID repeat there), by a
    # binary search of the base's IDs in sorted order: no Python object per ID.
    order = np.argsort(ids, kind="stable")
    in_order = ids[order]
    found = np.searchsorted(in_order, d_ids, side="right") - 1
    is_old = found >= 0
    is_old[is_old] = in_order[found[is_old]] == d_ids[is_old]
    emb[order[found[is_old]]] = d_emb[is_old]
    return {"ids": np.concatenate([ids, d_ids[~is_old]]),
            "embeddings": np.concatenate([emb, d_emb[~is_old]], axis=0)}
