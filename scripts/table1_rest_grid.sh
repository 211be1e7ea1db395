#!/bin/bash
# Issue 48's grids (configs/sweeps/{yahoo10k,yelp10k}_table1_rest.yaml) in one resumable command: the sweep's cells
# (two at a time, one thread each; cells already exported are skipped, an interrupted one resumes from last.ckpt),
# then, for every exported WAE-RNF cell that lacks it, both IW-NLL estimators per text on the same draws
# (`seqvae rnf-nll --per-text`, K = 100 as the committed cells have it: the gap between two estimators sharing K and
# draws is the comparison; the correct IW-NLL at K = 500 is the cell's metrics.json) written beside the cell's
# exported files. Run from the repository root; extra arguments go to `seqvae sweep`:
#   scripts/table1_rest_grid.sh configs/sweeps/yahoo10k_table1_rest.yaml --variants ivae_sgd,wae_rnf --seeds 2,3
set -euo pipefail
grid=${1:?usage: scripts/table1_rest_grid.sh GRID.yaml [seqvae sweep options]}
shift
py=${PYTHON:-python}
field() { sed -n "s/^$1: *//p" "$grid"; }
root=$(field root)
export_dir=$(field export)
[ -n "$root" ] && [ -n "$export_dir" ] || { echo "$grid: needs root: and export: lines" >&2; exit 2; }
OMP_NUM_THREADS=1 "$py" -m seqvae sweep "$grid" --jobs "${JOBS:-2}" "$@"
for cell in "$export_dir"/wae_rnf/seed*; do
  [ -f "$cell/metrics.json" ] && [ ! -f "$cell/rnf_nll.csv" ] || continue
  run="$root/wae_rnf/$(basename "$cell")"
  # written to a temporary name first: an interrupted call leaves no half file that the check above would skip
  rm -f "$cell/rnf_nll.csv.part"  # an interrupted call's; rnf-nll writes a new file only
  OMP_NUM_THREADS=1 "$py" -m seqvae rnf-nll "$run" --samples 100 --per-text "$cell/rnf_nll.csv.part"
  mv "$cell/rnf_nll.csv.part" "$cell/rnf_nll.csv"
done
