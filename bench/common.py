# SPDX-License-Identifier: Apache-2.0
"""What every bench script shares, below all of them: sizes, medians, the ckptio command and its raw device measurement, the page cache, versions, the machine and the JSON result files."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def human(n: int) -> str:
    for u, f in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= f:
            return f"{n / f:g} {u}"
    return f"{n} B"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def ckptio_cmd() -> str:
    for c in (os.path.join(ROOT, "build", "tools", "ckptio"), os.path.join(sys.prefix, "bin", "ckptio")):
        if os.access(c, os.X_OK):
            return c
    found = shutil.which("ckptio")
    if not found:
        raise SystemExit("bench: no ckptio command; run `make build` first")
    return found


def raw_measure(d: str, size: int) -> tuple[float, float, dict[str, Any]]:
    """One raw O_DIRECT write (+fsync) and cold read of a ``size`` file in ``d``, by the C
    `ckptio bench --raw-only` (io_uring, 8 MiB writes x16 in flight, 16 MiB reads x8)."""
    out = subprocess.run(
        [ckptio_cmd(), "bench", "--raw-only", "--json", "--runs", "1", "--size", str(size), "--dir", d],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    j = json.loads(out[out.index("{") :])
    return j["raw_write_gbps"], j["raw_read_gbps"], j


def make_resident(path: str) -> None:
    """Read every file under ``path`` once through the page cache."""
    files = [path] if os.path.isfile(path) else [os.path.join(r, f) for r, _d, fs in os.walk(path) for f in fs]
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.read(1 << 24):
                pass


def version(dist: str) -> str:
    """The installed version of the distribution ``dist``, or "" when it is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _installed

    try:
        return _installed(dist)
    except PackageNotFoundError:
        return ""


def machine(d: str, mem: bool = True, **extra: Any) -> dict[str, Any]:
    """The "machine" object of a result file: CPUs, platform, memory (``mem``), the bench
    directory ``d``, then ``extra``'s keys."""
    m: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform()}
    if mem:
        m["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    m["dir"] = os.path.abspath(d)
    return {**m, **extra}


def write_results(doc: dict[str, Any], out: str, prefix: str = "") -> str:
    """Write ``doc`` as ``<out>/<prefix>latest.json`` and a timestamped copy
    ``<out>/<prefix><YYYYmmdd-HHMMSS>.json``; returns the first path."""
    os.makedirs(out, exist_ok=True)
    text = json.dumps(doc, indent=1)
    latest = os.path.join(out, prefix + "latest.json")
    for p in (latest, os.path.join(out, prefix + time.strftime("%Y%m%d-%H%M%S") + ".json")):
        with open(p, "w") as f:
            f.write(text + "\n")
    return latest


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set size (Linux: 5 into /proc/self/clear_refs), so
    that status_kib("VmHWM") afterwards is the peak of what follows; False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def status_kib(field: str) -> int:
    """A KiB field of /proc/self/status ("VmRSS", "VmHWM"), or -1."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1
