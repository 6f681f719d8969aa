"""`flywheel diagnose`: where a model's clicks go wrong, measured without training anything.

For each task, `screens` held-out expert screens (seeds EVAL_SEED.., every step the DOM expert clicks, its target's
element box recorded), run through the bundle exactly as the edge runs it (onnxruntime, the bundle's keep ratio):

    map_in_box        the click map's argmax bin lies inside the target's box (click-map models; None otherwise)
    click_in_box      the decoded greedy action is a click inside the box (map and decoder together)
    target_recall     a kept visual token overlaps the target's box under pruning (the decoder sees the target)
    keep_ratio        the bundle's shipped keep ratio those were measured at

and, with `gap_episodes`, greedy success on seeds the release trained on (`train_seed`..) against held-out seeds
(EVAL_SEED..): the memorisation gap per task. Writes OUT/diagnose.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from core.console import jsonable, say
from core.settings import TIER1_TASKS, Settings
from flywheel.gathering.evaluation import EVAL_SEED, evaluate_bundle


@dataclass(frozen=True)
class DiagnoseConfig:
    out: Path
    """diagnose.json goes here."""
    model: str = "release"
    """The bundle: a .vla path, a published version, 'latest' or 'release' (registry.store.resolve_model)."""
    tasks: tuple[str, ...] = TIER1_TASKS
    """Tasks whose expert screens are diagnosed."""
    screens: int = 200
    """Held-out expert click screens per task."""
    gap_episodes: int = 0
    """> 0: greedy episodes per task on training seeds and on as many held-out seeds (0: no gap measured)."""
    train_seed: int = 50_000
    """First training seed of the gap (the release's Tier 1 collection starts here)."""


def expert_click_screens(task: str, count: int, seed: int = EVAL_SEED) -> list[dict]:
    """`count` screens on which the DOM expert clicks, from episodes on seeds seed..: the screenshot, the
    instruction, the expert's click point and its element box (the point's bin when the expert gave none)."""
    from edge_client.env import GuiEnv
    from edge_client.experts import expert_for

    screens: list[dict] = []
    expert = expert_for(task)
    with GuiEnv(task) as env:
        episode = 0
        while len(screens) < count:
            obs = env.reset(seed=seed + episode, task=task)
            episode += 1
            for _ in range(12):
                decision = expert.act(obs)
                action = decision.action
                if action.type == "click":
                    box = decision.target_box or (action.x - 2.5, action.y - 2.5, action.x + 2.5, action.y + 2.5)
                    screens.append({"screenshot": obs.screenshot, "instruction": obs.instruction,
                                    "point": (action.x, action.y), "box": tuple(box)})  # fmt: skip
                result = env.step(action)
                if result.done or len(screens) >= count:
                    break
                obs = result.obs
    return screens


def inside(box: tuple[float, ...], x: float, y: float) -> bool:
    left, top, right, bottom = box
    return left <= x <= right and top <= y <= bottom


def box_cells(box: tuple[float, ...], patch_px: int, rows: int, cols: int) -> set[int]:
    """Raster indices of the visual tokens (patch_px cells) that overlap the element box."""
    left, top, right, bottom = box
    first_col, last_col = max(int(left // patch_px), 0), min(int(right // patch_px), cols - 1)
    first_row, last_row = max(int(top // patch_px), 0), min(int(bottom // patch_px), rows - 1)
    return {r * cols + c for r in range(first_row, last_row + 1) for c in range(first_col, last_col + 1)}


def diagnose_screens(runtime, screens: list[dict]) -> dict:
    """The map, decoded-click and pruning-recall rates of one task's screens under `runtime` (policy.runtime)."""
    from policy.pruning import MAP_TOP_CELLS, keep_count, patch_prior, select_patches

    in_map, clicked, recalled = [], [], []
    bin_px = runtime.tok.bin_px
    for screen in screens:
        image, instruction, box = screen["screenshot"], screen["instruction"], screen["box"]
        _, relevance, third = runtime.encoder.run(None, runtime.encoder_feeds(image, instruction))
        if runtime.click_map:
            row, col = np.unravel_index(int(np.argmax(third[0])), third[0].shape)
            in_map.append(inside(box, (col + 0.5) * bin_px, (row + 0.5) * bin_px))
        prior = patch_prior(image, None, runtime.patch_px, runtime.pruning)
        keep = keep_count(runtime.num_patches, runtime.pruning.keep_ratio)
        kept = select_patches(relevance[0], prior, keep, MAP_TOP_CELLS if runtime.click_map else 0)
        recalled.append(bool(set(kept.tolist()) & box_cells(box, runtime.patch_px, runtime.rows, runtime.cols)))
        action = runtime.tok.parse(runtime.step(image, instruction, None)[0].ids).action
        clicked.append(action.type == "click" and inside(box, action.x, action.y))
    return {
        "screens": len(screens),
        "map_in_box": float(np.mean(in_map)) if in_map else None,
        "click_in_box": float(np.mean(clicked)),
        "target_recall": float(np.mean(recalled)),
    }


def run_diagnose(config: DiagnoseConfig, settings: Settings) -> dict:
    from policy.runtime import VLARuntime
    from registry.store import resolve_model

    path, version = resolve_model(config.model, settings.artifacts_dir)
    runtime = VLARuntime(path)
    report: dict = {"config": jsonable(asdict(config)), "model_version": version,
                    "keep_ratio": runtime.pruning.keep_ratio, "click_map": runtime.click_map, "tasks": {}}  # fmt: skip
    for task in config.tasks:
        report["tasks"][task] = diagnose_screens(runtime, expert_click_screens(task, config.screens))
        say(f"{task}: {report['tasks'][task]}")
    if config.gap_episodes:
        trained = evaluate_bundle(path, version, config.tasks, config.gap_episodes, seed=config.train_seed)
        held_out = evaluate_bundle(path, version, config.tasks, config.gap_episodes, seed=EVAL_SEED)
        for task in config.tasks:
            train, test = trained["tasks"][task]["success_rate"], held_out["tasks"][task]["success_rate"]
            report["tasks"][task] |= {"train_seed_success": train, "held_out_success": test, "gap": train - test}
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / "diagnose.json").write_text(json.dumps(report, indent=2))
    return report
