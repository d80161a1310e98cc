#!/usr/bin/env bash
# Builds one libFuzzer harness with clang (ASan + UBSan), compiling the sources it exercises
# directly (the main build uses gcc), and runs it for a bounded time on a seed corpus: the
# committed one (tests/fuzz/corpus/NAME) or, for the binary protocols, seeds the real encoders
# write (k3pd-fuzz-seeds). Exit 77 (ctest SKIP_RETURN_CODE) when clang or libFuzzer is missing.
# usage: run_fuzz.sh SOURCE_DIR WORK_DIR NAME SECONDS [PROTO_GEN_DIR SEEDS_BIN]
#   fuzz_safetensors, fuzz_config  the checkpoint parsers (common/ckpt)
#   fuzz_rpc                       every RPC message: NUL walk, protobuf-c unpack, validators
#   fuzz_xfer                      the transfer wire messages (DONE, LAYER, ACK, DATA, descriptor)
set -euo pipefail
src=$1 work=$2 name=$3 secs=$4 gen=${5:-} seeds_bin=${6:-}
command -v clang >/dev/null 2>&1 || { echo "clang not found: skipping $name"; exit 77; }
mkdir -p "$work"
bin="$work/$name"
flags="-g -O1 -std=c17 -D_GNU_SOURCE -DK3PD_VERSION=\"fuzz\" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
base=("$src"/common/base/err.c "$src"/common/base/log.c "$src"/common/base/util.c)
case $name in
  fuzz_rpc)
    srcs=("$src/common/rpc/validate.c" "$src/common/rpc/wirecheck.c" "$gen"/k3pd/v1/*.pb-c.c
          "$gen"/grpc/health/v1/health.pb-c.c)
    inc=(-I"$src/common/include" -I"$src/common/rpc" -I"$gen")
    libs=$(pkg-config --cflags --libs libprotobuf-c grpc libuv) ;;
  fuzz_xfer)
    srcs=("$src/common/xfer/wire.c" "$src/common/xfer/desc.c" "${base[@]}")
    inc=(-I"$src/common/include" -I"$src/common/xfer")
    libs=$(pkg-config --cflags --libs ucx libuv libxxhash) ;;
  *)
    srcs=("$src"/common/ckpt/*.c "${base[@]}")
    inc=(-I"$src/common/include" -I"$src/common/ckpt")
    libs=$(pkg-config --cflags --libs jansson libxxhash) ;;
esac
# shellcheck disable=SC2086
if ! clang $flags "${inc[@]}" "$src/tests/fuzz/$name.c" "${srcs[@]}" $libs -lm -lpthread -o "$bin" \
     2>"$work/$name.build.log"; then
  if grep -q "libclang_rt.fuzzer\|fuzzer.*not found\|cannot find" "$work/$name.build.log"; then
    echo "libFuzzer runtime missing: skipping $name"; cat "$work/$name.build.log"; exit 77
  fi
  cat "$work/$name.build.log"; exit 1
fi
corpus="$work/$name.corpus"
rm -rf "$corpus"; mkdir -p "$corpus"
case $name in
  fuzz_rpc) "$seeds_bin" rpc "$corpus" ;;
  fuzz_xfer) "$seeds_bin" xfer "$corpus" ;;
  *) cp "$src/tests/fuzz/corpus/${name#fuzz_}"/* "$corpus"/ ;;
esac
# libFuzzer exits 77 on a finding by default, which ctest would report as a skip: make it 1.
exec "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=10 -error_exitcode=1 \
  -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$work/$name-" "$corpus"
