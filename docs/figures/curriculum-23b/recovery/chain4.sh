#!/usr/bin/env bash
# When chain2 reaches its last arm (sft_offline_databc): stop it (that arm is left for the next session),
# re-evaluate the first machine's final bundles on the evaluation seeds (paired figures, SOP checkpoints), run
# SOP vs live success over curriculum-23b's checkpoints, then a 10-minute pilot of the successes-only lever on
# the selection seeds.
set -x
LOG=/work/main/runs/curriculum-23b-arms.out
until grep -q "arm sft_offline_databc: stages" $LOG; do sleep 15; done
P=$(pgrep -f chain2.sh | head -1)
kill -TERM -- -$(ps -o pgid= -p $P | tr -d ' ')
sleep 5
PY=~/.cache/flywheel/venvs/all-33ece7726338/bin/python
cd /work/main
F=docs/figures/curriculum-23
for arm in sft sft_offline sft_ppo sft_offline_refkl; do
  PYTHONPATH=/work/exp23 $PY /work/scripts/reeval.py runs/curriculum-23b $arm $F/$arm.vla first-machine-$arm 4
done
PYTHONPATH=/work/exp23 $PY /work/scripts/reeval.py runs/curriculum-23b sft_ppo $F/collapse/sft_ppo_459s.vla first-machine-sft_ppo-collapsed 1
PYTHONPATH=/work/exp23 $PY /work/scripts/reeval.py runs/curriculum-23b sft_ppo $F/no-thought-anchor/sft_ppo.vla first-machine-sft_ppo-no-thought-anchor 4
PYTHONPATH=/work/exp23 $PY -m flywheel.cli experiment sop --out runs/sop-23 --curriculum runs/curriculum-23b --episodes 50
mkdir -p runs/pilot-successes-only && cp -al runs/curriculum-23b/shared runs/pilot-successes-only/shared
rm -f runs/pilot-successes-only/shared/eval-0.json runs/pilot-successes-only/shared/model-0.vla
PYTHONPATH=/work/main $PY -m flywheel.cli experiment curriculum --out runs/pilot-successes-only --eval-browsers 2 \
  --arms sft_ppo --tune --budget-minutes 10 --curve-points 2 \
  --online-lr 3e-4 --online-negative-weight 0 --online-target-kl 0
