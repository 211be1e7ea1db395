#!/bin/bash
# Test the LAST checkpoint of every finished cell of configs/sweeps/yahoo10k_long_warmup.yaml at K = 500
# (the fit itself tests the best-validation-loss one, He et al.'s choice), so that a checkpoint picked
# mid-warm-up is not read as one trained at KL weight 1 (issue 50). Each result is exported to
# docs/results/yahoo10k_long_warmup_last/<variant>/<seed>/. A cell whose best checkpoint was saved at
# its last update (best_updates == decoder_updates) has the same weights in both files: it is not
# tested again, and a note says so. Run from the repository root after (or beside) the sweep:
#   scripts/long_warmup_last.sh            # every finished cell, once
set -euo pipefail
root=${ROOT:-runs/yahoo10k_long_warmup}
dest=${DEST:-docs/results/yahoo10k_long_warmup_last}
py=${PYTHON:-python}
for run in "$root"/*/seed*; do
  [ -f "$run/metrics.json" ] || continue                       # the fit (and its best-checkpoint test) is not done
  cell=${run#"$root"/}
  [ -f "$dest/$cell/metrics.json" ] && continue                # tested before
  same=$("$py" -c "import json,sys; m=json.load(open(sys.argv[1])); print(int(m['best_updates'] == m['decoder_updates']))" "$run/metrics.json")
  if [ "$same" = 1 ]; then
    echo "$cell: best.ckpt is the last update's weights; last.ckpt not tested again"
    continue
  fi
  # Before 2026-12-06 Lightning left last.ckpt at the best epoch (or a 10-minute save) when the final epochs did
  # not improve val/loss (docs/usage.md, "Resume after a crash"): test it only if it holds the run's last update.
  held=$("$py" -c "import json, sys, torch; m = json.load(open(sys.argv[1])); c = torch.load(sys.argv[2], map_location='cpu', weights_only=False); print(c['seqvae']['num_updates'], m['decoder_updates'])" "$run/metrics.json" "$run/checkpoints/last.ckpt")
  if [ "${held% *}" != "${held#* }" ]; then
    echo "$cell: last.ckpt holds ${held% *} updates, the run made ${held#* }: not the last update's weights; not tested"
    continue
  fi
  before=$(ls -d "$(dirname "$run")"/version_* 2>/dev/null || true)
  OMP_NUM_THREADS=1 "$py" -m seqvae test --config "$run/config.yaml" --ckpt_path "$run/checkpoints/last.ckpt"
  retest=$(comm -13 <(echo "$before" | tr ' ' '\n' | sort) <(ls -d "$(dirname "$run")"/version_* | sort) | tail -1)
  "$py" -m seqvae export "$retest" "$dest/$cell"
done
