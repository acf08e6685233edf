"""Predict requests of TF Serving's REST API, parsed against the signature they name.

    {"signature_name": S, "instances": [{input: value, ...}, ...]}    row format
    {"signature_name": S, "inputs": {input: [value, ...], ...}}       columnar format

Each input is converted to exactly its signature's dtype and checked against its
shape; nothing is guessed:

    int64    JSON integers in [-2**63, 2**63 - 1] only, exact over the whole range (JSON
             integers are parsed as Python ints, never through a float); floats (1.5,
             1.0, 1e3), booleans, strings ("12") and null are refused
    float32  finite JSON numbers inside float32's range only; NaN, Infinity and
             values that overflow float32 (1e39) are refused
    string   JSON strings (UTF-8) or TF Serving's {"b64": "<base64>"} objects only
    bool     true / false only

A refusal is a `RequestError` (status 400, or 413/411 for the body) whose message
names the input, the instance (row) and the value expected; `signature_name` must be
one of the model's signatures (no fallback to the default).

Example:
    >>> body = parse_json(b'{"instances": [{"sparse": [1, 2, 3], "dense": [0.5, 2]}]}')
    >>> name, feeds = to_feeds(body, {"serving_default": specs}, "serving_default")
    >>> feeds["sparse"]        # int64 [1, 3]
"""

import base64
import binascii
import itertools
import json
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

try:
    # A C parser and writer for the REST body (python -m pip install orjson; scripts/setup.sh
    # installs it): a predict body of 64 rows of Criteo IDs and floats is read in a third of
    # the standard library's time or less. Without it the standard library reads and writes
    # the same values, slower.
    import orjson
except ImportError:  # pragma: no cover (scripts/setup.sh installs it)
    orjson = None

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SHOWN_DIGITS = 20


class RequestError(ValueError):
    """A request refused with an HTTP status and a message naming what is wrong (4xx; the
    server also answers 503 and 504 with it: busy, or past the request's deadline)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def check_integers(*settings: Tuple[str, object, int, Optional[int]]) -> None:
    """Checks a server's integer settings, each (name, value, least, most): an int (not a
    bool) in [least, most], with no upper bound where most is None.

    Raises:
        ValueError: naming the first setting out of range and its bounds.

    Example:
        >>> check_integers(("num_threads", 8, 1, None), ("port", 8500, 0, 65535))
    """
    for name, value, least, most in settings:
        if type(value) is int and least <= value and (most is None or value <= most):
            continue
        bounds = f">= {least}" if most is None else f"in [{least}, {most}]"
        raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")


class InputSpec:
    """One signature input: name, numpy dtype and shape (None for unknown sizes).

    The first dimension is the batch.
    """

    def __init__(self, name: str, dtype, shape: Optional[Sequence[Optional[int]]]):
        if shape is None:
            raise ValueError(f"input {name!r} has an unknown rank; the predictor checks "
                             "requests against a known rank")
        self.name = name
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        if not self.shape:
            raise ValueError(f"input {name!r}: scalar (rank 0) inputs are not batched; "
                             "the predictor needs a batch dimension")
        if self.dtype.kind not in "iufbOSU":
            raise ValueError(f"input {name!r}: dtype {self.dtype} is not supported")
        # Made once per loaded version, so that a request's arrays are checked in a few
        # comparisons (`fits`).
        self.is_string = self.dtype.kind in "OSU"
        self.is_float = self.dtype.kind == "f"
        self._fixed = tuple((i, d) for i, d in enumerate(self.shape) if d is not None)

    def fits(self, value: np.ndarray) -> bool:
        """Whether an array has exactly this input's dtype (any string dtype for a string
        input) and a shape this input takes."""
        if not (value.dtype.kind in "OSU" if self.is_string else value.dtype == self.dtype):
            return False
        shape = value.shape
        return len(shape) == len(self.shape) and all(shape[i] == d for i, d in self._fixed)

    @property
    def kind(self) -> str:
        if self.dtype.kind in "OSU":
            return "string"
        return {"i": "int", "u": "int", "f": "float", "b": "bool"}[self.dtype.kind]

    def expected(self) -> str:
        if self.kind == "int":
            info = np.iinfo(self.dtype)
            return f"a JSON integer in {self.dtype.name}'s range [{info.min}, {info.max}]"
        if self.kind == "float":
            return f"a finite JSON number within {self.dtype.name}'s range"
        if self.kind == "bool":
            return "true or false"
        return 'a JSON string (or {"b64": base64 text})'

    def row_shape(self) -> str:
        dims = ["?" if d is None else str(d) for d in self.shape[1:]]
        return "a scalar" if not dims else f"a nested list of shape [{', '.join(dims)}]"


class _Constant:
    """NaN, Infinity or -Infinity in the body (not JSON, but Python's parser reads them)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def parse_json(data: bytes, exact: bool = False):
    """The body as JSON; integers stay exact (Python ints: JSON integers are never read
    through a float), NaN/Infinity are kept as markers to refuse.

    With orjson installed (and not `exact`), orjson reads it first, and what orjson refuses
    (NaN, Infinity, nesting past 1024 levels, a body that is no JSON) is read by the
    standard library's parser, which reads it as above or says what is wrong. orjson reads
    an integer beyond 64 bits as a float: `to_feeds(..., data=)` reads a body it refuses
    again with `exact`, so that the refusal names the value as sent.

    Raises:
        RequestError: not UTF-8, not JSON, or nested deeper than the parser allows.
    """
    if orjson is not None and not exact:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the standard library's parser reads it, or says what is wrong with it
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"the body is not UTF-8: {error}") from None
    try:
        return json.loads(text, parse_constant=_Constant)
    except RecursionError:
        raise RequestError("the body is JSON nested too deep (a predict request needs only "
                           "as many levels as its inputs' ranks plus two)") from None
    except ValueError as error:
        raise RequestError(f"the body is not valid JSON: {error}") from None


