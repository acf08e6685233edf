"""The exchange engines against one process, in one run: samples/s of examples/multiworker/train.py
(one sharded table, 26 features, power-law IDs, Adagrad) on 1 process and on N ranks over
each engine (gRPC: TensorFlow's collectives; MPI: mxrec's MPI ops), each started by
`python -m mxrec.launch -n N --engine E`, with the traced step's split (exchanges, waiting
for peers included, and the other ops). All ranks share this machine's cores: the ratios show
what the exchange costs, not a speed-up.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_engines.py [--ranks 2,4 --steps 40 --rounds 3]
    PYTHONPATH=. .venv/bin/python bench/bench_engines.py --quick      # 2 ranks, 16 steps, 1 round

The goals are the medians of the rounds' ratios: on this shared 2-core machine one process's
samples/s moves by a third between runs a minute apart, so a single ratio says little.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from bench import report  # noqa: E402
from bench.machine import cpu_name  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "multiworker", "train.py")


def _run(ranks: int, engine: str, common, tmp: str) -> dict:
    timing = os.path.join(tmp, f"timing-{ranks}-{engine}.json")
    command = [sys.executable, SCRIPT, "--timing", timing] + common
    if ranks > 1:
        command = [sys.executable, "-m", "mxrec.launch", "--engine", engine, "-n",
                   str(ranks)] + command[1:]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("MXREC_RANK", "MXREC_SIZE", "MXREC_CLUSTER", "MXREC_EXCHANGE"):
        env.pop(name, None)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} rank(s), {engine}: exit {done.returncode}\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with open(timing) as f:
        return json.load(f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default=None, help="2,4 (--quick 2)")
    parser.add_argument("--engines", default="grpc,mpi")
    parser.add_argument("--steps", type=int, default=None, help="40 (--quick 16)")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--pool", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of 1 process then every rank count and engine; the goals "
                             "are the medians of the rounds' ratios (3; --quick 1)")
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    ranks_list = [int(r) for r in (args.ranks or ("2" if args.quick else "2,4")).split(",")]
    steps = args.steps or (16 if args.quick else 40)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if rounds < 1:
        parser.error(f"--rounds must be at least 1, got {rounds}")

    def suffix(number: int) -> str:
        return "" if rounds == 1 else f", round {number + 1}"

    common = ["--steps", str(steps), "--batch", str(args.batch), "--features",
              str(args.features), "--dim", str(args.dim), "--pool", str(args.pool),
              "--capacity", str(min(args.pool, 2**31 - 1))]
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; global batch {args.batch} x "
          f"{args.features} IDs, dim {args.dim}, {args.pool:,} distinct keys, {steps} steps "
          "(the first 6 untimed)")
    out = report.Report()
    ratios = {}  # (ranks, engine) -> the per-round ratios to the round's 1 process
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(rounds):
            # Each round runs 1 process and then every rank count and engine, so that each
            # ratio compares runs a minute apart on this shared machine, not minutes.
            if rounds > 1:
                print(f"round {number + 1} of {rounds}:")
            base = _run(1, "none", common, tmp)
            out.figure(f"1 process: samples/s{suffix(number)}", round(base["samples_per_second"]))
            print(f"1 process: {base['samples_per_second']:,.0f} samples/s "
                  f"({base['step_ms']:.1f} ms/step)")
            for ranks in ranks_list:
                for engine in args.engines.split(","):
                    r = _run(ranks, engine, common, tmp)
                    ratio = r["samples_per_second"] / base["samples_per_second"]
                    ratios.setdefault((ranks, engine), []).append(ratio)
                    out.figure(f"{ranks} ranks, {engine}: samples/s{suffix(number)}",
                               round(r["samples_per_second"]))
                    out.figure(f"{ranks} ranks, {engine}: x 1 process{suffix(number)}",
                               round(ratio, 3))
                    print(f"{ranks} ranks, {engine:4s}: {r['samples_per_second']:,.0f} samples/s "
                          f"({r['step_ms']:.1f} ms/step, {ratio:.2f} x 1 process); traced step "
                          f"{r['traced_step_ms']:.1f} ms: exchanges {r['collective_ms']:.1f} ms "
                          f"(all-to-all forward {r['alltoall_forward_ms']:.1f}, backward "
                          f"{r['alltoall_backward_ms']:.1f}, all-reduce {r['allreduce_ms']:.1f}), "
                          f"other ops {r['other_ops_ms']:.0f} ms (summed over threads)")
    for (ranks, engine), values in ratios.items():
        if rounds > 1:
            out.figure(f"{ranks} ranks, {engine}: x 1 process, median of {rounds} rounds",
                       round(float(np.median(values)), 3))
            print(f"{ranks} ranks, {engine}: x 1 process per round "
                  f"{', '.join(f'{v:.2f}' for v in values)}; median {np.median(values):.2f}")
        if engine == "mpi":
            target = 0.8 if ranks == 2 else 0.5
            what = "same run" if rounds == 1 else f"median of {rounds} rounds' ratios"
            out.goal(f"{ranks} ranks on the MPI engine >= {target} x 1 process "
                     f"(samples/s, {what})", float(np.median(values)), target)
    out.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
