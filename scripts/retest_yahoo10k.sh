#!/usr/bin/env bash
# Test the best checkpoints of finished yahoo10k runs again, with today's metrics (e.g. the
# feature-space EV_k / effective ranks added after the runs), into runs/yahoo10k_retest/ and
# docs/results/yahoo10k_retest/<method>/seed<N>/ (config.yaml, metrics.json).
#   scripts/retest_yahoo10k.sh METHOD ...     IW=0 (importance samples; 0 skips IW-NLL), SEED=1
# The evaluation noise is seeded per pass, so a retest with the run's own K reproduces its
# metrics.json numbers exactly (checked: last, K = 100, IW-NLL 402.9337 both times).
set -uo pipefail
cd "$(dirname "$0")/.."
command -v seqvae >/dev/null || { [ -f .venv/bin/activate ] && . .venv/bin/activate; }
IW=${IW:-0}; SEED=${SEED:-1}; failed=0
for m in "$@"; do
  ckpt=runs/yahoo10k/$m/seed$SEED/checkpoints/best.ckpt
  seqvae test --config configs/yahoo10k/base.yaml --config configs/yahoo10k/$m.yaml --ckpt_path "$ckpt" \
    --model.test_iw_samples "$IW" --trainer.logger.init_args.save_dir runs/yahoo10k_retest \
    --trainer.logger.init_args.name "$m" --trainer.logger.init_args.version "seed$SEED" || { failed=1; continue; }
  python scripts/export_run.py "runs/yahoo10k_retest/$m/seed$SEED" "docs/results/yahoo10k_retest/$m/seed$SEED"
done
exit $failed
