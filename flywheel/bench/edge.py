"""`flywheel bench edge`: one step of the VLA, five ways, on the same weights and real MiniWoB screens.

    torch_eager         PyTorch eager: the transformers forward with its KV cache, all 336 visual tokens (the baseline)
    torch_eager_pruned  the same, visual tokens pruned to the bundle's keep ratio (the baseline of onnx_pruned)
    onnx                onnxruntime, explicit KV cache, all visual tokens
    onnx_pruned         onnxruntime, visual tokens pruned to the bundle's keep ratio
    onnx_int8           onnx_pruned with int8 dynamic quantisation

Screens: the first screen of episodes of the Tier 1 tasks, captured from a real browser which is closed
before any timing. Each variant runs in its own process (so peak RSS is its own), with the same thread
count, a warm-up pass, then `passes` timed passes over every screen. This shared VM's speed drifts by
tens of percent over minutes (torch eager's step measured 46 to 68 ms in runs an hour apart), so the
variants run in `rounds`, in alternating order, and each figure is the median over the rounds; every
round's step_ms_p50 is kept too. Results: DIR/edge_bench.json.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from core.settings import TIER1_TASKS, Settings
from core.stats import percentile
from registry.store import RELEASE_DIR

VARIANTS = ("torch_eager", "torch_eager_pruned", "onnx", "onnx_pruned", "onnx_int8")
PRUNED = {"torch_eager_pruned", "onnx_pruned", "onnx_int8"}
SCREEN_SEED = 2_000_000  # episode seed of the first captured screen: far from training and evaluation seeds


@dataclass(frozen=True)
class EdgeBenchConfig:
    out: Path
    """edge_bench.json goes here."""
    model_dir: Path = RELEASE_DIR
    """Holds model.vla, model-int8.vla and model.pt (a release directory)."""
    screens_per_task: int = 4
    """Tier 1 screens captured per task."""
    passes: int = 2
    """Timed passes over the screens, per variant and round."""
    rounds: int = 3
    """Every variant once per round, in alternating order; figures are medians over the rounds."""
    threads: int = 1
    """Intra-op threads of every variant."""


def capture_screens(tasks: tuple[str, ...], per_task: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """(S, 210, 160, 3) uint8 first screens and their instructions, from a real browser."""
    from edge_client.env import GuiEnv

    screens, instructions = [], []
    with GuiEnv(tasks[0]) as env:
        for task in tasks:
            for i in range(per_task):
                obs = env.reset(seed=seed + i, task=task)
                screens.append(obs.screenshot)
                instructions.append(obs.instruction)
    return np.stack(screens), instructions


def run_variant(variant: str, model_dir: Path, screens: np.ndarray, instructions: list[str], passes: int,
                threads: int) -> dict:  # fmt: skip
    """Time one variant in this process; returns its figures (called in a fresh subprocess)."""
    if variant.startswith("torch_eager"):
        import torch

        from learner.model.checkpoints import load_vla
        from learner.model.infer import torch_step

        torch.set_num_threads(threads)
        model, tok, pruning = load_vla(model_dir / "model.pt")
        if variant not in PRUNED:
            pruning = replace(pruning, keep_ratio=1.0)

        def step(screen, instruction):
            gen, timing = torch_step(model, tok, pruning, screen, instruction, None)
            return gen, timing, timing.prefill_ms, timing.decode_ms
    else:
        from policy.runtime import VLARuntime

        bundle = model_dir / ("model-int8.vla" if variant == "onnx_int8" else "model.vla")
        runtime = VLARuntime(bundle, intra_op_threads=threads, keep_ratio=1.0 if variant == "onnx" else None)

        def step(screen, instruction):
            gen, timing = runtime.step(screen, instruction, None)
            return gen, timing, timing.prefill_ms, timing.decode_ms

    for screen, instruction in zip(screens, instructions, strict=True):  # warm-up
        step(screen, instruction)
    step_ms, prefill_ms, tokens_per_s, actions = [], [], [], []
    kept = total = 0
    for _ in range(passes):
        for screen, instruction in zip(screens, instructions, strict=True):
            t0 = time.perf_counter()
            gen, timing, prefill, decode = step(screen, instruction)
            step_ms.append((time.perf_counter() - t0) * 1e3)
            prefill_ms.append(prefill)
            if timing.decode_tokens:
                tokens_per_s.append(timing.decode_tokens / max(decode, 1e-6) * 1e3)
            kept, total = timing.visual_tokens_kept, timing.visual_tokens_total
            actions.append(gen.ids)
    return {
        "step_ms_p50": round(percentile(step_ms, 50), 2),
        "step_ms_p95": round(percentile(step_ms, 95), 2),
        "prefill_ms_p50": round(percentile(prefill_ms, 50), 3),
        "decode_tokens_per_s": round(float(np.median(tokens_per_s)), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "visual_tokens_total": total,
        "visual_tokens_kept": kept,
        "steps_timed": len(step_ms),
        "threads": threads,
        "generated": actions[: len(screens)],
    }


def run_bench(config: EdgeBenchConfig) -> dict:
    config.out.mkdir(parents=True, exist_ok=True)
    screens, instructions = capture_screens(TIER1_TASKS, config.screens_per_task, SCREEN_SEED)
    report: dict = {"variants": {}, "screens": len(screens), "tasks": list(TIER1_TASKS),
                    "model_dir": str(config.model_dir)}  # fmt: skip
    runs: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "screens.npz"
        np.savez(data, screens=screens, instructions=np.array(instructions))
        for round_ in range(config.rounds):
            for variant in VARIANTS if round_ % 2 == 0 else reversed(VARIANTS):
                out = Path(tmp) / f"{variant}.json"
                cmd = [sys.executable, "-m", "flywheel.bench.edge", variant, str(config.model_dir), str(data),
                       str(out), str(config.passes), str(config.threads)]  # fmt: skip
                subprocess.run(cmd, check=True)
                runs[variant].append(json.loads(out.read_text()))
    for variant, figures in runs.items():
        report["variants"][variant] = median_figures(figures)
    # Each variant's tokens against torch's at the same pruning: 1.0 says the runtime computes what torch does.
    generated = {name: figures.pop("generated") for name, figures in report["variants"].items()}
    for name, figures in report["variants"].items():
        if not name.startswith("torch_eager"):
            reference = generated["torch_eager_pruned" if name in PRUNED else "torch_eager"]
            same = [a == b for a, b in zip(generated[name], reference, strict=True)]
            figures["same_tokens_as_torch"] = round(float(np.mean(same)), 3)
    v = report["variants"]

    def ratio(slow: str, fast: str, key: str = "step_ms_p50") -> float:
        return round(v[slow][key] / v[fast][key], 2)

    report["speedups"] = {
        "onnx_vs_torch_step": ratio("torch_eager", "onnx"),
        "onnx_pruned_vs_torch_pruned_step": ratio("torch_eager_pruned", "onnx_pruned"),
        "onnx_pruned_vs_torch_step": ratio("torch_eager", "onnx_pruned"),
        "pruned_vs_onnx_prefill": ratio("onnx", "onnx_pruned", "prefill_ms_p50"),
        "pruned_vs_onnx_step": ratio("onnx", "onnx_pruned"),
        "int8_vs_pruned_step": ratio("onnx_pruned", "onnx_int8"),
    }
    (config.out / "edge_bench.json").write_text(json.dumps(report, indent=2))
    return report


def median_figures(rounds: list[dict]) -> dict:
    """One variant's figures over the rounds: numbers by their median, the rest (tokens, counts) from round 1."""
    merged = dict(rounds[0])
    for key, value in rounds[0].items():
        if isinstance(value, float):
            merged[key] = round(float(np.median([r[key] for r in rounds])), 3)
    merged["rounds_step_ms_p50"] = [r["step_ms_p50"] for r in rounds]
    return merged


