#!/usr/bin/env bash
# The prepared script for the first session that is lent a GPU machine (issue 46): one call, at
# most 8 minutes of device time with CUDA's start-up, that returns useful files even when cut off.
#
#   here, first:   scripts/gpu_session.sh prepare
#       puts what the GPU image lacks into .gpu/ (git-ignored, never committed): the wheels of
#       jsonargparse, omegaconf, docstring_parser, typeshed_client, and a copy of the Yahoo text
#       (../shared does not travel to the GPU machine; the copy is excluded from git).
#   there, once:   run(command="scripts/gpu_session.sh run", carry=[".gpu"], timeout_s=480)
#   here, dry run: SMOKE=1 scripts/gpu_session.sh run   (after prepare; tests/test_gpu_session.py
#       runs it in a copy of the tree with no ../shared beside it)
#
# `run`, every step with its own deadline (LIMIT_S, default 450 s, bounds the whole):
#   1. pre-flight (~15 s): nvidia-smi, versions, the imports, the carried data (10,000 lines):
#      a missing piece stops the session with one line, before any GPU time is spent on work.
#   2. scripts/gpu_probe.py (PROBE_S, default 130 s): training tokens/s through the real Trainer in
#      default / TF32 / bf16 and with one-chunk output layer, host reads per step, peak memory,
#      IW-NLL s/text at K = 500 on a 32-text batch at today's and at larger chunks -> probe.json.
#   3. yahoo10k at the paper's width (emb 512, LSTM 1024, full vocabulary), max vs last pooling,
#      seeds 1 and 2, all four side by side, fp32 with TF32 matmuls, the 10-epoch KL warm-up and
#      2 epochs at full weight, IW-NLL with K = 500 on the 1,000 test texts; train/val/test are
#      the carried copy's lines 1-8000 / 8001-9000 / 9001-10000. Each fit has its own deadline
#      (the time left less 25 s); its epoch lines (val KL, MI, AU) are in fits.log even when cut.
# Everything goes to $OUT (at most 8 files come back): env.txt, preflight.log, probe.json,
# probe.log, fits.log, results.tgz, session.log.
# SMOKE=1: the same steps and the same arguments on the CPU; only the device and the sizes differ.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

if [ "$mode" = prepare ]; then
  set -e
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
  mkdir -p .gpu/whl .gpu/yahoo
  python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/whl \
    jsonargparse==4.53.0 omegaconf==2.4.0 docstring_parser==0.18.0 typeshed_client==2.15.0
  cp ../shared/data/yahoo/valid.txt .gpu/yahoo/valid.txt
  du -sh .gpu
  exit 0
fi
[ "$mode" = run ] || { echo "usage: scripts/gpu_session.sh prepare|run" >&2; exit 2; }

OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
start=$(date +%s)
left() { echo $(( ${LIMIT_S:-450} - ($(date +%s) - start) )); }
log() { echo "[gpu_session $(( $(date +%s) - start ))s] $*" | tee -a "$OUT/session.log"; }
stop() { log "STOP: $*"; exit 1; }
export PYTHONUNBUFFERED=1
data=.gpu/yahoo/valid.txt  # the carried copy, in the dry run too: ../shared is not there

# ---- 1. pre-flight
if [ "${SMOKE:-0}" = 1 ]; then
  accel=cpu; device=cpu; probe=(--smoke)
  size=(--model.embed_dim 16 --model.hidden_dim 16 --data.max_vocab 500 --trainer.limit_train_batches 2
        --trainer.limit_val_batches 1 --trainer.limit_test_batches 1 --model.test_iw_samples 5)
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  accel=gpu; device=cuda; probe=()
  size=(--data.max_vocab null --model.test_iw_samples 500)
  nvidia-smi > "$OUT/env.txt" 2>&1 || stop "nvidia-smi failed (no GPU?): see env.txt"
  [ -d .gpu/whl ] || stop ".gpu/whl missing: run scripts/gpu_session.sh prepare here and carry .gpu"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
    > "$OUT/preflight.log" 2>&1 || stop "installing .gpu/whl failed: see preflight.log"
  export PYTHONPATH=/tmp/site:$PWD
fi
[ -f "$data" ] || stop "$data missing: run scripts/gpu_session.sh prepare here and carry .gpu"
n=$(wc -l < "$data"); [ "$n" -ge 10000 ] || stop "$data has $n lines, not the 10,000 the splits read"
$PY - >> "$OUT/env.txt" 2>&1 <<PYEOF || stop "imports failed: see env.txt"
import torch, pytorch_lightning, jsonargparse, omegaconf, seqvae.cli
print("torch", torch.__version__, "cuda", torch.version.cuda, "lightning", pytorch_lightning.__version__, "jsonargparse", jsonargparse.__version__)
if "$device" == "cuda":
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    print(torch.cuda.get_device_name(), torch.cuda.mem_get_info())
PYEOF
log "pre-flight passed ($device): $(tail -n 2 "$OUT/env.txt" | tr '\n' ' ')"

# ---- 2. the probe, one process
p=$(( ${PROBE_S:-130} < $(left) - 200 ? ${PROBE_S:-130} : $(left) - 200 ))
timeout "$p" $PY scripts/gpu_probe.py --device "$device" "${probe[@]}" --data "$data" --json "$OUT/probe.json" \
  --deadline $(( p - 25 )) > "$OUT/probe.log" 2>&1
log "probe exit $? (deadline ${p}s)"

# ---- 3. the paper-width fits, side by side
f=$(( $(left) - 25 ))
[ "$f" -gt 60 ] || stop "no time left for the fits"
splits=(--data.train "$data#1-8000" --data.val "$data#8001-9000" --data.test "$data#9001-10000")
work=$(mktemp -d)
log "3. yahoo10k at the paper's width: max vs last, seeds 1-2, ${f}s each"
for m in max last; do
  for seed in 1 2; do
    timeout "$f" $PY -m seqvae fit --config configs/yahoo10k/base.yaml --config configs/yahoo10k/$m.yaml \
      "${splits[@]}" --seed_everything $seed --trainer.accelerator "$accel" --trainer.precision 32-true \
      --model.embed_dim 512 --model.hidden_dim 1024 --model.iw_max_elements null \
      --model.kl_schedule.init_args.warmup_epochs 10 --trainer.max_epochs 12 "${size[@]}" \
      --trainer.logger.init_args.save_dir runs/gpu --trainer.logger.init_args.version "paper_seed$seed" \
      > "$work/$m.$seed.log" 2>&1 &
  done
done
wait
finished=0
for m in max last; do
  for seed in 1 2; do
    d=runs/gpu/$m/paper_seed$seed
    if [ -f "$d/metrics.json" ]; then finished=$((finished + 1)); log "$m seed $seed finished"
    else log "$m seed $seed did not finish in ${f}s: its epoch lines are in fits.log"; fi
    [ -d "$d" ] && $PY -m seqvae export "$d" "$work/results/$m/seed$seed" > /dev/null 2>&1
    { echo "==== $m seed $seed"; grep '^seqvae' "$work/$m.$seed.log"; grep -v '^\s*$' "$work/$m.$seed.log" | tail -n 30; } >> "$OUT/fits.log"
  done
done
tar czf "$OUT/results.tgz" -C "$work" results 2>/dev/null || true
log "done: $finished of 4 fits finished; $(left)s of ${LIMIT_S:-450}s left"
