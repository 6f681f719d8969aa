#!/usr/bin/env bash
# Third machine: rebuild curriculum-23b's shared part from the committed files (recovery/), re-evaluate the
# second machine's `sft` bundle so the new arm pairs with it, then run the seventh arm, sft_offline_databc.
set -ex
PY=~/.cache/flywheel/venvs/all-33ece7726338/bin/python
export PYTHONPATH=/work/exp23
R=/work/exp23/docs/figures/curriculum-23b/recovery
cd /work/main
OUT=runs/curriculum-23b
mkdir -p $OUT/shared
$PY - <<'PYEOF'
import json
r = json.load(open("docs/figures/curriculum-23b/curriculum.json"))
meta = {"rl_set": r["rl_set"], "sft_wall_s": r["shared"]["sft_wall_s"], "sft_cpu_s": r["shared"]["sft_cpu_s"],
        "sft_steps": r["shared"]["sft_steps"]}
json.dump(meta, open("runs/curriculum-23b/shared/meta.json", "w"), indent=2)
PYEOF
cp docs/figures/curriculum-23b/curriculum.json $OUT/curriculum.json
$PY -m flywheel.cli experiment curriculum --out $OUT --eval-browsers 2 --shared-only
$PY $R/restore_sft.py $OUT/shared/sft/vla_checkpoint.pt $OUT/shared/model-0.vla docs/figures/curriculum-23/shared_sft.vla /tmp/restored_ckpt.pt | tee /tmp/restore.out
grep -q "weights.bin identical: True wte identical: True" /tmp/restore.out
cp /tmp/restored_ckpt.pt $OUT/shared/sft/vla_checkpoint.pt
rm -f $OUT/shared/model-0.vla $OUT/shared/eval-0.json
$PY $R/reeval.py $OUT sft docs/figures/curriculum-23b/sft.vla sft 4
$PY -m flywheel.cli experiment curriculum --out $OUT --eval-browsers 2 --arms sft_offline_databc
