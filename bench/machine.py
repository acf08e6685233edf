"""What the benchmarks share: the machine's description."""

import platform


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, or what platform knows."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float:
    """Total memory from /proc/meminfo in GiB (0 where unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def describe() -> str:
    """One line: CPU model, cores and memory."""
    import os

    return f"{cpu_name()}, {os.cpu_count()} cores, {memory_gib():.0f} GiB memory"
