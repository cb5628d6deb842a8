#!/usr/bin/env bash
# Write the four end-to-end benchmark models with `car gguf synth` (seeded random weights,
# 32000-token vocabulary) into DIR:
#
#   dense-1b-q4_k_m.gguf  dense-1b-q8_0.gguf   llama dense: n_embd 2048, 16 layers, 16 heads, 8 kv heads, n_ff 5632
#   moe-2b-q4_k_m.gguf    moe-2b-q8_0.gguf     llama MoE (Mixtral layout): n_embd 1024, 16 layers, 16 heads,
#                                              8 kv heads, 8 experts top-2, expert n_ff 2816
#
# q4_k_m is synth's llama-quantize-like mix (Q4_K, with Q6_K for output and, in the "more bits" layers,
# for attn_v and ffn_down); norms and the MoE router stay F32. Existing files are kept unless FORCE=1.
# About 3.6 GB in total; the files are not to be committed.
#
#   bench/e2e/make-models.sh DIR        (CAR=path/to/car to pick the binary; default build/tools/car)
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
car=${CAR:-$here/../../build/tools/car}
[[ -x $car ]] || { echo "$0: no car binary at $car (set CAR=...)" >&2; exit 2; }
mkdir -p "$dir"

dense=(--arch llama --layers 16 --embd 2048 --heads 16 --kv-heads 8 --ff 5632 --vocab 32000 --ctx 4096)
moe=(--arch llama --layers 16 --embd 1024 --heads 16 --kv-heads 8 --ff 2816 --experts 8 --experts-used 2
     --vocab 32000 --ctx 4096)

make() {
  local name=$1 type=$2
  shift 2
  local file=$dir/$name-$type.gguf
  if [[ -f $file && ${FORCE:-0} != 1 ]]; then
    echo "keep  $file"
    return
  fi
  echo "write $file"
  "$car" gguf synth "$@" --type "$type" --seed 1 --name "$name-$type" -o "$file"
}

make dense-1b q4_k_m "${dense[@]}"
make dense-1b q8_0 "${dense[@]}"
make moe-2b q4_k_m "${moe[@]}"
make moe-2b q8_0 "${moe[@]}"
ls -l "$dir"/*.gguf
