"""The fp32 ceiling a learner figure is compared with: what this machine's BLAS reaches, and its theoretical peak."""

from __future__ import annotations

import time

import torch

from core.machine import cpu_facts


def fp32_ceiling(threads: int) -> dict:
    """GFLOP/s of a large fp32 matmul at `threads` (what the BLAS reaches here), and this CPU's theoretical peak:
    cores x GHz x fp32 FLOPs per cycle (2 FMA units x lanes, 16 with AVX-512, 8 with AVX2, x 2)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(2):
        a @ b
    runs, started = 6, time.perf_counter()
    for _ in range(runs):
        a @ b
    measured = runs * 2 * 2048**3 / (time.perf_counter() - started) / 1e9
    facts = cpu_facts()
    lanes = 16 if "avx512f" in facts["simd"] else 8 if "avx2" in facts["simd"] else 4
    peak = round(threads * facts["mhz"] / 1000 * 2 * lanes * 2, 1) if facts["mhz"] else None
    return {"threads": threads, "matmul_gflops": round(measured, 1), "theoretical_gflops": peak}
