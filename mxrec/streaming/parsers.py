"""tf.data parsers for CTR text data: Criteo TSV, Avazu CSV, or a declared schema.

Every record is parsed by vectorised TensorFlow ops on a batch of lines (no
Python per record). A batch becomes a dict of tensors:

    label      float32 [B]         the label column
    dense      float32 [B, D]      dense columns (empty -> 0); absent when D = 0
    sparse     int64   [B, S]      categorical columns as IDs (below)
    time       int64   [B]         seconds since the epoch, from a time column; absent without one
    row_id     int64   [B]         an unsigned 64-bit column, bit-cast to int64; absent without one
    bad_file   int32   [K]         index into the file list of each malformed line of the batch
    bad_line   int64   [K]         its line number in its file (1-based, header included)
    bad_column int32   [K]         the first column at fault, or -1: wrong field count
    lines      int64   []          lines read (good and bad)

Malformed lines are dropped from the batch and reported; `BadLineCounter` turns the
report into messages with file, line and column and fails once a partition has more than
a set number. A line is malformed when it has another number of fields than the schema,
or when a field breaks its column's rule:

    label        a number in [0, 1]
    dense        empty (0) or a finite number with |x| <= Schema.dense_limit (1e15 unless
                 set): the limit can be raised, finiteness is always required
    uint64       a decimal integer in [0, 2**64 - 1]
    yymmddhh     a date that exists (2000-2099) and an hour 00-23
    timestamp    seconds since the epoch in [0, 4102444800] (up to 2100-01-01)
    categorical  any text; like every field, UTF-8 without NUL bytes or line breaks
    skip         as categorical

A number has at most 31 characters (TensorFlow 2.15's conversion fails a batch on longer
ones). No bad value fails a batch or reaches the model as a non-finite or out-of-range
tensor.

Categorical IDs (stable across runs, machines and TensorFlow versions):

    id = (feature_index << 56) | (FarmHash Fingerprint64(utf-8 value) mod 2**56)

with `tf.strings.to_hash_bucket_fast` (documented to be FarmHash's Fingerprint64,
which is frozen). The top 8 bits are the categorical feature's index among the
schema's categorical columns, so two features never share an ID, whatever their
values; an empty field hashes like any value (a per-feature "missing" ID). At
most 256 categorical columns.

Example:
    >>> ds = make_dataset(["/data/20240101/00/part-0"], CRITEO_TSV, batch_size=512)
    >>> batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    >>> batch["sparse"]       # int64 [B, 26]
"""

import dataclasses
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

KINDS = ("label", "dense", "categorical", "uint64", "yymmddhh", "timestamp", "skip")
HASH_BITS = 56
MAX_CATEGORICAL = 1 << (64 - HASH_BITS)
# Dense values beyond this size are bad lines unless Schema.dense_limit says otherwise:
# above any count or millisecond timestamp of real CTR data (the Criteo sample's largest
# is 507,333), and small enough that squares of a batch of millions of such values still
# sum to a finite float32, for a model that does not log-transform its inputs.
DEFAULT_DENSE_LIMIT = 1e15
# TensorFlow 2.15's number conversion (to_number, decode_csv) fails the whole batch on a
# number of 32 or more characters (2.21 converts it), so longer ones are bad lines, alike
# in every version.
MAX_NUMBER_CHARS = 31
TIMESTAMP_RANGE = (0, 4102444800)  # 1970-01-01 to 2100-01-01, seconds
# Characters a delimiter may not be: they can appear inside a number (the patterns below
# would then be ambiguous) or end a line.
_NOT_DELIMITERS = "0123456789+-.eE\n\r\0"

_NUMBER = r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
# Any text that is valid UTF-8 without NUL bytes or line breaks (tf.io.decode_csv fails
# the batch on a CR or LF inside a field; TextLineDataset drops CRs, parse_lines may be
# given them): RE2 lets invalid byte sequences through only as surrogate code points,
# which the class leaves out (tested against Python's strict decoder).
_TEXT = r"\x{0}\x{a}\x{d}\x{D800}-\x{DFFF}"
_PATTERNS = {
    "label": _NUMBER,
    "dense": "|" + _NUMBER,
    "uint64": r"[0-9]{1,20}",
    "yymmddhh": r"[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])(?:[01][0-9]|2[0-3])",
    "timestamp": r"-?[0-9]{1,18}",
    "categorical": f"[^{_TEXT}]*",
    "skip": f"[^{_TEXT}]*",
}


