"""Every final evaluation of a curriculum run (default runs/curriculum-23b) on the RL set, paired with both
machines' `sft`: python pairs.py [RUN_DIR]."""

import json
import sys
from pathlib import Path

from core.stats import mean_ci, paired_diff_ci

out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/curriculum-23b")
rl = json.loads((out / "curriculum.json").read_text())["rl_set"]["tasks"]


def load(p):
    e = json.loads((out / p).read_text())["success_by_seed"]
    return {t: e[t][:100] for t in rl}


ev = {"start": "shared/eval-0.json", "sft (m2)": "sft/eval-4.json"}
for d in sorted(out.iterdir()):
    if d.is_dir() and d.name not in ("shared", "sft"):
        evals = sorted(d.glob("eval-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        if evals:
            ev[d.name] = str(evals[-1].relative_to(out))
base = load(ev["sft (m2)"])
first_sft = load(ev["first-machine-sft"]) if "first-machine-sft" in ev else None
for name, p in ev.items():
    x = load(p)
    m, lo, hi = mean_ci(x)
    d2, l2, h2 = paired_diff_ci(x, base)
    s = f"{name:42s} {m:.3f} [{lo:.3f},{hi:.3f}]  vs sft(m2) {100 * d2:+.1f} [{100 * l2:+.1f},{100 * h2:+.1f}]"
    if first_sft:
        d1, l1, h1 = paired_diff_ci(x, first_sft)
        s += f"  vs sft(m1) {100 * d1:+.1f} [{100 * l1:+.1f},{100 * h1:+.1f}]"
    print(s)
