"""The learner under torchrun: 2 gloo processes train one model on slices of the same global batches, in SFT and
in every RL stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import torch

from policy.screen import encode_png
from schemas import Action
from tests.factories import box_screen


def box_frame(n: int) -> pl.DataFrame:
    rows = []
    for seed in range(n):
        image, (x, y, _, _) = box_screen(seed)
        rows.append(dict(episode_id=f"e{seed}", step=0, task="click-box", instruction="Click the box.",
                         screenshot=encode_png(image), thought="Click the box.", action_type="click", x=x + 15.0,
                         y=y + 15.0, text="", key=""))  # fmt: skip
    return pl.DataFrame(rows)


# One torchrun launch per process count runs SFT on slices of the box frame, then every RL stage: each launch starts
# P interpreters that import torch, the expensive part on a 2-core box.
SCRIPT = """
import hashlib, json, os, sys
import numpy as np, polars as pl, torch
from learner.recipe import VLARecipe, VLATrainConfig
from learner.algorithms.offline_rl import OfflineRLConfig, train_offline_rl
from learner.algorithms.online_rl import OnlineRLConfig, ppo_update
from learner.algorithms.semi_online import SemiOnlineConfig, semi_online_update
from learner.algorithms.sft import train_vla
work, sft, out = sys.argv[1], sys.argv[2], sys.argv[3]
rank = os.environ.get("RANK", "0")

sft_config = VLATrainConfig(steps=8, batch_size=8, lr=3e-3, warmup_steps=2, seed=0, keep_ratios=(1.0,),
                            checkpoint_every=4, progress_bar=False, num_threads=1)
model_config = {"stem_channels": 16, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}
trained = train_vla(pl.read_parquet(os.path.join(work, "frame.parquet")),
                    VLARecipe(model=model_config, vocab_size=300, train=sft_config), os.path.join(out, "sft"))
state = trained.model.state_dict()
digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in state.values())).hexdigest()
os.makedirs(os.path.join(out, "sft"), exist_ok=True)  # rank 0 alone writes the checkpoint there
with open(os.path.join(out, "sft", f"rank-{rank}.json"), "w") as f:
    json.dump({"digest": digest, "losses": trained.losses}, f)

train = VLATrainConfig(steps=6, batch_size=8, lr=1e-3, warmup_steps=2, seed=0, keep_ratios=(1.0,), progress_bar=False,
                       checkpoint_every=0, num_threads=1)