def _describe(value) -> str:
    if isinstance(value, str):
        if len(value) <= 40:
            return f"the string {value!r}"
        return f"a string of {len(value)} characters ({value[:20]!r}...)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    if type(value) is int and abs(value) >= 10 ** _SHOWN_DIGITS:
        text = str(value)
        return f"{text[:_SHOWN_DIGITS]}... ({len(text.lstrip('-'))} digits)"
    return repr(value)


def _where(spec: InputSpec, row_word: str, row: int, position: Tuple[int, ...]) -> str:
    at = f"input {spec.name!r}, {row_word} {row}"
    if position:
        at += ", position [" + ", ".join(map(str, position)) + "]"
    return at


def _structure(spec: InputSpec, rows: list, row_word: str) -> Tuple[list, Tuple[int, ...]]:
    """Flattens rows of nested lists to the leaves, checking every level's length.

    Returns (leaves, per-row shape)."""
    level = rows
    shape: List[int] = []
    for depth, wanted in enumerate(spec.shape[1:]):
        size = wanted
        if size is None and level and isinstance(level[0], list):
            size = len(level[0])
        # One pass over a well-formed level; a bad one is walked again to say where.
        if not all(isinstance(item, list) and len(item) == size for item in level):
            _structure_error(spec, level, row_word, shape, depth, wanted, size)
        shape.append(size if size is not None else 0)
        level = list(itertools.chain.from_iterable(level))
    return level, tuple(shape)


def _structure_error(spec: InputSpec, level: list, row_word: str, shape: List[int],
                     depth: int, wanted: Optional[int], size: Optional[int]):
    """Raises the error for the first item of `level` that is not a list of `size`."""
    per_row = int(np.prod(shape)) if shape else 1
    for index, item in enumerate(level):
        row, rest = divmod(index, per_row)
        if not isinstance(item, list):
            raise RequestError(
                f"{_where(spec, row_word, row, _unravel(rest, shape))}: expected "
                f"{spec.row_shape()} per {row_word}, got {_describe(item)} at depth "
                f"{depth + 1}")
        if len(item) != size:
            reference = ("the signature says" if wanted is not None
                         else "the first list at this depth has")
            raise RequestError(
                f"{_where(spec, row_word, row, _unravel(rest, shape))}: expected "
                f"{spec.row_shape()} per {row_word}, got a list of {len(item)} at depth "
                f"{depth + 1} ({reference} {size})")


def _unravel(flat: int, shape: Sequence[int]) -> Tuple[int, ...]:
    if not shape or not all(shape):
        return ()
    return tuple(int(i) for i in np.unravel_index(flat, shape))