class MalformedDataError(ValueError):
    """More malformed lines in a partition than allowed; the message names them."""


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a text record.

    Attributes:
        name: its name (used in error messages).
        kind: "label" (a number), "dense" (a number, empty -> 0), "categorical" (any
            string, hashed to an ID), "uint64" (an unsigned 64-bit integer, kept as the
            int64 with the same bits in `row_id`), "yymmddhh" (an hour, UTC, into `time`),
            "timestamp" (seconds since the epoch, into `time`) or "skip".
    """

    name: str
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name!r}: kind must be one of {KINDS}, got "
                             f"{self.kind!r}")


@dataclasses.dataclass(frozen=True)
class Schema:
    """The columns of a record, the field delimiter, whether files start with a header and
    the largest dense value accepted.

    Attributes:
        dense_limit: a dense value with |x| above it makes its line a bad line
            (DEFAULT_DENSE_LIMIT, 1e15); may be raised up to inf, a non-finite value is
            always a bad line.

    Raises:
        ValueError: no label or more than one, more than one time or uint64 column, more
            than 256 categorical columns, a delimiter that is not one ASCII character or
            could be part of a number, or a dense_limit that is not > 0.
    """

    columns: tuple
    delimiter: str = "\t"
    header: bool = False
    dense_limit: float = DEFAULT_DENSE_LIMIT

    def __post_init__(self):
        object.__setattr__(self, "columns", tuple(self.columns))
        kinds = [c.kind for c in self.columns]
        if kinds.count("label") != 1:
            raise ValueError(f"schema: exactly one label column needed, got {kinds.count('label')}")
        if kinds.count("yymmddhh") + kinds.count("timestamp") > 1:
            raise ValueError("schema: at most one time column (yymmddhh or timestamp)")
        if kinds.count("uint64") > 1:
            raise ValueError("schema: at most one uint64 column")
        if kinds.count("categorical") > MAX_CATEGORICAL:
            raise ValueError(f"schema: at most {MAX_CATEGORICAL} categorical columns, got "
                             f"{kinds.count('categorical')}")
        self._check_delimiter()
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"schema: column names repeat: {names}")
        limit = self.dense_limit
        if isinstance(limit, bool) or not isinstance(limit, (int, float)):
            raise TypeError(f"schema: dense_limit must be a number, got {limit!r}")
        if not limit > 0:
            raise ValueError(f"schema: dense_limit must be > 0 (inf: any finite value), got "
                             f"{limit}")

    def _check_delimiter(self):
        delimiter = self.delimiter
        if not isinstance(delimiter, str) or len(delimiter) != 1 or not delimiter.isascii():
            raise ValueError(f"schema: delimiter must be one ASCII character, got {delimiter!r}")
        if delimiter in _NOT_DELIMITERS:
            raise ValueError(f"schema: delimiter {delimiter!r} can be part of a number or end a "
                             "line; use another one (tab, comma, ...)")

    def names(self, kind: str) -> List[str]:
        return [c.name for c in self.columns if c.kind == kind]

    def indices(self, kind: str) -> List[int]:
        return [i for i, c in enumerate(self.columns) if c.kind == kind]

    @property
    def num_dense(self) -> int:
        return len(self.indices("dense"))

    @property
    def num_sparse(self) -> int:
        return len(self.indices("categorical"))

    @property
    def has_time(self) -> bool:
        return bool(self.indices("yymmddhh") or self.indices("timestamp"))


def criteo_schema(delimiter: str = "\t", header: bool = False) -> Schema:
    """Criteo's columns: label, I1..I13 (dense), C1..C26 (categorical)."""
    return Schema(tuple([Column("label", "label")]
                        + [Column(f"I{i}", "dense") for i in range(1, 14)]
                        + [Column(f"C{i}", "categorical") for i in range(1, 27)]),
                  delimiter, header)


AVAZU_CATEGORICAL = ("C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
                     "app_domain", "app_category", "device_id", "device_ip", "device_model",
                     "device_type", "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19",
                     "C20", "C21")


