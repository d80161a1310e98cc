#!/bin/sh
# Builds fuzz_tok.c with clang + libFuzzer + ASan/UBSan and runs it for FUZZ_SECONDS (15).
# Exit 77 (ctest SKIP) when clang or libFuzzer is not available.
# usage: run_fuzz.sh SOURCE_DIR BUILD_DIR
set -eu
src=$1
bld=$2
secs=${FUZZ_SECONDS:-15}
CLANG=${CLANG:-$(command -v clang || command -v clang-14 || true)}
if [ -z "$CLANG" ]; then echo "clang not found: skipping"; exit 77; fi
out=$bld/tests/unit/tok/fuzz
mkdir -p "$out/corpus"
probe=$out/probe.c
echo 'int LLVMFuzzerTestOneInput(const unsigned char*d,unsigned long n){return 0;}' > "$probe"
if ! "$CLANG" -fsanitize=fuzzer "$probe" -o "$out/probe" 2>/dev/null; then
  echo "libFuzzer not available: skipping"; exit 77
fi
flags=$(pkg-config --cflags --libs libpcre2-8 jansson libxxhash)
"$CLANG" -std=c17 -g -O1 -D_GNU_SOURCE -DK3PD_VERSION='"fuzz"' -fsanitize=fuzzer,address,undefined \
  -I"$src/common/include" -I"$src/common/tok" \
  "$src/tests/unit/tok/fuzz/fuzz_tok.c" "$src"/common/tok/*.c "$bld/common/tok/tok_corpus.c" \
  "$src"/common/base/*.c $flags -lm -lpthread -o "$out/fuzz_tok"
# seed corpus: a few realistic inputs
printf 'Hello world, the model'"'"'s 123 tokens!' > "$out/corpus/s1"
printf '[{"role":"user","content":"Hi <|end_of_msg|>"}]' > "$out/corpus/s2"
printf '\344\270\255\346\226\207 \377\355\240\200 END\n\n' > "$out/corpus/s3"
"$out/fuzz_tok" -max_total_time="$secs" -max_len=4096 -timeout=10 "$out/corpus"