demos = pl.read_parquet(os.path.join(work, "demos.parquet"))
results = {
    "offline": train_offline_rl(pl.read_parquet(os.path.join(work, "logged.parquet")), train,
                                OfflineRLConfig(dpo_pairs=4), sft, os.path.join(out, "offline")),
    "ppo": ppo_update(pl.read_parquet(os.path.join(work, "rollouts.parquet")), train,
                      OnlineRLConfig(guidance="anchor", epochs=1, target_kl=0.0), sft, sft, os.path.join(out, "ppo"),
                      demos=demos),
    "semi_online": semi_online_update(demos, train, SemiOnlineConfig(rollouts=4, trajectories=8), sft, sft,
                                      os.path.join(out, "semi"))[0],
}
if rank == "0":
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump({stage: r.losses for stage, r in results.items()}, f)
"""


def test_sft_and_the_rl_stages_on_two_processes_match_one_on_the_same_global_batches(tmp_path):
    """SFT (DDP), offline RL, PPO (anchored) and semi-online RL: each process trains on its rows of the same global
    batches and the gradients are averaged, so 2 processes end where 1 does (up to how the halves' means combine)."""
    from learner.algorithms.sft import train_vla
    from learner.recipe import VLARecipe, VLATrainConfig
    from policy.pruning import PruningConfig
    from tests.test_offline_rl import box_screen as centre_screen
    from tests.test_offline_rl import row as logged_row
    from tests.test_online_rl import rollouts, sft_row
    from tests.test_semi_online import expert_frame

    train = VLATrainConfig(steps=12, batch_size=8, lr=3e-3, warmup_steps=3, seed=0, keep_ratios=(1.0,),
                           progress_bar=False, checkpoint_every=0)  # fmt: skip
    model = {"stem_channels": 16, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}
    recipe = VLARecipe(model=model, pruning=PruningConfig(keep_ratio=1.0), vocab_size=300, train=train)
    sft = train_vla(pl.DataFrame([sft_row(s) for s in range(16)]), recipe, tmp_path / "sft")
    expert_frame(range(16)).write_parquet(tmp_path / "demos.parquet")
    from learner.model.export import export_bundle

    bundle = export_bundle(sft.model, sft.tokenizer, sft.pruning, tmp_path / "sft.vla")
    rollouts(bundle, range(100, 108), np.random.default_rng(0)).write_parquet(tmp_path / "rollouts.parquet")
    tok, logged = sft.tokenizer, []
    for s in range(12, 20):
        good, bad = Action("click", *centre_screen(s)[1]), Action("click", 5.0, 205.0)
        logged.append(logged_row(f"ok-{s}", s, good, 1.0, True, tok.target_ids("Click the box.", good, 16)))
        logged.append(logged_row(f"fail-{s}", s, bad, 0.15, False, tok.target_ids("Click the box.", bad, 16)))
    pl.DataFrame(logged).write_parquet(tmp_path / "logged.parquet")
    (tmp_path / "rl.py").write_text(SCRIPT)
    box_frame(16).write_parquet(tmp_path / "frame.parquet")

    ends = {}
    for processes in (1, 2):
        out = tmp_path / f"rl-{processes}"
        torchrun = Path(sys.executable).with_name("torchrun")
        command = [str(torchrun), "--standalone", f"--nproc_per_node={processes}", str(tmp_path / "rl.py"),
                   str(tmp_path), str(sft.checkpoint_path), str(out)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ends[processes] = out
    sft_ranks = [json.loads((ends[2] / "sft" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert sft_ranks[0]["digest"] == sft_ranks[1]["digest"]  # DDP kept the replicas identical
    assert sft_ranks[0]["losses"][-1] < sft_ranks[0]["losses"][0]  # and they learned
    a = torch.load(ends[1] / "sft" / "vla_checkpoint.pt", weights_only=True)["model"]  # written once, by rank 0
    b = torch.load(ends[2] / "sft" / "vla_checkpoint.pt", weights_only=True)["model"]
    drift = max(((a[k] - b[k]).norm() / (a[k].norm() + 1e-8)).item() for k in a if a[k].is_floating_point())
    assert drift < 0.05, drift  # the weights agree up to how the two halves' token means combine
    single = json.loads((ends[1] / "sft" / "rank-0.json").read_text())["losses"]
    assert abs(single[0] - sft_ranks[0]["losses"][0]) < 0.5  # the first step's loss: the same rows, split in two

    losses = {p: json.loads((ends[p] / "losses.json").read_text()) for p in (1, 2)}
    start = torch.load(sft.checkpoint_path, weights_only=True)["model"]
    for stage, folder in (("offline", "offline"), ("ppo", "ppo"), ("semi_online", "semi/ppo")):
        one, two = losses[1][stage], losses[2][stage]
        assert len(one) == len(two) > 0, (stage, one, two)  # the same number of updates: the same global batches
        assert np.allclose(one, two, rtol=1e-4), (stage, one, two)  # each step's loss over the global batch
        a = torch.load(ends[1] / folder / "vla_checkpoint.pt", weights_only=True)["model"]
        b = torch.load(ends[2] / folder / "vla_checkpoint.pt", weights_only=True)["model"]
        weights = [k for k in a if a[k].is_floating_point()]
        update = sum(((a[k] - start[k]) ** 2).sum() for k in weights) ** 0.5  # how far one process moved
        mismatch = sum(((a[k] - b[k]) ** 2).sum() for k in weights) ** 0.5  # how far two processes ended from it
        assert update > 0 and mismatch < 0.05 * update, (stage, float(mismatch / update))  # measured ~0.05 %