def avazu_schema(delimiter: str = ",", header: bool = True) -> Schema:
    """Avazu's columns: id (unsigned 64-bit), click (label), hour (YYMMDDHH), 21 categorical."""
    return Schema(tuple([Column("id", "uint64"), Column("click", "label"),
                         Column("hour", "yymmddhh")]
                        + [Column(name, "categorical") for name in AVAZU_CATEGORICAL]),
                  delimiter, header)


CRITEO_TSV = criteo_schema()
AVAZU_CSV = avazu_schema()


def parse_schema_spec(spec: str, delimiter: str = "\t", header: bool = False,
                      dense_limit: float = DEFAULT_DENSE_LIMIT) -> Schema:
    """A schema from "name:kind,name:kind,..." (kinds as in `Column`)."""
    columns = []
    for item in spec.split(","):
        name, sep, kind = item.strip().partition(":")
        if not sep or not name:
            raise ValueError(f"schema spec item {item!r} is not name:kind")
        columns.append(Column(name, kind))
    return Schema(tuple(columns), delimiter, header, dense_limit)


def named_schema(name: str, delimiter: Optional[str] = None,
                 header: Optional[bool] = None,
                 dense_limit: float = DEFAULT_DENSE_LIMIT) -> Schema:
    """A named format's schema.

    "criteo" (TSV, no header), "criteo_csv" (the shared sample's form: CSV with a header),
    "avazu" (CSV, header); delimiter and header override the format's.
    """
    if name == "criteo":
        base = criteo_schema()
    elif name == "criteo_csv":
        base = criteo_schema(",", True)
    elif name == "avazu":
        base = avazu_schema()
    else:
        raise ValueError(f"unknown format {name!r}; known: criteo, criteo_csv, avazu, or a "
                         "schema spec")
    return dataclasses.replace(base, delimiter=base.delimiter if delimiter is None else delimiter,
                               header=base.header if header is None else header,
                               dense_limit=dense_limit)


# --------------------------------------------------------------------- TF parsing


def _days_from_civil(year, month, day):
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    year = year - tf.cast(month <= 2, tf.int64)
    era = tf.math.floordiv(year, 400)
    yoe = year - era * 400
    mp = tf.math.floormod(month + 9, 12)
    doy = tf.math.floordiv(153 * mp + 2, 5) + day - 1
    doe = yoe * 365 + tf.math.floordiv(yoe, 4) - tf.math.floordiv(yoe, 100) + doy
    return era * 146097 + doe - 719468


_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _yymmddhh_value(text: tf.Tensor, schema: Schema):
    """YYMMDDHH strings (of the pattern) -> (seconds since the epoch, whether the day
    exists in its month: the pattern lets Feb 30 or Apr 31 through)."""
    digits = tf.strings.to_number(text, tf.int64)
    year = 2000 + digits // 1000000
    month = digits // 10000 % 100
    day = digits // 100 % 100
    hour = digits % 100
    leap = tf.logical_and(tf.equal(year % 4, 0), tf.not_equal(year % 100, 0))
    leap = tf.logical_or(leap, tf.equal(year % 400, 0))
    length = tf.gather(tf.constant(_MONTH_DAYS, tf.int64), month - 1) + tf.cast(
        tf.logical_and(leap, tf.equal(month, 2)), tf.int64)
    seconds = _days_from_civil(year, month, day) * 86400 + hour * 3600
    return seconds, day <= length


def _uint64_parts(text: tf.Tensor):
    """Decimal strings -> (high 11 digits, low 9 digits) as int64, zero-padded to 20 digits.

    Strings that are not 1-20 digits give (0, 0)."""
    ok = tf.strings.regex_full_match(text, _PATTERNS["uint64"])
    text = tf.where(ok, text, tf.fill(tf.shape(text), "0"))
    length = tf.strings.length(text)
    padded = tf.strings.substr(tf.strings.join([tf.fill(tf.shape(text), "0" * 20), text]),
                               length, tf.fill(tf.shape(length), 20))
    high = tf.strings.to_number(tf.strings.substr(padded, 0, 11), tf.int64)
    low = tf.strings.to_number(tf.strings.substr(padded, 11, 9), tf.int64)
    return high, low


def _uint64_checks(text: tf.Tensor) -> tf.Tensor:
    """True where a 1-20 digit string is <= 2**64 - 1 = 18446744073 709551615."""
    high, low = _uint64_parts(text)
    return tf.logical_or(high < 18446744073,
                         tf.logical_and(tf.equal(high, 18446744073), low <= 709551615))


