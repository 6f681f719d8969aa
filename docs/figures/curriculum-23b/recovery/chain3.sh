#!/usr/bin/env bash
# When chain2 reaches its last arm (sft_offline_databc): stop it (the arm resumes at its first round), re-evaluate
# the first machine's final bundles on the evaluation seeds (paired figures, SOP checkpoints), run SOP vs live
# success over curriculum-23b's checkpoints, then resume the last arm.
set -x
LOG=/work/main/runs/curriculum-23b-arms.out
until grep -q "arm sft_offline_databc: stages" $LOG; do sleep 15; done
P=$(pgrep -f chain2.sh | head -1)
kill -TERM -- -$(ps -o pgid= -p $P | tr -d ' ')
sleep 5
PY=~/.cache/flywheel/venvs/all-33ece7726338/bin/python
export PYTHONPATH=/work/exp23
cd /work/main
F=docs/figures/curriculum-23
for arm in sft sft_offline sft_ppo sft_offline_refkl; do
  $PY /work/scripts/reeval.py runs/curriculum-23b $arm $F/$arm.vla first-machine-$arm 4
done
$PY /work/scripts/reeval.py runs/curriculum-23b sft_ppo $F/collapse/sft_ppo_459s.vla first-machine-sft_ppo-collapsed 1
$PY /work/scripts/reeval.py runs/curriculum-23b sft_ppo $F/no-thought-anchor/sft_ppo.vla first-machine-sft_ppo-no-thought-anchor 4
$PY -m flywheel.cli experiment sop --out runs/sop-23 --curriculum runs/curriculum-23b --episodes 50
$PY -m flywheel.cli experiment curriculum --out /work/main/runs/curriculum-23b --eval-browsers 2 \
  --arms sft,sft_semi_online,sft_offline_ppo,sft_offline_databc
