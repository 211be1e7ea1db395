#!/bin/bash
# The paper's Figures 2-3 (3-unit encoder, 3-d z: last, last + cosine regulariser, max) on yahoo10k with the
# long KL warm-up of configs/sweeps/yahoo10k_long_warmup.yaml (96 epochs, 104 in all), at both inits (issue 50):
# six runs of ~2.5 h on one core each, JOBS at a time (default 2), one thread each; resumable (rerun it). When all
# six have finished, the last two calls draw the figures into docs/figures/feature_space/yahoo10k_long_<init>*.png
# from the finished runs (loaded, not retrained), and each finished run's small files (config.yaml, curves.csv,
# metrics.json, per_text.csv) are exported to docs/results/feature_space_long/<init>/<variant>/seed1, so the figures' KL curves and
# cosines can be checked against files. Run from the repository root:
#   scripts/feature_space_long.sh
set -euo pipefail
py=${PYTHON:-python}
jobs=${JOBS:-2}
study=(scripts/studies.py feature-space --dataset yahoo10k --epochs 104 --warmup-epochs 96)
for init in reference pytorch; do for v in last cosine max; do echo "$init $v"; done; done |
  OMP_NUM_THREADS=1 xargs -P "$jobs" -L 1 sh -c "\"$py\" ${study[*]} --init \$0 --tag long_\$0 --variants \$1 > /dev/null"
for init in reference pytorch; do
  OMP_NUM_THREADS=1 "$py" "${study[@]}" --init "$init" --tag "long_$init"
done
for init in reference pytorch; do for v in last cosine max; do
  run=runs/feature_space/yahoo10k_long_$init/$v/seed1
  if [ -f "$run/metrics.json" ]; then OMP_NUM_THREADS=1 "$py" -m seqvae export "$run" "docs/results/feature_space_long/$init/$v/seed1"; fi
done; done
