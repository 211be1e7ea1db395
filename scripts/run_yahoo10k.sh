#!/usr/bin/env bash
# Resumable yahoo10k runs: for each variant, skip it if it finished, resume it from last.ckpt if
# it was interrupted, else start it; then export config.yaml, metrics.json and curves.csv to
# docs/results/yahoo10k/<variant>/ (small files, committed; checkpoints stay in runs/).
#   scripts/run_yahoo10k.sh [VARIANT ...]          (default: last max)
# Environment: EPOCHS (default 20), IW (test importance samples, default 100), SEED (default 1).
# A variant that fails is reported and skipped; the others still run; the exit status is 1 then.
set -euo pipefail
cd "$(dirname "$0")/.."
# The README's install puts seqvae in .venv; use it when the caller did not activate it.
command -v seqvae >/dev/null || { [ -f .venv/bin/activate ] && . .venv/bin/activate; }
EPOCHS=${EPOCHS:-20}; IW=${IW:-100}; SEED=${SEED:-1}
variants=("$@"); [ ${#variants[@]} -gt 0 ] || variants=(last max)
failed=()
for v in "${variants[@]}"; do
  run=runs/yahoo10k/$v/seed$SEED
  args=(--config configs/yahoo10k/base.yaml --config configs/yahoo10k/$v.yaml
        --seed_everything "$SEED" --trainer.max_epochs "$EPOCHS" --model.test_iw_samples "$IW"
        --trainer.logger.init_args.version "seed$SEED")
  if [ -f "$run/metrics.json" ]; then
    echo "== $v: finished ($run/metrics.json)"
  elif [ -f "$run/checkpoints/last.ckpt" ]; then
    echo "== $v: resuming from $run/checkpoints/last.ckpt"
    seqvae fit "${args[@]}" --ckpt_path "$run/checkpoints/last.ckpt" || { failed+=("$v"); continue; }
  else
    echo "== $v: starting in $run"
    seqvae fit "${args[@]}" || { failed+=("$v"); continue; }
  fi
  python scripts/export_run.py "$run" "docs/results/yahoo10k/$v/seed$SEED"
done
if [ ${#failed[@]} -gt 0 ]; then echo "== failed: ${failed[*]}"; exit 1; fi
