"""A PNG report of a streaming run from its donefile (needs matplotlib).

Four panels over the partitions, in the donefile's order: progressive AUC, log loss and
calibration (mean prediction / mean label), rows in use per table, and training samples/s
with the bad lines skipped per partition; a partition skipped for a non-finite model is
marked by a red line on every panel.

Example:
    >>> write_png("/ckpt/donefile.jsonl", "/tmp/report.png")
"""

from mxrec.streaming import donefile


def write_png(donefile_path: str, out_path: str) -> str:
    """Draws the report of `donefile_path` into `out_path`; returns out_path.

    Raises:
        ImportError: matplotlib is not installed (scripts/setup.sh installs it).
        ValueError: the donefile has no entries.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("the PNG report needs matplotlib (pip install matplotlib; "
                          "scripts/setup.sh installs it)") from error
    entries = donefile.read(donefile_path)
    if not entries:
        raise ValueError(f"donefile {donefile_path} has no entries")
    steps = list(range(1, len(entries) + 1))  # a skipped partition keeps its step
    nan = float("nan")

    def metric(name):
        return [(e.get("metrics") or {}).get(name, nan) for e in entries]

    figure, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    axes[0][0].plot(steps, metric("auc"), marker=".")
    axes[0][0].set_title("progressive AUC (scored before training)")
    axes[0][1].plot(steps, metric("logloss"), marker=".", label="log loss")
    axes[0][1].plot(steps, metric("calibration"), marker=".", label="calibration")
    axes[0][1].axhline(1.0, color="grey", linewidth=0.5)
    axes[0][1].legend()
    axes[0][1].set_title("log loss, calibration")
    tables = sorted({name for e in entries for name in e.get("table_rows", {})})
    for name in tables:
        axes[1][0].plot(steps, [e.get("table_rows", {}).get(name, nan) for e in entries],
                        label=name)
    if tables:
        axes[1][0].legend()
    axes[1][0].set_title("rows in use")
    axes[1][1].plot(steps, [e["rows"] / max(e.get("train_seconds", 0), 1e-9)
                            for e in entries], marker=".")
    axes[1][1].set_title("training samples/s; bad lines (right)")
    bad = axes[1][1].twinx()
    bad.bar(steps, [e.get("bad_lines", 0) for e in entries], color="tab:orange", alpha=0.4)
    for x, e in zip(steps, entries):
        if e.get("skipped"):
            for ax in (a for row in axes for a in row):
                ax.axvline(x, color="red", linewidth=0.8)
    for ax in axes[1]:
        ax.set_xlabel("partition (donefile order)")
    labels = f"{entries[0]['partition']} .. {entries[-1]['partition']}"
    skipped = sum(1 for e in entries if e.get("skipped"))
    figure.suptitle(f"mxrec streaming: {len(entries)} partitions, {labels}"
                    f"{f', {skipped} skipped (red)' if skipped else ''}")
    figure.tight_layout()
    figure.savefig(out_path, dpi=80)
    plt.close(figure)
    return out_path


__all__ = ["write_png"]