def _uint64_as_int64(text: tf.Tensor) -> tf.Tensor:
    """Decimal strings of 0..2**64-1 -> the int64 with the same bits."""
    high, low = _uint64_parts(text)
    value = tf.cast(high, tf.uint64) * tf.constant(10 ** 9, tf.uint64) + tf.cast(low, tf.uint64)
    return tf.bitcast(value, tf.int64)


def hash_categorical(values: tf.Tensor, feature_offsets: Sequence[int]) -> tf.Tensor:
    """string [B, S] -> int64 [B, S] IDs: feature index in the top 8 bits, FarmHash below."""
    hashed = tf.strings.to_hash_bucket_fast(values, 1 << HASH_BITS)
    salt = tf.constant([index << HASH_BITS for index in feature_offsets], tf.int64)
    return tf.bitwise.bitwise_or(hashed, salt)


def _salts(count: int) -> List[int]:
    # index << 56 as a signed int64 (indices >= 128 set the sign bit)
    return [index - MAX_CATEGORICAL if index >= MAX_CATEGORICAL // 2 else index
            for index in range(count)]


def _number(text: tf.Tensor, empty_is_zero: bool = False) -> tf.Tensor:
    """Number strings (of the pattern) -> float32 values; NaN for one too long to convert
    (to_number would fail the batch), so that no range check passes it. With
    `empty_is_zero`, an empty string is 0."""
    length = tf.strings.length(text)
    short = length <= MAX_NUMBER_CHARS
    if empty_is_zero:
        short = tf.logical_and(short, length > 0)
    value = tf.strings.to_number(tf.where(short, text, "nan"), tf.float32)
    return tf.where(tf.equal(length, 0), 0.0, value) if empty_is_zero else value


# Range checks are false for NaN; with this bound, also for an infinite value.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _label_value(text: tf.Tensor, schema: Schema):
    value = _number(text)
    return value, tf.logical_and(value >= 0.0, value <= 1.0)


def _dense_value(text: tf.Tensor, schema: Schema):
    value = _number(text, empty_is_zero=True)
    return value, tf.abs(value) <= min(schema.dense_limit, _FLOAT32_MAX)


def _uint64_value(text: tf.Tensor, schema: Schema):
    return _uint64_as_int64(text), _uint64_checks(text)


def _timestamp_value(text: tf.Tensor, schema: Schema):
    value = tf.strings.to_number(text, tf.int64)
    return value, tf.logical_and(value >= TIMESTAMP_RANGE[0], value <= TIMESTAMP_RANGE[1])


# Each kind's (value, valid) from strings that match its pattern; a categorical or skip
# field that matches its pattern is valid.
_VALUES = {"label": _label_value, "dense": _dense_value, "uint64": _uint64_value,
           "yymmddhh": _yymmddhh_value, "timestamp": _timestamp_value}
# A string of each kind's pattern, put in place of one that does not match before the
# value is computed, so that no conversion can fail.
_VALID = {"label": "0", "dense": "", "uint64": "0", "yymmddhh": "00010100", "timestamp": "0",
          "categorical": "", "skip": ""}


def _checked_columns(columns: List[tf.Tensor], schema: Schema, match: bool):
    """The columns' values by kind ({kind: [N, columns of the kind]}, categorical ones
    hashed to IDs) and each line's first column at fault (int32 [N], len(schema.columns)
    where none is).

    Args:
        columns: one string tensor [N] per column of the schema.
        match: check each field against its kind's pattern (the lines the one-regex check
            turned away); otherwise the fields are known to match.
    """
    ncols = len(schema.columns)
    first = tf.fill(tf.shape(columns[0]), ncols)
    values = {}
    for kind in KINDS:
        indices = schema.indices(kind)
        if not indices or (kind == "skip" and not match):
            continue
        text = tf.stack([columns[i] for i in indices], axis=1)
        ok = None
        if match:
            ok = tf.strings.regex_full_match(text, _PATTERNS[kind])
            text = tf.where(ok, text, _VALID[kind])
        if kind in _VALUES:
            text, valid = _VALUES[kind](text, schema)
            ok = valid if ok is None else tf.logical_and(ok, valid)
        elif kind == "categorical":
            # Hashed before the bad lines are masked out: int64s are cheaper to move
            text = hash_categorical(text, _salts(len(indices)))
        values[kind] = text
        if ok is not None:
            at_fault = tf.where(ok, ncols, tf.constant(indices, tf.int32))
            first = tf.minimum(first, tf.reduce_min(at_fault, axis=1))
    return values, first


