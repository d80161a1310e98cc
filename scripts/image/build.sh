#!/usr/bin/env bash
# Builds the k3pd CPU container image (deploy/docker/Dockerfile's runtime stage) without Docker
# and without a registry, from Debian's packages only:
#   1. the binaries: a Release build (the README's configure line) or --build-dir's;
#   2. layer 1, a Debian 12 rootfs written by mmdebstrap (--variant=essential) holding exactly
#      the Dockerfile's RUNTIME_PKGS (deploy/docker/runtime-deps.sh --list, the one list) and
#      the user k3pd (uid/gid 10001, created by the Dockerfile's own groupadd/useradd lines);
#   3. layer 2, the binaries in /usr/local/bin (stripped, like the Dockerfile's build stage);
#   4. an OCI image layout written by umoci, configured from the Dockerfile's USER, WORKDIR,
#      EXPOSE, CMD and LABEL lines (scripts/image/dockerfile_config.py), tarred as an
#      oci-archive that podman, skopeo and containerd load;
#   5. scripts/image/verify.sh on the result (like the Dockerfile's final ldd check).
# It is not a Docker replacement: no cache, one platform (the host's), CPU image only.
#
# usage: scripts/image/build.sh [--build-dir DIR] [--out DIR] [--tag TAG] [--name NAME] [--mirror M]...
#                               [--extra-pkgs "PKG ..."]
#   --build-dir DIR  take the binaries from this CMake build dir (default: build build/ here)
#   --out DIR        output directory (default: out/image); written there:
#                      k3pd-TAG.oci.tar   the image (oci-archive) named NAME:TAG
#                      oci/               the same image as an OCI layout directory (umoci's
#                                         tag: TAG)
#                      bundle/            the image unpacked by umoci (rootfs/ + config.json)
#                      packages.txt       the Debian packages in the image, with versions
#   --tag TAG        image tag (default: the binaries' version, e.g. 0.1.0)
#   --name NAME      image name in the archive (default: localhost/k3pd)
#   --mirror M       apt source for mmdebstrap: a URL, a "deb ..." line or a .list/.sources
#                    file; repeatable. Default: the host's apt sources that name bookworm, else
#                    deb.debian.org (bookworm, bookworm-updates, bookworm-security).
#   --extra-pkgs L   more packages for the rootfs: only for test images of sanitizer builds
#                    (their runtimes libasan8 libubsan1); a shipped image never has any.
# Needs root (mmdebstrap --mode=root, umoci unpack, chroot), mmdebstrap, umoci and python3
# (scripts/deps.sh installs them). Exit status 77: no Debian mirror answered (ctest SKIP).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
die() { echo "image/build: $*" >&2; exit 1; }

build_dir="" out="$root/out/image" tag="" name="localhost/k3pd" extra="" mirrors=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$(cd "$2" && pwd); shift 2;;
    --out) out=$2; shift 2;;
    --tag) tag=$2; shift 2;;
    --name) name=$2; shift 2;;
    --mirror) mirrors+=("$2"); shift 2;;
    --extra-pkgs) extra=$2; shift 2;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) die "unknown argument $1 (see --help)";;
  esac
done
[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap --mode=root, umoci unpack and chroot keep uid 0 files)"
for t in mmdebstrap umoci python3 strip tar curl; do
  command -v "$t" >/dev/null || die "$t not found: run scripts/deps.sh"
done
dockerfile=$root/deploy/docker/Dockerfile
mkdir -p "$out"
out=$(cd "$out" && pwd)
t0=$(date +%s)

# 1. Binaries.
if [ -z "$build_dir" ]; then
  build_dir=$root/build
  cmake -S "$root" -B "$build_dir" -DK3PD_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build_dir" -j"$(nproc)" --target k3pd-router k3pd-prefill k3pd-decode k3pd-mkckpt
fi
bins=("$build_dir/router/k3pd-router" "$build_dir/prefill_worker/k3pd-prefill"
      "$build_dir/decode_worker/k3pd-decode" "$build_dir/tools/mkckpt/k3pd-mkckpt")
