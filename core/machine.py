"""The machine a figure was measured on. The CPU can change between sessions here (one had AVX-512, and its
SFT from the same seed ended at other weights), and budgets are wall-clock, so experiments and benchmarks
record where they ran."""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The vector extensions that set a CPU's float throughput for torch and onnxruntime, widest first.
SIMD = ("amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "avx")


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """The first CPU's model name, family/model, clock and vector extensions (platform's guess without
    /proc/cpuinfo)."""
    fields: dict[str, str] = {}
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if not line.strip():
                break  # the first CPU's block ends
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {"cpu": fields.get("model name") or platform.processor() or platform.machine(),
            "family_model": f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}",
            "mhz": round(float(fields["cpu MHz"])) if "cpu MHz" in fields else None,
            "simd": [s for s in SIMD if s in flags]}  # fmt: skip


def machine() -> dict:
    """{"cpu", "family_model", "mhz", "simd", "cores", "host"}: enough to tell two runs' machines apart."""
    return {**cpu_facts(), "cores": os.cpu_count(), "host": platform.node()}
