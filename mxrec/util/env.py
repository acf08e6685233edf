"""Settings read from the environment, checked where they are read."""

import os


def seconds(name: str, default: float, allow_zero: bool = False) -> float:
    """The number of seconds in environment variable `name`, or `default` when it is unset or
    empty. A value that is not a number (NaN included), is negative, or is zero where
    `allow_zero` is False raises ValueError naming the variable and the value; "inf" is
    accepted (no limit)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value != value:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} 0, got {raw!r}")
    return value
