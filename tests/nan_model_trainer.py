"""A streaming trainer whose model turns NaN on a data value the parser accepts.

    python tests/nan_model_trainer.py --data ROOT --model-dir DIR --export-base DIR
        [--on-nonfinite stop|skip] [--watch SECONDS]

The built-in wide & deep model plus `0 * sqrt(d0 + 100)`: a record with d0 < -100 (a valid
dense value) makes the loss, then every weight, NaN, as a poisoned feature or a diverging
step would. The tests of the non-finite guard drive it through the StreamingTrainer API as a
process of its own (so that it can be killed).
"""

import argparse
import os
import sys
import time

import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from mxrec.streaming import models, parsers  # noqa: E402
from mxrec.streaming.trainer import StreamConfig, StreamingTrainer  # noqa: E402

SCHEMA_SPEC = "y:label,d0:dense,d1:dense,c0:categorical,c1:categorical,c2:categorical"
MODEL = models.ModelConfig("wide_deep", dim=4, hidden=(8,), vocabulary=4000, init_stddev=0.05)
NAN_BELOW = -100.0


def nan_model_fn(model=MODEL):
    base = models.make_model_fn(model)

    def model_fn(features, is_train):
        logits = base(features, is_train)
        return logits + 0.0 * tf.sqrt(features["dense"][:, 0] - NAN_BELOW)

    return model_fn


def config(data, model_dir, export_base, **overrides) -> StreamConfig:
    settings = dict(batch_size=32, progress=False, tensorboard=False, threads=1,
                    max_bad_lines=20)
    settings.update(overrides)
    return StreamConfig(data=str(data), schema=parsers.parse_schema_spec(SCHEMA_SPEC),
                        workdir=str(model_dir), export_base=export_base and str(export_base),
                        **settings)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--export-base", default=None)
    parser.add_argument("--on-nonfinite", default="stop")
    parser.add_argument("--watch", type=float, default=None,
                        help="poll for partitions until this many seconds from now")
    args = parser.parse_args()
    tf.compat.v1.disable_eager_execution()
    watch = {} if args.watch is None else dict(watch=True, poll_interval=0.3,
                                               deadline=time.time() + args.watch)
    StreamingTrainer(config(args.data, args.model_dir, args.export_base,
                            on_nonfinite=args.on_nonfinite, **watch), nan_model_fn()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