def _first_bad_column(lines: tf.Tensor, schema: Schema) -> tf.Tensor:
    """int32 [N]: each line's first column at fault, or -1 for a wrong field count. Used on
    the few lines the one-regex check turned away."""
    ncols = len(schema.columns)
    fields = 1 + tf.strings.length(lines) - tf.strings.length(
        tf.strings.regex_replace(lines, _escaped(schema.delimiter), ""))
    right = tf.equal(fields, ncols)
    # Only lines of the right field count are split: a line of a million delimiters must
    # not become a million strings.
    split = tf.strings.split(tf.where(right, lines, ""), sep=schema.delimiter)
    table = split.to_tensor(default_value="", shape=[None, ncols])
    _, first = _checked_columns([table[:, i] for i in range(ncols)], schema, match=True)
    return tf.where(right, first, -1)


def _escaped(delimiter: str) -> str:
    return f"\\x{{{ord(delimiter):x}}}"


def _line_pattern(schema: Schema) -> str:
    """One RE2 pattern a good line matches whole (the values' ranges are checked apart)."""
    delimiter = _escaped(schema.delimiter)
    parts = []
    for column in schema.columns:
        pattern = _PATTERNS[column.kind]
        if column.kind in ("categorical", "skip"):
            pattern = f"[^{delimiter}{_TEXT}]*"
        parts.append(f"(?:{pattern})")
    return delimiter.join(parts)


@tf.autograph.experimental.do_not_convert
def parse_lines(lines: tf.Tensor, file_index: tf.Tensor, line_number: tf.Tensor,
                schema: Schema) -> Dict[str, tf.Tensor]:
    """A batch of lines -> the dict described in the module docstring.

    Good lines are recognised by one regular expression per line, split by
    `tf.io.decode_csv` into strings (quotes are ordinary characters) and converted with
    their ranges checked; only the lines the expression turns away are checked column by
    column, to name the column at fault.

    Args:
        lines: string [B].
        file_index: int32 [B], each line's file (for the report).
        line_number: int64 [B], each line's number in its file (1-based).
    """
    ncols = len(schema.columns)
    matched = tf.strings.regex_full_match(lines, _line_pattern(schema))
    turned_away = tf.logical_not(matched)
    columns = tf.io.decode_csv(tf.boolean_mask(lines, matched), [[""]] * ncols,
                               field_delim=schema.delimiter, use_quote_delim=False)
    values, first_matched = _checked_columns(columns, schema, match=False)
    position = tf.range(tf.shape(lines)[0])
    first_bad = tf.dynamic_stitch(
        [tf.boolean_mask(position, matched), tf.boolean_mask(position, turned_away)],
        [first_matched, _first_bad_column(tf.boolean_mask(lines, turned_away), schema)])
    bad = tf.logical_or(turned_away, tf.not_equal(first_bad, ncols))
    out = {
        "bad_file": tf.boolean_mask(file_index, bad),
        "bad_line": tf.boolean_mask(line_number, bad),
        "bad_column": tf.boolean_mask(first_bad, bad),
        "lines": tf.cast(tf.size(lines), tf.int64),
    }
    good = tf.equal(first_matched, ncols)
    kept = {kind: tf.boolean_mask(value, good) for kind, value in values.items()}
    out["label"] = kept["label"][:, 0]
    if "dense" in kept:
        out["dense"] = kept["dense"]
    if "categorical" in kept:
        out["sparse"] = kept["categorical"]
    if "uint64" in kept:
        out["row_id"] = kept["uint64"][:, 0]
    for kind in ("yymmddhh", "timestamp"):
        if kind in kept:
            out["time"] = kept[kind][:, 0]
    return out


def _model_features(dense: List[tf.Tensor], categorical: List[tf.Tensor]) -> Dict[str, tf.Tensor]:
    """"dense" float32 [B, D] and "sparse" int64 [B, S] from the columns' values [B] each."""
    out = {}
    if dense:
        out["dense"] = tf.stack(dense, axis=1)
    if categorical:
        out["sparse"] = hash_categorical(tf.stack(categorical, axis=1), _salts(len(categorical)))
    return out


