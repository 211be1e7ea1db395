#!/bin/bash
# Issue 46: the CPU path before and after the device changes, in one run (README.md here).
#   git worktree add /tmp/before 4d8c181 && git worktree add /tmp/after 988c59f
#   docs/bench/issue46_cpu_ab/ab.sh /tmp/before /tmp/after /tmp/ab46      # each tree needs ../shared/data beside it
# `seqvae fit` (40 updates of yahoo10k base + max) and its test (2 batches, K = 100), one thread, three rounds
# alternating the trees; CPU seconds of each whole command (/usr/bin/time) and its metrics.json.
set -u
before=$1; after=$2; out=$3; py=${PYTHON:-python}
mkdir -p "$out"
for round in 1 2 3; do
  for side in before after; do
    tree=${!side}
    rm -rf "/tmp/ab46_$side"
    (cd "$tree" && /usr/bin/time -f "$side round $round user %U sys %S wall %e" -a -o "$out/times.txt" \
      env PYTHONPATH="$tree" OMP_NUM_THREADS=1 "$py" -m seqvae fit --config configs/yahoo10k/base.yaml \
      --config configs/yahoo10k/max.yaml --trainer.max_epochs 1 --trainer.limit_train_batches 40 \
      --trainer.limit_val_batches 0 --model.test_iw_samples 100 --trainer.limit_test_batches 2 \
      --trainer.logger.init_args.save_dir "/tmp/ab46_$side" > "$out/${side}_$round.log" 2>&1)
    cp "/tmp/ab46_$side/max/version_0/metrics.json" "$out/${side}_$round.metrics.json"
    echo "load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/times.txt"
  done
done
