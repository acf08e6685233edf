"""TensorFlow's thread settings for the predictor's sessions, as TF Serving names them.

    --tensorflow_intra_op_parallelism N   threads one op may split its work over
    --tensorflow_inter_op_parallelism N   ops of one run executed at once
    --tensorflow_session_parallelism N    both (TF Serving's older flag; mxrec's --threads)

Each value goes into the `ConfigProto` of every loaded version's session, with TensorFlow's
meaning: 0 is TensorFlow's default (one thread per core), and an inter-op value of -1 runs
every op of a request's run in the thread that answers the request, instead of handing the
ops to TensorFlow's inter-op pool and waking a pool thread for each run. For a small model
answered one request at a time that hand-off is a large part of the run; with many
concurrent requests the handler threads (`--rest-api-num-threads`, `--grpc-num-threads`)
are then the only parallelism between requests.

TensorFlow builds one intra-op pool and one inter-op pool per process, sized by the first
session: every version of the predictor gets the same settings, so the pools are the ones
asked for. A run in the caller's thread is not interrupted at its deadline (TensorFlow
checks a run's timeout only from another thread); the predictor still answers a call that
finished past its deadline with DEADLINE_EXCEEDED (REST: 504).

TF Serving applies an inter-op value of -1 only when one of the two flags is above 0; here
it always applies.

Example:
    >>> threads = SessionThreads(intra_op=1, inter_op=-1)
    >>> threads.config().inter_op_parallelism_threads      # -1: the request's own thread
    >>> SessionThreads.of(4)                                # --threads 4: both pools
"""

import dataclasses
from typing import Union

INTRA_FLAG = "--tensorflow_intra_op_parallelism"
INTER_FLAG = "--tensorflow_inter_op_parallelism"
BOTH_FLAG = "--tensorflow_session_parallelism"
# Thread counts beyond this are a typo, not a machine (TensorFlow's field is an int32).
MAX_THREADS = 1 << 14


@dataclasses.dataclass(frozen=True)
class SessionThreads:
    """The thread settings of the predictor's sessions.

    Args:
        intra_op: threads one op may split its work over (0: TensorFlow's default).
        inter_op: ops of one run executed at once (0: TensorFlow's default; -1: every op
            in the thread answering the request).

    Raises:
        ValueError: a value out of range, naming its flag.
        TypeError: a value that is not an integer, naming its flag.
    """

    intra_op: int = 0
    inter_op: int = 0

    def __post_init__(self):
        for flag, value, low in ((INTRA_FLAG, self.intra_op, 0),
                                 (INTER_FLAG, self.inter_op, -1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{flag} must be an integer, got {value!r}")
            if not low <= value <= MAX_THREADS:
                meaning = ("0: TensorFlow's default" if low == 0 else
                           "0: TensorFlow's default; -1: run in the request's thread")
                raise ValueError(f"{flag} must be {low} to {MAX_THREADS} ({meaning}), "
                                 f"got {value}")

    @classmethod
    def of(cls, threads: Union[int, "SessionThreads"]) -> "SessionThreads":
        """`threads` itself, or an integer N as both settings (--threads,
        --tensorflow_session_parallelism; 0: TensorFlow's defaults).

        Raises:
            ValueError: N below 0 or too large (named as --tensorflow_session_parallelism).
            TypeError: neither an integer nor SessionThreads.
        """
        if isinstance(threads, SessionThreads):
            return threads
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads ({BOTH_FLAG}) must be an integer or SessionThreads, "
                            f"got {threads!r}")
        if not 0 <= threads <= MAX_THREADS:
            raise ValueError(f"{BOTH_FLAG} (--threads) must be 0 to {MAX_THREADS} (0: "
                             f"TensorFlow's default), got {threads}")
        return cls(threads, threads)

    @property
    def in_caller_thread(self) -> bool:
        """Whether a run executes its ops in the thread that calls it."""
        return self.inter_op < 0

    def config(self):
        """The session's tf.compat.v1.ConfigProto."""
        # Imported here: the CLI checks its flags before TensorFlow's slow import.
        import tensorflow as tf

        return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=self.intra_op,
                                        inter_op_parallelism_threads=self.inter_op)


__all__ = ["SessionThreads", "INTRA_FLAG", "INTER_FLAG", "BOTH_FLAG"]
