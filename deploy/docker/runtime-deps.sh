#!/usr/bin/env bash
# Maps the shared libraries that binaries link directly (ELF NEEDED entries) to the Debian /
# Ubuntu packages that ship them, and optionally checks them against a Dockerfile's runtime
# package list.
#
#   runtime-deps.sh BIN...                          print one package per line
#   runtime-deps.sh --check "PKG PKG ..." BIN...     fail if a needed package is not listed
#   runtime-deps.sh --dockerfile FILE BIN...         same, list read from FILE's
#                                                    "ARG RUNTIME_PKGS=..." line
#   runtime-deps.sh --list FILE                      print FILE's RUNTIME_PKGS list (the one
#                                                    source of truth; scripts/image/build.sh
#                                                    installs exactly it)
# Runs in the image build stage (so a binary that gains a library fails the image build
# instead of producing an image that cannot start) and in ctest (tests/deploy) against the
# binaries just built. Packages every base image has (libc6, libgcc-s1, libstdc++6) and
# the CUDA runtime packages of nvidia/cuda images are always allowed. Only NEEDED entries are
# checked, not the whole closure: apt installs each listed package's own dependencies.
# RUNTIME_DEPS_ALLOW (env, space-separated) adds packages to accept, for builds that are never
# shipped in an image (the sanitizer runtimes of an ASan/UBSan test build).
set -euo pipefail
allowed=""
list_of() {
  local l
  l=$(sed -n 's/^ARG RUNTIME_PKGS="\(.*\)"$/\1/p' "$1" | head -1)
  [ -n "$l" ] || { echo "runtime-deps: no ARG RUNTIME_PKGS=\"...\" line in $1" >&2; exit 2; }
  echo "$l"
}
if [ "${1:-}" = --list ]; then [ $# = 2 ] || { echo "usage: runtime-deps.sh --list DOCKERFILE" >&2; exit 2; }
  list_of "$2"; exit 0
elif [ "${1:-}" = --check ]; then allowed=$2; shift 2
elif [ "${1:-}" = --dockerfile ]; then
  allowed=$(list_of "$2")
  shift 2
fi
[ $# -gt 0 ] || { echo "usage: runtime-deps.sh [--check LIST|--dockerfile FILE] BIN..." >&2; exit 2; }

pkgs=()
# Each binary's ldd runs once and each library path is looked up once (dpkg -S with all the
# path spellings of a merged /usr in one call): dpkg -S reads the whole file database each
# time, which takes seconds on a loaded machine.
declare -A owner=()
for bin in "$@"; do
  [ -x "$bin" ] || { echo "runtime-deps: $bin is not an executable" >&2; exit 2; }
  # ldd resolves each NEEDED name to a path; keep only the direct ones.
  needed=$(objdump -p "$bin" | awk '$1 == "NEEDED" {print $2}')
  resolved=$(ldd "$bin")
  for lib in $needed; do
    path=$(awk -v l="$lib" '$1 == l && $3 ~ /^\// {print $3}' <<<"$resolved" | head -1)
    case "$lib" in libcuda.so.*|libnvidia-ml.so.*)
      continue;; # injected by the NVIDIA container toolkit at run time, never in the image
    esac
    [ -n "$path" ] || { echo "runtime-deps: $bin needs $lib, which is not installed here" >&2; exit 1; }
    pkg=${owner[$path]:-}
    if [ -z "$pkg" ]; then
      pkg=$(dpkg -S "$path" "$(realpath "$path")" "${path#/usr}" "/usr${path}" 2>/dev/null | head -1 |
            cut -d: -f1 || true)
    fi
    if [ -z "$pkg" ]; then
      pkg=$(dpkg -S "/$(basename "$path")" 2>/dev/null | grep -v -- '-dev:' | head -1 | cut -d: -f1 || true)
    fi
    [ -n "$pkg" ] || { echo "runtime-deps: no package owns $path ($lib, needed by $bin)" >&2; exit 1; }
    owner[$path]=$pkg
    pkgs+=("$pkg")
  done
done
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
if [ -z "$allowed" ]; then printf '%s\n' "${pkgs[@]}"; exit 0; fi
missing=()
for p in "${pkgs[@]}"; do
  case " $allowed ${RUNTIME_DEPS_ALLOW:-} libc6 libgcc-s1 libstdc++6 " in *" $p "*) continue;; esac
  case "$p" in cuda-*|libcublas*|libcudnn*|libnccl*) continue;; esac
  missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "runtime-deps: the binaries need packages missing from RUNTIME_PKGS: ${missing[*]}" >&2
  exit 1
fi
echo "runtime-deps: ${#pkgs[@]} package(s) needed, all in RUNTIME_PKGS or the base image: ${pkgs[*]}"
