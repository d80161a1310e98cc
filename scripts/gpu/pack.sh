#!/usr/bin/env bash
# Builds the whole cluster with CUDA on this (Debian 12, no GPU) machine and packs everything
# the GPU host lacks into one tarball (C-STACK.md §8: the GPU host has CUDA, NCCL and the driver
# but no grpc, libuv, protobuf-c, check, or a CUDA-enabled UCX, and no network):
#   bin/  k3pd-router k3pd-prefill k3pd-decode k3pd-cli k3pd-bench k3pd-plan k3pd-generate k3pd-mkckpt
#         k3pd-xfer-bench k3pd-null-worker (scripts/bench/router_capacity.sh) and the GPU test
#         programs (k3k-gpu-*, test_kernels), every one with RPATH
#         $ORIGIN/../lib (DT_RPATH: it also serves their libraries' dependencies)
#   lib/  the shared-library closure of those binaries except what the GPU host provides (glibc,
#         libstdc++/libgcc, the CUDA libraries, the driver), with UCX 1.13.1 rebuilt from
#         Debian's source WITH CUDA (scripts/gpu/build-ucx.sh) in place of Debian's libucp/uct/
#         ucs/ucm; lib/ucx/ holds UCX's transport modules (libuct_cuda: cuda_copy, cuda_ipc)
#   VERSION  the commit and build time
#
#   scripts/gpu/pack.sh [OUT]        (default OUT: .carry/gpu/k3pd-gpu.tar.xz)
#
# The tarball must fit one carry to the GPU host (64 MiB with the repository); the script fails
# above 56 MiB. On the GPU host: `tar -xJf k3pd-gpu.tar.xz -C DIR` and run DIR/bin/* directly
# (scripts/gpu/cluster.sh does). Build trees: build-pack/ (ignored by git; UCX is built once).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$root/.carry/gpu/k3pd-gpu.tar.xz}
work=$root/build-pack
jobs=${K3PD_PACK_JOBS:-$(nproc)}
cd "$root"
bash scripts/deps.sh
export PATH=$PATH:/usr/local/cuda/bin
bash scripts/gpu/build-ucx.sh "$work/ucx"
# RUNPATH $ORIGIN/../lib: the packed binaries find the packed libraries wherever the tarball is
# unpacked; in the build tree the directory does not exist and the system's libraries are used.
# DT_RPATH (--disable-new-dtags), not DT_RUNPATH: an executable's RPATH is searched for its
# libraries' own dependencies too (libgrpc's libcares, libucp's libuct), RUNPATH only for its
# direct ones, and the GPU host has an older libuct of its own that must not be picked up.
cmake -S . -B "$work/cmake" -DK3PD_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' -DCMAKE_SKIP_BUILD_RPATH=OFF \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags >/dev/null
cmake --build "$work/cmake" -j"$jobs"
stage=$work/stage
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib/ucx"
for b in router/k3pd-router prefill_worker/k3pd-prefill decode_worker/k3pd-decode tools/cli/k3pd-cli \
         tools/bench/k3pd-bench tools/plan/k3pd-plan tools/generate/k3pd-generate tools/mkckpt/k3pd-mkckpt \
         tools/xfer-bench/k3pd-xfer-bench tools/nullworker/k3pd-null-worker; do
  cp "$work/cmake/$b" "$stage/bin/"
done
for t in "$work"/cmake/tests/gpu/k3k-gpu-* "$work"/cmake/tests/kernels/test_kernels; do
  [ -x "$t" ] && cp "$t" "$stage/bin/"
done
# test_kernels: every op against the reference (dq-all.sh; `--real --require-device`: the fused
# ops at the real K3 shapes on the GPU); it carries the kernels' device code (~3.5 MiB packed)
strip --strip-debug "$stage/bin/test_kernels"
# UCX with CUDA replaces Debian's (same version and sonames, so the binaries link either).
cp -a "$work"/ucx/lib/libucp.so* "$work"/ucx/lib/libuct.so* "$work"/ucx/lib/libucs.so* \
      "$work"/ucx/lib/libucm.so* "$stage/lib/"
cp -a "$work"/ucx/lib/ucx/*.so* "$stage/lib/ucx/"
[ -x "$work/ucx/bin/ucx_info" ] && cp "$work/ucx/bin/ucx_info" "$work/ucx/bin/ucx_perftest" "$stage/bin/" 2>/dev/null || true
# The closure: everything the binaries and UCX's modules load, minus what the GPU host has.
host_has='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libnvidia-ml|libnccl|libucp|libuct|libucs|libucm)'
for f in "$stage"/bin/* "$stage"/lib/ucx/*.so "$stage"/lib/lib*.so.0; do
  LD_LIBRARY_PATH="$stage/lib:/usr/local/cuda/lib64" ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if ! [[ $name =~ $host_has ]]; then cp -L "$path" "$stage/lib/$name"; fi
done
git -C "$root" log -1 --format='%H %cI' > "$stage/VERSION" 2>/dev/null || echo unknown > "$stage/VERSION"
date -u +%FT%TZ >> "$stage/VERSION"
mkdir -p "$(dirname "$out")"
XZ_OPT=${XZ_OPT:--6 -T0} tar -C "$stage" -cJf "$out.tmp" .
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "k3pd: packed $(ls "$stage/bin" | wc -l) programs and $(ls "$stage/lib" | wc -l) libraries into $out ($((size >> 20)) MiB)"
if [ "$size" -gt $((56 << 20)) ]; then
  echo "k3pd: $out is larger than 56 MiB: it will not fit one carry to the GPU host" >&2
  exit 1
fi