for b in "${bins[@]}"; do [ -x "$b" ] || die "$b is missing: build it first"; done
RUNTIME_DEPS_ALLOW="$extra" bash "$root/deploy/docker/runtime-deps.sh" --dockerfile "$dockerfile" "${bins[@]}"
version=$("${bins[0]}" --version | awk '{print $NF}')
[ -n "$tag" ] || tag=$version
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
# Reproducible timestamps (mmdebstrap, tar, umoci): the commit's time, unless already set.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# 2. The Debian rootfs. Mirrors: the host's bookworm sources (same mirror, same snapshot pin).
if [ ${#mirrors[@]} = 0 ]; then
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -v '^\s*#' "$f" | grep -qw bookworm && mirrors+=("$f")
  done
fi
if [ ${#mirrors[@]} = 0 ]; then
  mirrors=("deb http://deb.debian.org/debian bookworm main" "deb http://deb.debian.org/debian bookworm-updates main"
           "deb http://deb.debian.org/debian-security bookworm-security main")
fi
# Probe the first mirror URL, so that "no network" is told apart from a failing build.
url=$(for m in "${mirrors[@]}"; do if [ -f "$m" ]; then grep -v '^\s*#' "$m"; else echo "$m"; fi; done |
      grep -oE 'https?://[^ ]+' | head -1)
[ -n "$url" ] || die "no http(s) URL in the mirrors: ${mirrors[*]}"
if ! curl -fsS -m 20 -o /dev/null "${url%/}/dists/bookworm/Release" 2>"$out/probe.err"; then
  echo "image/build: SKIP: the Debian mirror ${url} cannot be reached: $(cat "$out/probe.err")" >&2
  exit 77
fi
pkgs=$(bash "$root/deploy/docker/runtime-deps.sh" --list "$dockerfile")
# passwd: groupadd/useradd below (debian:12-slim has it too).
include=$(echo "$pkgs $extra passwd" | tr -s ' ' ',' | sed 's/^,//; s/,$//')
mapfile -t user_cmds < <(python3 "$root/scripts/image/dockerfile_config.py" "$dockerfile" --user-commands)
[ ${#user_cmds[@]} = 2 ] || die "could not read the groupadd/useradd lines of $dockerfile"
echo "image/build: mmdebstrap bookworm (essential + $include) from ${mirrors[*]}"
t1=$(date +%s)
rm -f "$out/base.tar"
# The dpkg path filters drop what debian:12-slim drops (manuals, translations, docs except the
# copyright files, which stay with the binaries they license). The merged-usr hooks lay out
# merged /usr and install usr-is-merged: without them init-system-helpers' "usrmerge |
# usr-is-merged" takes usrmerge, which pulls in perl. unsafe-io: no fsync per file (the
# result is a tarball; a crash means building again).
if ! { mmdebstrap --mode=root --variant=essential --include="$include" \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --dpkgopt=force-unsafe-io \
  --aptopt='Acquire::Languages "none"' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook="chroot \"\$1\" ${user_cmds[0]}" --customize-hook="chroot \"\$1\" ${user_cmds[1]}" \
  bookworm "$out/base.tar" "${mirrors[@]}" 2>&1 | sed 's/^/  /'; }; then
  die "mmdebstrap failed (its output is above)"
fi
t2=$(date +%s)

# 3. The binaries' layer.
stage=$out/layer-bin
rm -rf "$stage" && install -d -m 0755 "$stage/usr" "$stage/usr/local" "$stage/usr/local/bin"
install -m 0755 "${bins[@]}" "$stage/usr/local/bin/"
strip --strip-unneeded "$stage"/usr/local/bin/*
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -C "$stage" \
  -cf "$out/bin.tar" usr

# 4. The OCI image.
oci=$out/oci
rm -rf "$oci" "$out/bundle"
umoci init --layout "$oci"
umoci new --image "$oci:$tag"
umoci raw add-layer --image "$oci:$tag" --history.created "$created" \
  --history.created_by "mmdebstrap --variant=essential bookworm: $pkgs" "$out/base.tar"
umoci raw add-layer --image "$oci:$tag" --history.created "$created" \
  --history.created_by "k3pd binaries to /usr/local/bin (scripts/image/build.sh)" "$out/bin.tar"
mapfile -t cfg < <(python3 "$root/scripts/image/dockerfile_config.py" "$dockerfile" --umoci \
                   --arg "K3PD_VERSION=$version" --arg "K3PD_REVISION=$revision")
[ ${#cfg[@]} -gt 0 ] || die "no image configuration from $dockerfile"
umoci config --image "$oci:$tag" --created "$created" --history.created "$created" \
  --os linux --architecture "$(dpkg --print-architecture)" --author "k3pd scripts/image/build.sh" \
  --history.created_by "config from deploy/docker/Dockerfile" "${cfg[@]}"
umoci gc --layout "$oci"
# The archive names the image by a full reference (umoci's layout tags are bare: podman would
# load a bare "0.1.0" as localhost/0.1.0:latest); the blobs are shared hard links.
rm -rf "$out/k3pd-$tag.oci.tar" "$out/archive"
cp -al "$oci" "$out/archive"
rm "$out/archive/index.json"
python3 - "$oci/index.json" "$out/archive/index.json" "$tag" "$name:$tag" <<'PY'
import json, sys
src, dst, tag, ref = sys.argv[1:]
index = json.load(open(src))
for m in index["manifests"]:
    if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
        m["annotations"]["org.opencontainers.image.ref.name"] = ref
json.dump(index, open(dst, "w"))
PY
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -C "$out/archive" \
  -cf "$out/k3pd-$tag.oci.tar" .
rm -rf "$out/archive"
rm -rf "$stage" "$out/base.tar" "$out/bin.tar" "$out/probe.err"
t3=$(date +%s)

# 5. Verify what was written.
bash "$root/scripts/image/verify.sh" --oci "$oci:$tag" --bundle "$out/bundle" --dockerfile "$dockerfile" \
  --arg "K3PD_VERSION=$version" --arg "K3PD_REVISION=$revision" --extra-pkgs "$extra" \
  --packages-out "$out/packages.txt"
t4=$(date +%s)
echo "image/build: $out/k3pd-$tag.oci.tar ($(du -h "$out/k3pd-$tag.oci.tar" | cut -f1)); rootfs" \
     "$(du -sh "$out/bundle/rootfs" | cut -f1), $(wc -l < "$out/packages.txt") packages"
echo "image/build: seconds: mmdebstrap $((t2 - t1)), layers+oci $((t3 - t2)), verify $((t4 - t3)), total $((t4 - t0))"