def _leaf_error(spec: InputSpec, row_word: str, leaves: list, shape, index: int,
                why: str = "") -> RequestError:
    per_row = int(np.prod(shape)) if shape else 1
    row, rest = divmod(index, per_row)
    got = _describe(leaves[index])
    return RequestError(f"{_where(spec, row_word, row, _unravel(rest, shape))}: expected "
                        f"{spec.expected()}, got {got}{why}")


def _first(leaves: list, test) -> int:
    return next(i for i, v in enumerate(leaves) if test(v))


def _convert(spec: InputSpec, rows: list, row_word: str) -> np.ndarray:
    """rows (one entry per batch row) -> an array of spec's dtype, [batch, *row shape]."""
    leaves, shape = _structure(spec, rows, row_word)
    types = set(map(type, leaves))
    kind = spec.kind
    if kind == "int":
        if not types <= {int}:
            return _raise(_leaf_error(spec, row_word, leaves, shape,
                                      _first(leaves, lambda v: type(v) is not int)))
        info = np.iinfo(spec.dtype)
        try:
            # int64 (every ID input): NumPy's conversion refuses what does not fit, so
            # no separate pass for the range.
            values = np.fromiter(leaves, np.int64, len(leaves)) \
                if spec.dtype == np.int64 else None
        except OverflowError:
            values = None
        if values is None and leaves and not info.min <= min(leaves) <= max(leaves) \
                <= info.max:
            return _raise(_leaf_error(spec, row_word, leaves, shape, _first(
                leaves, lambda v: not info.min <= v <= info.max), " (out of range)"))
        if values is None:
            values = np.array(leaves, dtype=spec.dtype)
    elif kind == "float":
        if not types <= {int, float}:
            return _raise(_leaf_error(spec, row_word, leaves, shape, _first(
                leaves, lambda v: type(v) not in (int, float))))
        try:
            wide = np.fromiter(leaves, np.float64, len(leaves))
        except OverflowError:  # an integer beyond float64
            return _raise(_leaf_error(spec, row_word, leaves, shape, _first(
                leaves, lambda v: type(v) is int and abs(v) > 1e308), " (not finite)"))
        with np.errstate(over="ignore", invalid="ignore"):
            values = wide.astype(spec.dtype)
        bad = ~np.isfinite(values)
        if bad.any():
            index = int(np.argmax(bad))
            why = " (not finite)" if not math.isfinite(wide[index]) else \
                f" (outside {spec.dtype.name}'s range, |x| <= {np.finfo(spec.dtype).max:.7g})"
            return _raise(_leaf_error(spec, row_word, leaves, shape, index, why))
    elif kind == "bool":
        if not types <= {bool}:
            return _raise(_leaf_error(spec, row_word, leaves, shape,
                                      _first(leaves, lambda v: type(v) is not bool)))
        values = np.array(leaves, dtype=bool)
    else:
        values = np.empty(len(leaves), dtype=object)
        values[:] = _bytes(spec, row_word, leaves, shape, types <= {str})
    return values.reshape((len(rows),) + shape)


def _bytes(spec: InputSpec, row_word: str, leaves: list, shape,
           only_strings: bool = False) -> List[bytes]:
    """Strings and TF Serving's {"b64": "..."} objects as bytes."""
    if only_strings:
        try:
            return [v.encode("utf-8") for v in leaves]
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"), named below
            pass
    out = []
    for index, value in enumerate(leaves):
        if type(value) is str:
            try:
                out.append(value.encode("utf-8"))
            except UnicodeEncodeError as error:
                raise _leaf_error(spec, row_word, leaves, shape, index,
                                  f" (not text: {error.reason})") from None
        elif type(value) is dict and set(value) == {"b64"} and type(value["b64"]) is str:
            try:
                out.append(base64.b64decode(value["b64"], validate=True))
            except binascii.Error as error:
                raise _leaf_error(spec, row_word, leaves, shape, index,
                                  f" (not base64: {error})") from None
        else:
            raise _leaf_error(spec, row_word, leaves, shape, index)
    return out


def _raise(error: RequestError):
    raise error