def raw_feature_inputs(schema: Schema) -> Dict[str, tf.Tensor]:
    """Placeholders [None] for a model's columns as they appear in the data, by column name:
    string for each categorical column (its text), float32 for each dense one (its value)."""
    inputs = {}
    for column in schema.columns:
        if column.kind in ("categorical", "dense"):
            inputs[column.name] = tf.compat.v1.placeholder(
                tf.string if column.kind == "categorical" else tf.float32, [None],
                name=f"raw_{column.kind}")
    return inputs


def features_from_raw(columns: Dict[str, tf.Tensor], schema: Schema) -> Dict[str, tf.Tensor]:
    """The model's features ("sparse", "dense") from raw column values, by the same ops as
    `parse_lines` (salted FarmHash of each categorical column's text), so a serving graph
    built on `raw_feature_inputs` looks up the rows training did.

    Args:
        columns: {column name: tensor [B]}: string for categorical columns, float32 for
            dense ones (`raw_feature_inputs`).
    """
    return _model_features([columns[name] for name in schema.names("dense")],
                           [columns[name] for name in schema.names("categorical")])


def make_dataset(files: Union[Sequence[str], tf.Tensor], schema: Schema, batch_size: int,
                 num_parallel_calls: int = tf.data.AUTOTUNE, prefetch: int = 2,
                 rank: int = 0, size: int = 1) -> tf.data.Dataset:
    """Batches of parsed records from `files`, read in order, line numbers kept.

    Batches do not span files: a file's last batch may be smaller.

    Args:
        files: file names, or a string tensor [N] of them (a placeholder: one graph for
            every partition).
        schema: the records' columns (CRITEO_TSV, AVAZU_CSV, parse_schema_spec(...)).
        batch_size: lines per batch (malformed lines are dropped from their batch).
        rank, size: several ranks: each batch of `batch_size` lines (the global batch,
            as one process reads it) is cut into `size` contiguous slices, lines
            [n * rank // size, n * (rank + 1) // size) of its n going to rank `rank`, and
            only that slice is parsed. Every rank yields as many batches as one process
            (a slice may be empty: fewer lines than ranks), so the ranks run the same steps
            and their slices together are one process's batch.
    """
    if batch_size < 1:
        raise ValueError(f"make_dataset: batch_size must be >= 1, got {batch_size}")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"make_dataset: rank must be in [0, size) and size >= 1, got rank "
                         f"{rank} of {size}")
    files = tf.convert_to_tensor(files, tf.string)
    count = tf.shape(files, out_type=tf.int32)[0]
    dataset = tf.data.Dataset.from_tensor_slices((files, tf.range(count))).flat_map(
        lambda name, index: _file_batches(name, index, schema, batch_size, rank, size))
    dataset = dataset.map(lambda line, index, n: parse_lines(line, index, n, schema),
                          num_parallel_calls=num_parallel_calls, deterministic=True)
    return dataset.prefetch(prefetch)


def _file_batches(name, index, schema: Schema, batch_size: int, rank: int, size: int):
    """One file's batches of (lines, file index, line numbers), this rank's slice of each.

    Batched per file, so line numbers come per batch (no per-record work): every batch but
    the file's last is full."""
    first_line = 2 if schema.header else 1
    lines = tf.data.TextLineDataset(name)
    if schema.header:
        lines = lines.skip(1)

    def numbered(k, batch):
        n = tf.shape(batch, out_type=tf.int64)[0]
        first = k * batch_size + first_line
        return batch, tf.fill(tf.shape(batch), index), tf.range(first, first + n)

    def own_slice(batch, file_index, numbers):
        n = tf.shape(batch, out_type=tf.int64)[0]
        start, end = n * rank // size, n * (rank + 1) // size
        return batch[start:end], file_index[start:end], numbers[start:end]

    batches = lines.batch(batch_size).enumerate().map(numbered)
    return batches if size == 1 else batches.map(own_slice)


COUNT_PIECE = 4 << 20  # count_lines reads files in pieces of this many bytes


