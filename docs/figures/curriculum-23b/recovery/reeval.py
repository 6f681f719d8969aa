"""Recovery: re-evaluate a committed final bundle as an arm's last evaluation (OUT/<arm>/eval-<n>.json), on the
curriculum's evaluation seeds, so later arms pair with it; prints the figure beside the committed one."""

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from core.settings import TIER1_TASKS
from flywheel.gathering.evaluation import EVAL_SEED, evaluate_bundle

# usage: reeval.py OUT ARM BUNDLE [DEST N]: DEST/eval-N.json (default: ARM and its last curve point)
out, arm, bundle = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
report = json.loads((out / "curriculum.json").read_text())
dest = sys.argv[4] if len(sys.argv) > 4 else arm
config, rl_set = report["config"], report["rl_set"]["tasks"]
tier1 = [t for t in TIER1_TASKS if t in config["tasks"] and t not in rl_set]
episodes = {t: config["eval_episodes"] for t in rl_set} | {t: config["tier1_episodes"] for t in tier1}
n = int(sys.argv[5]) if len(sys.argv) > 5 else len(report["arms"][arm]["curve"]) - 1
t0 = time.monotonic()
r = evaluate_bundle(bundle, f"{arm}@{n}", tuple(episodes), episodes, config["eval_browsers"], EVAL_SEED)
entry = {
    "arm": arm,
    "step": n,
    "recovered_from": str(bundle),
    "eval_wall_s": round(time.monotonic() - t0, 1),
    "episodes_per_task": episodes,
    "tasks": {t: x["success_rate"] for t, x in r["tasks"].items()},
    "seed": EVAL_SEED,
    "mean": r["mean_success_rate"],
    "success_by_seed": {t: [e == "success" for e in x["termination_by_seed"]] for t, x in r["tasks"].items()},
}
(out / dest).mkdir(parents=True, exist_ok=True)
(out / dest / f"eval-{n}.json").write_text(json.dumps(entry, indent=2))
shutil.copyfile(bundle, out / dest / f"model-{n}.vla")  # a checkpoint for `flywheel experiment sop`
mean = float(np.mean([np.mean(entry["success_by_seed"][t]) for t in rl_set]))
committed = report["arms"].get(arm, {}).get("rl_set_mean")
print(f"{dest}: re-evaluated RL-set mean {mean:.4f} (committed {committed}), {entry['eval_wall_s']} s")
