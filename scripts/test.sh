#!/usr/bin/env bash
# The README's test command: installs dependencies, builds the tree twice and runs every test.
#   1. build-asan: CPU backend under AddressSanitizer + UndefinedBehaviorSanitizer; all of ctest
#      except the GPU tests and tests labelled *_known (a documented known disagreement that
#      still fails: run them with `ctest -L _known`; none today).
#   2. build-cuda: only when nvcc exists: compiles the CUDA backend (no GPU needed to build);
#      the CPU tests are not repeated there. Without a GPU (no nvidia-smi device), checks that a
#      CUDA-built worker started with --backend cuda exits 1 naming the unusable device.
# Environment: K3PD_TEST_JOBS (default: nproc), K3PD_SKIP_CUDA_BUILD=1 to skip step 2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=${K3PD_TEST_JOBS:-$(nproc)}
cmake -S . -B build-asan -DK3PD_CUDA=OFF -DK3PD_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build-asan -j"$jobs"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE 'gpu|_known'
if [ "${K3PD_SKIP_CUDA_BUILD:-0}" != 1 ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  export PATH=$PATH:/usr/local/cuda/bin
  cmake -S . -B build-cuda -DK3PD_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build-cuda -j"$jobs"
  echo "k3pd: CUDA backend compiled (GPU tests run on a GPU host: scripts/gpu/run.sh)"
  # The CUDA binaries start without a GPU or libcuda, and --backend cuda then fails clearly,
  # naming the device (the loader probes it before building the runner).
  if ! nvidia-smi -L >/dev/null 2>&1; then
    set +e
    out=$(build-cuda/decode_worker/k3pd-decode --backend cuda --synthetic tiny --router 127.0.0.1:1 2>&1)
    st=$?
    set -e
    if [ "$st" != 1 ] || ! grep -q -- "--backend cuda: CUDA device 0 is not usable: " <<<"$out"; then
      echo "k3pd: FAIL: k3pd-decode --backend cuda without a GPU: exit $st, expected 1 and the device named:"
      echo "$out"
      exit 1
    fi
    echo "k3pd: --backend cuda without a GPU: exit 1, '$(grep -m1 -o -- '--backend cuda: CUDA device 0 is not usable: .*' <<<"$out")'"
  fi
fi
