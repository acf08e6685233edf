"""Row-wise int8 quantization of serving tables (FBGEMM's rowwise 8-bit scheme).

Each row x [dim] is stored as dim uint8 codes and two float32, its scale and offset:

    offset = min(x),  scale = (max(x) - min(x)) / 255,  q = round((x - offset) / scale)
    x ~ q * scale + offset                     (|x - that| <= scale / 2 per element)

A table narrower than MIN_DIM stays float32: its int8 rows (dim + 8 bytes) would not be
smaller than float32 ones (4 dim bytes). A row whose values are all equal has scale 0 and
codes 0: it is served exactly. The codes
are rounded half to even (NumPy's `rint`) from the float32 scale the row keeps, so the
bound holds for the stored scale. Serving graphs dequantize with core ops (Cast, Mul,
AddV2), so TF Serving and mxrec's predictor serve them unchanged.

Example:
    >>> codes, scale_offset = quantize_rows(rows)          # [N, dim] uint8, [N, 2] float32
    >>> dequantize_rows(codes, scale_offset)               # [N, dim] float32
"""

from typing import Dict, Mapping, Optional, Tuple

import numpy as np

INT8 = "int8"
# What `quantize=` accepts: None (rows served as float32) or one of these.
QUANTIZE_MODES = (INT8,)
# The serving variables of an int8 table beside `ids`: mxrec_serving/<table>/{these}.
QUANTIZED, SCALE_OFFSET = "quantized", "scale_offset"
_LEVELS = 255
# q * scale, up to max - min, is computed in float32 when served.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# The narrowest table quantized: dim + 8 < 4 dim from dim 3 on.
MIN_DIM = 3


def quantizes(quantize: Optional[str], dim: int) -> bool:
    """Whether a table of width `dim` is served int8 under `quantize`."""
    return quantize == INT8 and dim >= MIN_DIM


def check_quantize(quantize, where: str) -> Optional[str]:
    """`quantize` checked: None (float32 rows) or "int8".

    Raises:
        ValueError: any other value, naming the accepted ones.
    """
    if quantize is None or (isinstance(quantize, str) and quantize in QUANTIZE_MODES):
        return quantize
    raise ValueError(f"{where}: quantize must be None (float32 rows) or one of "
                     f"{list(QUANTIZE_MODES)}, got {quantize!r}")


def quantize_rows(rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Rows [N, dim] (finite) as (codes uint8 [N, dim], scale_offset float32 [N, 2])."""
    rows = np.asarray(rows, np.float32)
    if rows.ndim != 2:
        raise ValueError(f"quantize_rows: rows must be [N, dim], got shape {list(rows.shape)}")
    if rows.shape[1] == 0:
        return np.zeros(rows.shape, np.uint8), np.zeros([len(rows), 2], np.float32)
    low = rows.min(axis=1)
    # In float64: max - min of float32 values cannot overflow there.
    span = rows.max(axis=1).astype(np.float64) - low
    if len(rows) and not span.max() <= _FLOAT32_MAX:
        row = int(np.argmax(np.where(np.isnan(span), np.inf, span)))
        raise ValueError(f"quantize_rows: row {row} spans {span[row]:.6g} (max - min), beyond "
                         f"float32's range ({_FLOAT32_MAX:.6g}), or is not finite: "
                         "int8 serving cannot hold it")
    scale = (span / _LEVELS).astype(np.float32)
    steps = np.where(scale > 0, scale, 1).astype(np.float64)[:, None]
    codes = np.rint((rows - low[:, None].astype(np.float64)) / steps)
    codes = np.clip(codes, 0, _LEVELS).astype(np.uint8)
    return codes, np.stack([scale, low], axis=1)


def dequantize_rows(codes: np.ndarray, scale_offset: np.ndarray) -> np.ndarray:
    """float32 [N, dim]: the serving graph's dequantization (float32 multiply, then add)."""
    scale_offset = np.asarray(scale_offset, np.float32)
    return (np.asarray(codes).astype(np.float32) * scale_offset[:, :1]
            + scale_offset[:, 1:]).astype(np.float32)


def pack(codes: np.ndarray, scale_offset: np.ndarray) -> np.ndarray:
    """float32 [N, dim + 2] holding a quantized table's rows exactly (codes 0..255 and the
    two floats), so row-wise code (a delta's merge) moves them as one array."""
    return np.concatenate([np.asarray(codes, np.float32),
                           np.asarray(scale_offset, np.float32)], axis=1)


def unpack(packed: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """`pack`'s inverse: (codes uint8 [N, dim], scale_offset float32 [N, 2])."""
    return packed[:, :-2].astype(np.uint8), np.ascontiguousarray(packed[:, -2:], np.float32)


def quantize_delta(tables: Mapping[str, Mapping[str, np.ndarray]]
                   ) -> Dict[str, Dict[str, np.ndarray]]:
    """A serving delta {table: {"ids", "embeddings", "removed"}} in int8 form: the
    "embeddings" of each table of MIN_DIM or more columns replaced by "quantized" and
    "scale_offset" (its other arrays kept; narrower tables stay float32, as exported)."""
    out = {}
    for name, delta in tables.items():
        rows = delta.get("embeddings")
        if rows is None or not quantizes(INT8, np.shape(rows)[1]):
            out[name] = dict(delta)
            continue
        quantized = {k: v for k, v in delta.items() if k != "embeddings"}
        quantized[QUANTIZED], quantized[SCALE_OFFSET] = quantize_rows(rows)
        out[name] = quantized
    return out


__all__ = ["QUANTIZE_MODES", "INT8", "MIN_DIM", "quantizes", "QUANTIZED", "SCALE_OFFSET",
           "check_quantize", "quantize_rows", "dequantize_rows", "pack", "unpack", "quantize_delta"]
