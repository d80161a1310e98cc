#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, writes the tiny K3 checkpoint and
# runs the main job on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DK3PD_CUDA=OFF >/dev/null
cmake --build build -j"$(nproc)"
out=${K3PD_DEMO_DIR:-build/demo}
mkdir -p "$out"
./build/tools/mkckpt/k3pd-mkckpt --preset tiny --out "$out/tiny-k3" --seed 1