def count_lines(path: str, header: bool = False) -> int:
    """The records TextLineDataset yields for `path` (lines split at \\n, a last line
    without one counted, the header line left out when `header`), read in COUNT_PIECE
    pieces: a local file into one reused buffer (no bytes object per piece; half the time
    of a GFile read), a path with a scheme (hdfs://, gs://) through tf.io.gfile."""
    lines, last = 0, b"\n"
    local = None
    if "://" not in path:
        try:
            local = open(path, "rb", buffering=0)  # noqa: SIM115 (closed below)
        except OSError:
            local = None  # tf.io.gfile raises TensorFlow's error for it (NotFoundError, ...)
    if local is None:
        with tf.io.gfile.GFile(path, "rb") as f:
            while True:
                piece = f.read(COUNT_PIECE)
                if not piece:
                    break
                lines += piece.count(b"\n")
                last = piece[-1:]
    else:
        buffer = bytearray(COUNT_PIECE)
        with local as f:
            while True:
                size = f.readinto(buffer)
                if not size:
                    break
                lines += (buffer if size == len(buffer) else buffer[:size]).count(b"\n")
                last = buffer[size - 1:size]
    lines += last != b"\n"
    return max(lines - 1, 0) if header else lines


def batch_lines(lines: int, batch_size: int, rank: int = 0, size: int = 1) -> List[int]:
    """The lines of each batch make_dataset yields for a file of `lines` records, this
    rank's slice of each (the same number of batches on every rank)."""
    if lines < 0 or batch_size < 1:
        raise ValueError(f"batch_lines: lines must be >= 0 and batch_size >= 1, got {lines}, "
                         f"{batch_size}")
    sizes = [batch_size] * (lines // batch_size) + ([lines % batch_size] if lines % batch_size
                                                     else [])
    return [n * (rank + 1) // size - n * rank // size for n in sizes]


class BadLineCounter:
    """Counts the malformed lines of one partition and fails past a limit.

    Args:
        files: the partition's files (bad_file indexes them).
        schema: for column names in messages.
        limit: malformed lines allowed per partition; one more raises MalformedDataError.
        keep: messages kept for the report.
    """

    def __init__(self, files: Sequence[str], schema: Schema, limit: int, keep: int = 20):
        if limit < 0:
            raise ValueError(f"bad-line limit must be >= 0, got {limit}")
        self.files = list(files)
        self.schema = schema
        self.limit = limit
        self.keep = keep
        self.count = 0
        self.messages: List[str] = []

    def message(self, file_index: int, line: int, column: int) -> str:
        where = f"{self.files[file_index]}:{line}"
        if column < 0:
            return f"{where}: not {len(self.schema.columns)} fields"
        col = self.schema.columns[column]
        return f"{where}: column {col.name} is not a valid {col.kind} value: {self.rule(col.kind)}"

    def rule(self, kind: str) -> str:
        """What a field of `kind` must be, for messages."""
        number = f"of at most {MAX_NUMBER_CHARS} characters"
        return {
            "label": f"a number {number} in [0, 1]",
            "dense": f"empty, or a finite number {number} with |x| <= "
                     f"{self.schema.dense_limit:g} (the schema's dense_limit, --dense-limit)",
            "uint64": "a decimal integer in [0, 2**64 - 1]",
            "yymmddhh": "YYMMDDHH: a date that exists and an hour 00-23",
            "timestamp": f"seconds since the epoch in [{TIMESTAMP_RANGE[0]}, "
                         f"{TIMESTAMP_RANGE[1]}]",
        }.get(kind, "UTF-8 text without NUL bytes or line breaks")

    def add(self, bad_file, bad_line, bad_column) -> None:
        """Records a batch's malformed lines; raises MalformedDataError past the limit."""
        for f, n, c in zip(bad_file.tolist(), bad_line.tolist(), bad_column.tolist()):
            self.count += 1
            text = self.message(f, n, c)
            if len(self.messages) < self.keep:
                self.messages.append(text)
            if self.count > self.limit:
                raise MalformedDataError(
                    f"more than {self.limit} malformed lines in the partition (set "
                    f"--max_bad_lines to allow more); this one: {text}; earlier: "
                    f"{self.messages[:5]}")


__all__ = ["Column", "Schema", "CRITEO_TSV", "AVAZU_CSV", "criteo_schema", "avazu_schema",
           "parse_schema_spec", "named_schema", "parse_lines", "make_dataset", "hash_categorical",
           "BadLineCounter", "MalformedDataError", "HASH_BITS", "raw_feature_inputs",
           "features_from_raw", "DEFAULT_DENSE_LIMIT", "MAX_NUMBER_CHARS", "TIMESTAMP_RANGE"]
