"""The exchange engines against one process, in one run: samples/s of examples/multiworker/train.py
(one sharded table, 26 features, power-law IDs, Adagrad) on 1 process and on N ranks over
each engine (gRPC: TensorFlow's collectives; MPI: mxrec's MPI ops), each started by
`python -m mxrec.launch -n N --engine E`, with the traced step's split (exchanges, waiting
for peers included, and the other ops). All ranks share this machine's cores: the ratios show
what the exchange costs, not a speed-up.

Run from the repository root:
    PYTHONPATH=. .venv/bin/python bench/bench_engines.py [--ranks 2,4 --steps 40]
    PYTHONPATH=. .venv/bin/python bench/bench_engines.py --quick      # 2 ranks, 16 steps
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

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
    report.add_arguments(parser)
    args = parser.parse_args(argv)
    ranks_list = [int(r) for r in (args.ranks or ("2" if args.quick else "2,4")).split(",")]
    steps = args.steps or (16 if args.quick else 40)
    common = ["--steps", str(steps), "--batch", str(args.batch), "--features",
              str(args.features), "--dim", str(args.dim), "--pool", str(args.pool),
              "--capacity", str(min(args.pool, 2**31 - 1))]
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; global batch {args.batch} x "
          f"{args.features} IDs, dim {args.dim}, {args.pool:,} distinct keys, {steps} steps "
          "(the first 6 untimed)")
    out = report.Report()
    with tempfile.TemporaryDirectory() as tmp:
        base = _run(1, "none", common, tmp)
        out.figure("1 process: samples/s", round(base["samples_per_second"]))
        print(f"1 process: {base['samples_per_second']:,.0f} samples/s "
              f"({base['step_ms']:.1f} ms/step)")
        for ranks in ranks_list:
            for engine in args.engines.split(","):
                r = _run(ranks, engine, common, tmp)
                ratio = r["samples_per_second"] / base["samples_per_second"]
                out.figure(f"{ranks} ranks, {engine}: samples/s", round(r["samples_per_second"]))
                out.figure(f"{ranks} ranks, {engine}: x 1 process", round(ratio, 3))
                print(f"{ranks} ranks, {engine:4s}: {r['samples_per_second']:,.0f} samples/s "
                      f"({r['step_ms']:.1f} ms/step, {ratio:.2f} x 1 process); traced step "
                      f"{r['traced_step_ms']:.1f} ms: exchanges {r['collective_ms']:.1f} ms "
                      f"(all-to-all forward {r['alltoall_forward_ms']:.1f}, backward "
                      f"{r['alltoall_backward_ms']:.1f}, all-reduce {r['allreduce_ms']:.1f}), "
                      f"other ops {r['other_ops_ms']:.0f} ms (summed over threads)")
                if engine == "mpi":
                    target = 0.8 if ranks == 2 else 0.5
                    out.goal(f"{ranks} ranks on the MPI engine >= {target} x 1 process "
                             "(samples/s, same run)", ratio, target)
    out.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
