"""Host and SSD bytes per ID of a tiered table by storage_dtype and slot_dtype.

One table of dim 64 with an Adagrad-like slot (the embedding and one slot component), 1024
device rows, fed IDs never seen before until 64,512 of them are off the device: in a host
tier of 80,000 rows, or in a host tier of 8,192 rows over an SSD tier. Through the engine
alone (no TensorFlow graph): the swaps carry rows of 0.5, exact in every dtype. Prints, per
(storage_dtype, slot_dtype), the measured host memory per host-resident ID (host_bytes over
host_rows: value chunks, slot records, spill bookkeeping), the tier's bytes per ID of values
(host_row_bytes) and the SSD file's bytes per SSD-resident ID (ssd_file_bytes over ssd_rows);
the baseline is float32 rows and slots, measured in the same run.

    PYTHONPATH=. .venv/bin/python bench/bench_tier_bytes.py
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

from bench import report  # noqa: E402
from bench.machine import describe  # noqa: E402
from mxrec._lib import loader  # noqa: E402

DIM, DEVICE, BATCH = 64, 1024, 1024
FORMS = (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"),
         ("float16", "float16"))
TIERS = (("host", 80_000, 0), ("host+SSD", 8_192, 100_000))


def measure(storage: str, slots: str, host: int, ssd: int, batches: int) -> dict:
    """The tier statistics after `batches` batches of new IDs, each swapping both components."""
    engine = loader.engine()
    key = f"bench_tier_bytes_{storage}_{slots}_{ssd}"
    with tempfile.TemporaryDirectory() as path:
        engine.create_table(key=key, name="bytes", dim=DIM, capacity=DEVICE, host_capacity=host,
                            ssd_capacity=ssd, ssd_path=path if ssd else "",
                            storage_dtype=storage, slot_dtype=slots)
        try:
            engine.tier_register(key, "adagrad/accumulator")
            for b in range(batches):
                ids = np.arange(b * BATCH, (b + 1) * BATCH, dtype=np.int64) * 7919 + 1
                (_, _, reused), = engine.process([key], [ids], True, b)
                values = np.full((len(reused), DIM), 0.5, np.float32)
                for component in ("embedding", "adagrad/accumulator"):
                    engine.tier_swap(key, component, reused, values)
            return dict(engine.tier_stats(key))
        finally:
            engine.drop_prefix(key)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    report.add_arguments(parser)
    args = parser.parse_args()
    batches = 32 if args.quick else 64
    out = report.Report()
    print(f"## Tier bytes per ID by storage_dtype and slot_dtype: dim {DIM}, embedding + 1 "
          f"slot, {(batches - 1) * BATCH:,} IDs off the device ({describe()})\n")
    print("| tiers | storage_dtype | slot_dtype | host rows | SSD rows | host bytes / host "
          "row | host_row_bytes | SSD file bytes / SSD row | x float32 (SSD) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for label, host, ssd in TIERS:
        base = None
        for storage, slots in FORMS:
            s = measure(storage, slots, host, ssd, batches)
            per_host = s["host_bytes"] / max(s["host_rows"], 1)
            per_ssd = s["ssd_file_bytes"] / max(s["ssd_rows"], 1)
            base = base or (per_host, per_ssd)
            ratio = f"{per_ssd / base[1]:.3f}" if ssd else ""
            print(f"| {label} | {storage} | {slots} | {s['host_rows']:,} | {s['ssd_rows']:,} "
                  f"| {per_host:.1f} | {s['host_row_bytes']} | {per_ssd:.1f} | {ratio} |")
            name = f"{label}/{storage}/{slots}"
            out.figure(f"{name}/host_bytes_per_host_row", per_host)
            if ssd:
                out.figure(f"{name}/ssd_bytes_per_ssd_row", per_ssd)
            if storage == slots == "bfloat16" and ssd:
                out.goal("bf16 rows and slots: SSD bytes per ID x float32 (<=)",
                         per_ssd / base[1], 0.55, lower_is_better=True)
    out.write(args.json)


if __name__ == "__main__":
    main()