def format_report(report: dict) -> str:
    cols = ["step_ms_p50", "step_ms_p95", "prefill_ms_p50", "decode_tokens_per_s", "peak_rss_mb",
            "visual_tokens_kept", "visual_tokens_total"]  # fmt: skip
    lines = [f"{'variant':20s}" + "".join(f"{c:>21s}" for c in cols)]
    for name, figures in report["variants"].items():
        lines.append(f"{name:20s}" + "".join(f"{figures[c]:>21}" for c in cols))
    lines.append("speedups: " + ", ".join(f"{k} {v}x" for k, v in report["speedups"].items()))
    return "\n".join(lines)


if __name__ == "__main__":  # one variant, in its own process: python -m flywheel.bench.edge VARIANT DIR NPZ OUT R T
    variant, model_dir, data, out, passes, threads = sys.argv[1:7]
    loaded = np.load(data)
    figures = run_variant(variant, Path(model_dir), loaded["screens"], [str(s) for s in loaded["instructions"]],
                          int(passes), int(threads))  # fmt: skip
    Path(out).write_text(json.dumps(figures))


def command(config: EdgeBenchConfig, settings: Settings) -> int:
    """`flywheel bench edge`: the table, and where its JSON went."""
    print(format_report(run_bench(config)))
    print(f"wrote {config.out / 'edge_bench.json'}")
    return 0
