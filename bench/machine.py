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
