#!/usr/bin/env bash
# Builds UCX 1.13.1 (Debian 12's version, so the ABI matches the libucp.so.0 k3pd links) from
# Debian's own source with CUDA support (cuda_copy, cuda_ipc transports; C-STACK.md §4) into
# PREFIX. Debian's binary package has no CUDA transports, and the GPU host cannot build it (no
# network, no UCX headers). Idempotent: does nothing when PREFIX/lib/libucp.so.0 exists.
#
#   scripts/gpu/build-ucx.sh PREFIX
#
# Needs: apt (Debian 12) for the source package and the NVML header (libnvidia-ml-dev, from
# non-free: only its nvml.h is used), autoconf/automake/libtool, and CUDA at /usr/local/cuda.
# The NVML *library* is the driver's: a link-only stub with its soname (libnvidia-ml.so.1)
# satisfies the build here; at run time the GPU host's real library is loaded.
set -euo pipefail
prefix=${1:?usage: scripts/gpu/build-ucx.sh PREFIX}
[ -f "$prefix/lib/libucp.so.0" ] && { echo "ucx: $prefix already built"; exit 0; }
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda/bin/nvcc" ] || { echo "ucx: no CUDA at $cuda" >&2; exit 1; }
work=$(mktemp -d /tmp/k3pd-ucx.XXXXXX)
trap '[ $? = 0 ] && rm -rf "$work" || echo "ucx: logs kept in $work" >&2' EXIT
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
missing=()
for p in autoconf automake libtool make gcc dpkg-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] || { $SUDO apt-get update -qq; $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; }
# Private apt lists: deb-src for the source, non-free for the NVML header. The system's apt
# configuration is left untouched.
mkdir -p "$work/parts" "$work/lists/partial"
cat > "$work/parts/k3pd.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
: > "$work/empty.list"
apt_o=(-o Dir::Etc::SourceList="$work/empty.list" -o Dir::Etc::SourceParts="$work/parts"
       -o Dir::State::Lists="$work/lists" -o APT::Sandbox::User=root)
apt-get "${apt_o[@]}" update -qq
(cd "$work" && apt-get "${apt_o[@]}" source --download-only -qq ucx=1.13.1-1 &&
  apt-get "${apt_o[@]}" download -qq libnvidia-ml-dev)
tar -C "$work" -xf "$work"/ucx_1.13.1.orig.tar.xz
dpkg-deb -x "$work"/libnvidia-ml-dev_*.deb "$work/nvml"
mkdir -p "$work/shim/include" "$work/shim/lib"
cp "$work/nvml/usr/include/nvml.h" "$work/shim/include/"
# Link-only stub of the driver's NVML: the symbols UCX's cuda module references.
cat > "$work/shim/nvml_stub.c" <<'C'
int nvmlInit(void) { return 1; }
int nvmlInit_v2(void) { return 1; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { (void)r; return "stub"; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void *h) { (void)i; (void)h; return 1; }
int nvmlDeviceGetFieldValues(void *d, int n, void *v) { (void)d; (void)n; (void)v; return 1; }
int nvmlDeviceGetNvLinkRemotePciInfo_v2(void *d, unsigned l, void *p) { (void)d; (void)l; (void)p; return 1; }
C
gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$work/shim/lib/libnvidia-ml.so.1" "$work/shim/nvml_stub.c"
ln -s libnvidia-ml.so.1 "$work/shim/lib/libnvidia-ml.so"
cd "$work/ucx-1.13.1"
# The orig tarball lacks the debian/ files configure.ac names (C-STACK.md P11).
cp -r debian.upstream debian
./autogen.sh >"$work/autogen.log" 2>&1
CPPFLAGS="-I$work/shim/include" LDFLAGS="-L$work/shim/lib" ./configure --prefix="$prefix" \
  --with-cuda="$cuda" --disable-logging --disable-debug --disable-assertions --disable-params-check \
  --enable-mt --enable-cma --without-java --without-go --without-rocm --without-knem --without-xpmem \
  >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log" >&2; exit 1; }
grep -q "cuda" "$work/configure.log" || true
# The libraries, their transport modules, ucx_info and ucx_perftest (test/apps fail to build with CUDA 13's
# changed cuCtxCreate, C-STACK.md P11; nothing here needs them).
for d in src/ucm src/ucs src/uct src/ucp src/tools/info src/tools/perf; do
  make -j"$(nproc)" -C "$d" >>"$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
  make -C "$d" install >>"$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
done
ls "$prefix/lib/ucx/" | grep -q cuda || { echo "ucx: no CUDA modules were built" >&2; exit 1; }
echo "ucx: built with CUDA into $prefix ($(ls "$prefix/lib/ucx" | tr '\n' ' '))"
