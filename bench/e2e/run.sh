#!/usr/bin/env bash
# Run `car bench` on the four end-to-end benchmark models (written by make-models.sh) and print a markdown
# table with llama.cpp's reference figures (llama-bench on the same shapes and types; docs/performance.md)
# beside ours.
#
#   bench/e2e/run.sh MODELS_DIR
#
# Environment: CAR (the car binary; default build/tools/car), THREADS (2), P (128), N (64), REPS (3),
# BANDWIDTH_GBS (38), OUT (a directory to keep each model's `car bench --json` output; default a temp dir).
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 MODELS_DIR" >&2
  exit 2
fi
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
car=${CAR:-$here/../../build/tools/car}
threads=${THREADS:-2}
p=${P:-128}
n=${N:-64}
reps=${REPS:-3}
bw=${BANDWIDTH_GBS:-38}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
command -v jq >/dev/null || { echo "$0: needs jq" >&2; exit 2; }
[[ -x $car ]] || { echo "$0: no car binary at $car (set CAR=...)" >&2; exit 2; }

# name | llama.cpp prefill tok/s | llama.cpp decode tok/s (llama-bench -t 2 -p 128 -n 64)
models=(
  "dense-1b-q4_k_m|208|58.7"
  "dense-1b-q8_0|145|35.8"
  "moe-2b-q4_k_m|274|117"
  "moe-2b-q8_0|201|77.8"
)

echo "| model | file MB | pp$p tok/s | llama.cpp pp | tg$n tok/s | llama.cpp tg | weight MB read / token | decode bound tok/s ($bw GB/s) | of bound | peak RSS MiB |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for entry in "${models[@]}"; do
  IFS='|' read -r name ref_pp ref_tg <<<"$entry"
  file=$dir/$name.gguf
  if [[ ! -f $file ]]; then
    echo "| $name | missing: $file | | $ref_pp | | $ref_tg | | | | |"
    continue
  fi
  json=$out/$name.json
  "$car" bench "$file" -p "$p" -n "$n" -r "$reps" --threads "$threads" --bandwidth-gbs "$bw" --json >"$json"
  jq -r --arg name "$name" --arg rpp "$ref_pp" --arg rtg "$ref_tg" '
    "| \($name) | \(.file_bytes / 1e6 | floor) | \(.pp.tokens_per_s.mean * 10 | round / 10) ± \(.pp.tokens_per_s.stdev * 10 | round / 10) | \($rpp) | \(.tg.tokens_per_s.mean * 10 | round / 10) ± \(.tg.tokens_per_s.stdev * 10 | round / 10) | \($rtg) | \(.weight_bytes_per_token / 1e6 | floor) | \(.decode_bound_tokens_per_s * 10 | round / 10) | \(.decode_fraction_of_bound * 100 | round)% | \(.peak_rss_bytes / 1048576 | floor) |"
  ' "$json"
done
echo
echo "car bench -p $p -n $n -r $reps --threads $threads (ISA ${CAR_INFERENCE_ISA:-auto}); JSON in $out"
