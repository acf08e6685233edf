"""One tf.data pipeline for every partition of a streaming run.

A per-partition pipeline (an initializable iterator re-made for each partition's files)
pays tf.data's set-up on every partition: each MakeIterator instantiates and optimises the
parser's functions again (about 0.3-0.5 s for the Criteo parser on this 2-core machine, a
fifth of a 60k-row partition's pass). Here the iterator is made once: the partition's
files enter through a FIFO queue that the pipeline dequeues from, so it never ends, and
the trainer runs exactly as many steps as the partition has batches, counted from the
files' lines (parsers.count_lines, the records TextLineDataset yields; the same batch
boundaries as parsers.make_dataset: batches do not span files) once they are queued, while
the pipeline reads the first batches. The enqueue is a callable made once per session
(`prepare`, at the trainer's start-up, builds its executors). The lines the steps
saw are checked against the count, so a file changed under a ready partition stops the
run instead of mixing partitions.

Example:
    >>> feed = PartitionFeed(schema, batch_size=512)
    >>> batch = feed.get_next()                      # build the model on it
    >>> steps, lines = feed.start(sess, files, partition_time)
    >>> for _ in range(steps): sess.run(train_op)
"""

from typing import List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from mxrec.streaming.parsers import Schema, _file_batches, batch_lines, count_lines, parse_lines

# Files the queue holds at once: a bound on a partition's files (enqueue_many of more
# would wait for the pipeline, which waits for the trainer's steps).
QUEUE_CAPACITY = 1 << 30


class PartitionFeed:
    """A never-ending pipeline of parsed batches of the files given to `start`.

    Args:
        schema, batch_size, rank, size: as parsers.make_dataset (rank's slice of each batch).
        stamp_time: add "time" int64 [B] (the partition's start, from `start`) to each
            batch: the data time of eviction when the schema has no time column.
        name: the queue's name in the graph.
    """

    def __init__(self, schema: Schema, batch_size: int, rank: int = 0, size: int = 1,
                 stamp_time: bool = False, num_parallel_calls: int = tf.data.AUTOTUNE,
                 prefetch: int = 2, name: str = "partition_feed"):
        self.schema, self.batch_size, self.rank, self.size = schema, batch_size, rank, size
        self._enqueue_session, self._enqueue_fn = None, None
        with tf.name_scope(name):
            self._queue = tf.queue.FIFOQueue(QUEUE_CAPACITY, [tf.string, tf.int32, tf.int64],
                                             shapes=[[], [], []], name="files")
            self._names = tf.compat.v1.placeholder(tf.string, [None], name="names")
            self._indices = tf.compat.v1.placeholder(tf.int32, [None], name="indices")
            self._stamps = tf.compat.v1.placeholder(tf.int64, [None], name="stamps")
            self._enqueue = self._queue.enqueue_many([self._names, self._indices, self._stamps])
            self.close_op = self._queue.close(cancel_pending_enqueues=True)
        queue = self._queue

        def with_stamp(name_, index, stamp):
            return _file_batches(name_, index, schema, batch_size, rank, size).map(
                lambda line, file_index, number: (line, file_index, number, stamp))

        def parse(line, file_index, number, stamp):
            batch = parse_lines(line, file_index, number, schema)
            if stamp_time:
                batch["time"] = tf.fill(tf.shape(batch["label"]), stamp)
            return batch

        dataset = tf.data.Dataset.from_tensors(0).repeat().map(lambda _: queue.dequeue())
        dataset = dataset.flat_map(with_stamp).map(
            parse, num_parallel_calls=num_parallel_calls, deterministic=True)
        self._iterator = tf.compat.v1.data.make_initializable_iterator(dataset.prefetch(prefetch))
        self.initializer = self._iterator.initializer

    def get_next(self):
        return self._iterator.get_next()

    def count(self, files: Sequence[str]) -> Tuple[int, int]:
        """(steps, lines of this rank) that `files` make."""
        sizes: List[int] = []
        for path in files:
            sizes += batch_lines(count_lines(path, self.schema.header), self.batch_size,
                                 self.rank, self.size)
        return len(sizes), sum(sizes)

    def start(self, sess, files: Sequence[str], stamp: int, counted=None) -> Tuple[int, int]:
        """Queues `files` (one partition, in order); returns (steps, lines) of its pass
        (`counted`: count(files) already made; otherwise counted here, once the files are
        queued, so that the pipeline reads the first batches meanwhile)."""
        files = list(files)
        if files:
            self._enqueuer(sess)(files, list(range(len(files))), [int(stamp)] * len(files))
        return counted if counted is not None else self.count(files)

    def prepare(self, sess) -> None:
        """Builds the enqueue's executors in `sess` now (as the trainer's prepared steps),
        not at the first partition's `start` (about 20 ms on 2 cores)."""
        self._enqueuer(sess)

    def _enqueuer(self, sess):
        # The enqueue as a callable made once per session; where the session has the
        # callable API, its executors are built when it is made.
        if self._enqueue_session is not sess:
            feeds = [self._names, self._indices, self._stamps]
            make = getattr(sess, "_make_callable_from_options", None)
            if make is None:
                self._enqueue_fn = sess.make_callable(self._enqueue, feed_list=feeds)
            else:
                call = make(config_pb2.CallableOptions(feed=[t.name for t in feeds],
                                                       target=[self._enqueue.name]))
                self._enqueue_fn = lambda names, indices, stamps: call(
                    np.array([tf.compat.as_bytes(n) for n in names], dtype=object),
                    np.array(indices, dtype=np.int32), np.array(stamps, dtype=np.int64))
            self._enqueue_session = sess
        return self._enqueue_fn


__all__ = ["PartitionFeed", "QUEUE_CAPACITY"]