def _check_names(got: Mapping, specs: Mapping[str, InputSpec], where: str) -> None:
    missing = sorted(set(specs) - set(got))
    unknown = sorted(set(got) - set(specs))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unknown {unknown}")
        raise RequestError(f"{where}: the inputs must be {sorted(specs)}; "
                           + ", ".join(parts))


def _single_or_named(value, specs: Mapping[str, InputSpec], where: str) -> Dict:
    if isinstance(value, dict):
        return value
    if len(specs) == 1:  # TF Serving: a model with one input takes its values bare
        return {next(iter(specs)): value}
    raise RequestError(f"{where} must be an object {{input: value}}: the signature has "
                       f"inputs {sorted(specs)}, got {_describe(value)}")


def signature_specs(signatures: Mapping[str, Mapping[str, InputSpec]], name: str,
                    default_signature: str) -> Tuple[str, Mapping[str, InputSpec]]:
    """(name, input specs) of the signature a request names ("": the default one, as TF
    Serving reads an empty signature_name).

    Raises:
        RequestError: the model has no signature of that name.
    """
    name = name or default_signature
    if name not in signatures:
        raise RequestError(f"unknown signature_name {name!r}; this model has "
                           f"{sorted(signatures)}")
    return name, signatures[name]


def check_arrays(feeds: Mapping[str, np.ndarray], specs: Mapping[str, InputSpec],
                 where: str = "the request") -> None:
    """Checks typed arrays (a gRPC request's tensors) as `to_feeds` checks JSON: the input
    names, each array's dtype and shape against its signature, one batch size for all, no
    empty batch, finite floats.

    Raises:
        RequestError: naming the input and what was expected.
    """
    if feeds.keys() != specs.keys():
        _check_names(feeds, specs, where)
    sizes = set()
    for key, spec in sorted(specs.items()):
        value = feeds[key]
        if not spec.fits(value):
            _check_array(key, spec, value)
        if value.shape[0] == 0:
            raise RequestError(f"input {key!r}: the batch is empty; send at least one row")
        if spec.is_float and not np.isfinite(value).all():
            index = _first_bad_float(value)
            position = [int(i) for i in np.unravel_index(index, value.shape)]
            raise RequestError(f"input {key!r}, row {position[0]}, position "
                               f"{position[1:]}: expected {spec.expected()}, got "
                               f"{value.reshape(-1)[index]} (not finite)")
        sizes.add(value.shape[0])
    if len(sizes) > 1:
        sizes = {key: feeds[key].shape[0] for key in sorted(specs)}
        raise RequestError(f"the inputs have different batch sizes {sizes}; every input "
                           "needs one entry per row")


def _check_array(key: str, spec: InputSpec, value: np.ndarray) -> None:
    """The refusal of an array `spec.fits` did not take: its dtype or its shape (an array of
    the signature's dtype in another byte order passes)."""
    if not (value.dtype.kind in "OSU" if spec.kind == "string" else value.dtype == spec.dtype):
        wanted = "string" if spec.kind == "string" else spec.dtype.name
        got = "string" if value.dtype.kind in "OSU" else value.dtype.name
        if got != wanted:
            raise RequestError(f"input {key!r}: expected {wanted} values, got {got}")
    fits = value.ndim == len(spec.shape) and all(
        d is None or d == n for d, n in zip(spec.shape, value.shape))
    if not fits:
        dims = ["?" if d is None else str(d) for d in spec.shape]
        raise RequestError(f"input {key!r}: expected shape [{', '.join(dims)}] (the first "
                           f"dimension is the batch), got {list(value.shape)}")


def _first_bad_float(value: np.ndarray) -> Optional[int]:
    bad = ~np.isfinite(value)
    return int(np.argmax(bad.reshape(-1))) if bad.any() else None


def to_feeds(body, signatures: Mapping[str, Mapping[str, InputSpec]],
             default_signature: str,
             data: Optional[bytes] = None) -> Tuple[str, Dict[str, np.ndarray], bool]:
    """(signature name, {input: array}, row format?) of a parsed predict body.

    Args:
        body: the parsed body (`parse_json`).
        signatures: {signature: {input: InputSpec}}.
        default_signature: the signature of a body that names none.
        data: the bytes `body` was parsed from; a body refused after orjson read it is read
            again exactly (`parse_json(data, exact=True)`) and the refusal is that reading's,
            so that it names the value as sent (orjson reads an integer beyond 64 bits as a
            float).

    Raises:
        RequestError: the body does not match the signature (the message says where).
    """
    try:
        return _to_feeds(body, signatures, default_signature)
    except RequestError:
        if data is None or orjson is None:
            raise
    return _to_feeds(parse_json(data, exact=True), signatures, default_signature)


