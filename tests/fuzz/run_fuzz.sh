#!/usr/bin/env bash
# Builds one libFuzzer harness with clang (ASan + UBSan), compiling the k3_ckpt/k3_base sources
# directly (the main build uses gcc), and runs it for a bounded time on a copy of its seed
# corpus. Exit 77 (ctest SKIP_RETURN_CODE) when clang or libFuzzer is unavailable.
# usage: run_fuzz.sh SOURCE_DIR WORK_DIR NAME SECONDS
set -euo pipefail
src=$1 work=$2 name=$3 secs=$4
command -v clang >/dev/null 2>&1 || { echo "clang not found: skipping $name"; exit 77; }
mkdir -p "$work"
bin="$work/$name"
flags="-g -O1 -std=c17 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
if ! clang $flags -I"$src/common/include" -I"$src/common/ckpt" "$src/tests/fuzz/$name.c" \
     "$src"/common/ckpt/*.c "$src"/common/base/err.c "$src"/common/base/log.c "$src"/common/base/util.c $(pkg-config --cflags --libs jansson libxxhash) \
     -lm -lpthread -o "$bin" 2>"$work/$name.build.log"; then
  if grep -q "libclang_rt.fuzzer\|fuzzer.*not found\|cannot find" "$work/$name.build.log"; then
    echo "libFuzzer runtime missing: skipping $name"; cat "$work/$name.build.log"; exit 77
  fi
  cat "$work/$name.build.log"; exit 1
fi
corpus="$work/$name.corpus"
rm -rf "$corpus"; mkdir -p "$corpus"
seeds="$src/tests/fuzz/corpus/${name#fuzz_}"
cp "$seeds"/* "$corpus"/
exec "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -timeout=10 -print_final_stats=1 "$corpus"
