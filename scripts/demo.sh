#!/usr/bin/env bash
# Set up, build, and run the main job end to end:   bash scripts/demo.sh
# Writes a synthetic model with `car gguf synth`, starts car-inferenced on a private socket and models
# directory, streams an answer to one `infer` request, prints the daemon's stats, and stops the daemon.
# DEMO_DIR (default: a new temporary folder) keeps the model and socket; DEMO_PROMPT changes the prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --build  # neither GoogleTest, Google Benchmark nor clang
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target car car-inferenced
dir="${DEMO_DIR:-$(mktemp -d /tmp/car-demo.XXXXXX)}"
mkdir -p "$dir/models" "$dir/state"
model="$dir/models/demo.gguf"
if [ ! -f "$model" ]; then
  ./build/tools/car gguf synth --arch llama --layers 4 --embd 256 --ff 768 --heads 8 --kv-heads 4 \
      --vocab 1024 --type q8_0 --seed 42 -o "$model"
fi
./build/tools/car gguf inspect "$model" > "$dir/inspect.txt"
head -n 20 "$dir/inspect.txt"
# The real (tiny, trained) stories260K model writes English; use it too when the shared fixtures are here.
stories="${CAR_CONFORMANCE_DIR:-../shared/conformance}/models/stories260K.gguf"
[ -f "$stories" ] && cp "$stories" "$dir/models/stories.gguf"
sock="$dir/car.sock"
./build/daemon/car-inferenced --socket "$sock" --models-dir "$dir/models" --state-dir "$dir/state" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
./build/tools/car health --socket "$sock"
./build/tools/car infer demo "${DEMO_PROMPT:-Once upon a time}" --max-tokens 32 --temperature 0 --socket "$sock"
if [ -e "$dir/models/stories.gguf" ]; then
  ./build/tools/car infer stories "Once upon a time" --max-tokens 48 --temperature 0 --socket "$sock"
fi
./build/tools/car stats --socket "$sock"