def _to_feeds(body, signatures: Mapping[str, Mapping[str, InputSpec]],
              default_signature: str) -> Tuple[str, Dict[str, np.ndarray], bool]:
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {_describe(body)}")
    unknown = sorted(set(body) - {"signature_name", "instances", "inputs"})
    if unknown:
        raise RequestError(f"unknown keys {unknown} in the body; a predict request has "
                           "'instances' or 'inputs', and optionally 'signature_name'")
    if ("instances" in body) == ("inputs" in body):
        raise RequestError("the body must have exactly one of 'instances' (row format) or "
                           "'inputs' (columnar format)")
    name = body.get("signature_name", default_signature)
    if not isinstance(name, str):
        raise RequestError(f"'signature_name' must be a string, got {_describe(name)}")
    name, specs = signature_specs(signatures, name, default_signature)
    if "instances" in body:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise RequestError(f"'instances' must be a non-empty list, got "
                               f"{_describe(instances)}")
        rows = [_single_or_named(item, specs, f"instance {i}")
                for i, item in enumerate(instances)]
        for i, row in enumerate(rows):
            _check_names(row, specs, f"instance {i}")
        feeds = {key: _convert(spec, [row[key] for row in rows], "instance")
                 for key, spec in specs.items()}
        return name, feeds, True
    inputs = _single_or_named(body["inputs"], specs, "'inputs'")
    _check_names(inputs, specs, "'inputs'")
    sizes = {}
    for key, spec in specs.items():
        value = inputs[key]
        if not isinstance(value, list) or not value:
            raise RequestError(f"input {key!r}: expected a non-empty list (one entry per row, "
                               f"each {spec.row_shape()}), got {_describe(value)}")
        sizes[key] = len(value)
    if len(set(sizes.values())) > 1:
        raise RequestError(f"the inputs have different batch sizes {dict(sorted(sizes.items()))}"
                           "; every input needs one entry per row")
    feeds = {key: _convert(spec, inputs[key], "row") for key, spec in specs.items()}
    return name, feeds, False


def outputs_to_json(outputs: Mapping[str, np.ndarray], row_format: bool) -> Dict:
    """TF Serving's answer: {"predictions": ...} (row format) or {"outputs": ...}.

    Raises:
        ValueError: an output is not finite (JSON has no NaN or Infinity).
    """
    for key, value in outputs.items():
        value = np.asarray(value)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            rows = np.unique(np.nonzero(~np.isfinite(value))[0])[:10].tolist()
            raise ValueError(f"the model's output {key!r} is not finite (NaN or Infinity) "
                             f"for rows {rows}")
    lists = {k: _jsonable(v) for k, v in outputs.items()}
    if not row_format:
        return {"outputs": lists}
    names = sorted(lists)
    if len(names) == 1:
        return {"predictions": lists[names[0]]}
    count = len(next(iter(lists.values())))
    return {"predictions": [{k: lists[k][i] for k in names} for i in range(count)]}


def answer_json(outputs: Mapping[str, np.ndarray], row_format: bool) -> bytes:
    """`outputs_to_json`'s answer as JSON bytes (orjson where installed: its floats are
    checked finite first, so orjson never writes one as null; the standard library's writer
    for what orjson does not write, such as strings that are not UTF-8).

    Raises:
        ValueError: an output is not finite (JSON has no NaN or Infinity).
    """
    body = outputs_to_json(outputs, row_format)
    if orjson is not None:
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(body, allow_nan=False).encode()


def _jsonable(value):
    value = np.asarray(value)
    if value.dtype.kind in "OS":
        return np.vectorize(lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes)
                            else str(b), otypes=[object])(value).tolist()
    return value.tolist()


__all__ = ["RequestError", "InputSpec", "check_integers", "parse_json", "to_feeds",
           "outputs_to_json", "answer_json", "signature_specs", "check_arrays",
           "INT64_MIN", "INT64_MAX"]
