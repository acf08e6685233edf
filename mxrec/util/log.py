"""mx_rec's `mx_rec.util.log.logger`: one `logging.Logger` for scripts and mxrec.

The level comes from the environment variable MXREC_LOG_LEVEL (mx_rec's name:
DEBUG, INFO, WARNING or ERROR; INFO when unset); messages go to stderr with the
time, level, file and line.

Example:
    >>> from mxrec.util.log import logger
    >>> logger.info("step %d: loss %.4f", step, loss)
"""

import logging
import os
import sys

ENV_LOG_LEVEL = "MXREC_LOG_LEVEL"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _level() -> int:
    raw = os.environ.get(ENV_LOG_LEVEL, "INFO").strip().upper() or "INFO"
    if raw not in _LEVELS:
        raise ValueError(f"environment variable {ENV_LOG_LEVEL} must be one of {list(_LEVELS)}, "
                         f"got {raw!r}")
    return getattr(logging, raw)


def _make_logger() -> logging.Logger:
    log = logging.getLogger("mxrec")
    log.setLevel(_level())
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d] %(message)s"))
        log.addHandler(handler)
    log.propagate = False
    return log


logger = _make_logger()


def get_logger(log_level: str) -> logging.Logger:
    """mx_rec's `get_logger(log_level)`: the one logger (`logger`), set to `log_level`.

    Raises:
        ValueError: log_level is not one of DEBUG, INFO, WARNING, ERROR (mx_rec's names).
    """
    if log_level not in _LEVELS:
        raise ValueError(f"get_logger: log_level must be one of {list(_LEVELS)}, got "
                         f"{log_level!r}")
    logger.setLevel(getattr(logging, log_level))
    return logger
