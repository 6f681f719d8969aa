"""The learner under torchrun: 2 gloo processes train one model on slices of the same global batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import torch

from policy.screen import encode_png
from tests.factories import box_screen

SCRIPT = """
import hashlib, json, os, sys
import polars as pl, torch
from learner.config import VLARecipe, VLATrainConfig
from learner.vla_sft import train_vla
frame = pl.read_parquet(sys.argv[1])
config = VLATrainConfig(steps=8, batch_size=8, lr=3e-3, warmup_steps=2, seed=0, keep_ratios=(1.0,), checkpoint_every=4,
                        progress_bar=False, num_threads=1)
model_config = {"stem_channels": 16, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}
result = train_vla(frame, VLARecipe(model=model_config, vocab_size=300, train=config), sys.argv[2])
state = result.model.state_dict()
digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in state.values())).hexdigest()
rank = os.environ.get("RANK", "0")
with open(os.path.join(sys.argv[2], f"rank-{rank}.json"), "w") as f:
    json.dump({"digest": digest, "losses": result.losses}, f)
"""


def box_frame(n: int) -> pl.DataFrame:
    rows = []
    for seed in range(n):
        image, (x, y, _, _) = box_screen(seed)
        rows.append(dict(episode_id=f"e{seed}", step=0, task="click-box", instruction="Click the box.",
                         screenshot=encode_png(image), thought="Click the box.", action_type="click", x=x + 15.0,
                         y=y + 15.0, text="", key=""))  # fmt: skip
    return pl.DataFrame(rows)


def run(tmp_path: Path, processes: int) -> Path:
    data, script, out = tmp_path / "frame.parquet", tmp_path / "train.py", tmp_path / f"run-{processes}"
    if not data.exists():
        box_frame(16).write_parquet(data)
        script.write_text(SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", f"--nproc_per_node={processes}", str(script), str(data), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_two_gloo_processes_train_one_model_on_the_global_batch(tmp_path):
    two = run(tmp_path, 2)
    ranks = [json.loads((two / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["digest"] == ranks[1]["digest"]  # DDP kept the replicas identical
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0]  # and they learned
    assert (two / "vla_checkpoint.pt").exists()  # written once, by rank 0
    # The same global batches as one process: the weights agree up to how the two halves' token means combine.
    one = run(tmp_path, 1)
    a = torch.load(one / "vla_checkpoint.pt", weights_only=True)["model"]
    b = torch.load(two / "vla_checkpoint.pt", weights_only=True)["model"]
    drift = max(((a[k] - b[k]).norm() / (a[k].norm() + 1e-8)).item() for k in a if a[k].is_floating_point())
    assert drift < 0.05, drift
    single = json.loads((one / "rank-0.json").read_text())["losses"]
    assert abs(single[0] - ranks[0]["losses"][0]) < 0.5  # the first step's loss: the same rows, split in two
