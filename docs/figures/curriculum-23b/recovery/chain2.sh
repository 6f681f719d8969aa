#!/usr/bin/env bash
# curriculum-23 on this (faster) machine: the same shared SFT (rebuilt from its bundle), `sft` again, then the
# remaining arms, so each pairs with an `sft` trained on the same CPU.
set -x
PY=~/.cache/flywheel/venvs/all-33ece7726338/bin/python
export PYTHONPATH=/work/exp23
cd /work/main
$PY -m flywheel.cli experiment curriculum --out /work/main/runs/curriculum-23b --eval-browsers 2 \
  --arms sft,sft_semi_online,sft_offline_ppo,sft_offline_databc
