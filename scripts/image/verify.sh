#!/usr/bin/env bash
# Checks a k3pd OCI image written by scripts/image/build.sh, from the image itself (what an
# operator would run), not from the files it was made of:
#   1. its config equals the Dockerfile's runtime stage (user, workdir, ports, env, cmd,
#      labels: scripts/image/dockerfile_config.py --check-image);
#   2. umoci unpacks it (rootfs + runtime-spec config.json) into --bundle;
#   3. inside the rootfs (chroot, so nothing can come from the host): the user 10001 exists,
#      ldd resolves every library of every binary to a file of the rootfs (the closure,
#      not only the NEEDED entries), and each binary runs as the image's user and prints the
#      Dockerfile's version;
#   4. the Debian packages are exactly the essential set plus RUNTIME_PKGS and their
#      dependencies: every listed package is installed, and none is a compiler, a -dev
#      package or a build tool. The list with versions goes to --packages-out.
# usage: verify.sh --oci LAYOUT:TAG --bundle DIR --dockerfile FILE [--arg NAME=VALUE]...
#                  [--extra-pkgs "PKG ..."] [--packages-out FILE]
# Needs root (umoci unpack keeps owners; chroot).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "image/verify: FAIL: $*" >&2; exit 1; }
ref="" bundle="" dockerfile="" extra="" pkgs_out="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --oci) ref=$2; shift 2;;
    --bundle) bundle=$2; shift 2;;
    --dockerfile) dockerfile=$2; shift 2;;
    --arg) args+=(--arg "$2"); shift 2;;
    --extra-pkgs) extra=$2; shift 2;;
    --packages-out) pkgs_out=$2; shift 2;;
    *) echo "image/verify: unknown argument $1" >&2; exit 2;;
  esac
done
[ -n "$ref" ] && [ -n "$bundle" ] && [ -n "$dockerfile" ] || {
  echo "usage: verify.sh --oci LAYOUT:TAG --bundle DIR --dockerfile FILE [--arg N=V]... [--extra-pkgs L]" >&2; exit 2; }

# 1. Config.
python3 "$here/dockerfile_config.py" "$dockerfile" "${args[@]}" --check-image "$ref" || die "image config differs"
version=$(python3 "$here/dockerfile_config.py" "$dockerfile" "${args[@]}" --json |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["Labels"]["org.opencontainers.image.version"])')
user=$(python3 "$here/dockerfile_config.py" "$dockerfile" "${args[@]}" --json |
       python3 -c 'import json,sys; print(json.load(sys.stdin)["User"])')

# 2. Unpack.
rm -rf "$bundle"
umoci unpack --image "$ref" "$bundle" >/dev/null || die "umoci unpack $ref failed"
rootfs=$bundle/rootfs
in_root() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin "$@"; }

# 3. User, library closure, binaries.
grep -q '^k3pd:x:10001:10001:' "$rootfs/etc/passwd" || die "no user k3pd (10001:10001) in the image"
bins=(k3pd-router k3pd-prefill k3pd-decode k3pd-mkckpt)
nlibs=0
for b in "${bins[@]}"; do
  [ -x "$rootfs/usr/local/bin/$b" ] || die "/usr/local/bin/$b missing from the image"
  out=$(in_root ldd "/usr/local/bin/$b") || die "ldd /usr/local/bin/$b failed in the image: $out"
  if grep -q 'not found' <<<"$out"; then die "$b: libraries not found in the image:"$'\n'"$(grep 'not found' <<<"$out")"; fi
  while read -r lib; do
    [ -e "$rootfs$lib" ] || die "$b: ldd names $lib, which is not a file of the image"
    nlibs=$((nlibs + 1))
  done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$out")
  got=$(bash "$here/run-in-rootfs.sh" "$rootfs" --user "$user" -- "/usr/local/bin/$b" --version 2>&1) ||
    die "$b --version failed in the image as $user: $got"
  case "$got" in *"$version"*) ;; *) die "$b --version printed '$got', expected version $version";; esac
done

# 4. Packages.
in_root dpkg-query -W -f='${Package} ${Version}\n' > "$bundle/packages.txt"
[ -z "$pkgs_out" ] || cp "$bundle/packages.txt" "$pkgs_out"
for p in $(bash "$here/../../deploy/docker/runtime-deps.sh" --list "$dockerfile") $extra; do
  grep -q "^$p " "$bundle/packages.txt" || die "runtime package $p is not installed in the image"
done
bad=$(awk '{print $1}' "$bundle/packages.txt" |
      grep -E -- '-dev$|^(gcc|g\+\+|cpp|clang|llvm|cmake|make|binutils|build-essential|libc-dev-bin|perl)(-[0-9.]+)?$' || true)
[ -z "$bad" ] || die "build tools or development packages in the image: $(echo $bad)"
echo "image/verify: $ref: config as the Dockerfile; user k3pd 10001; ${#bins[@]} binaries run as $user" \
     "(version $version); $nlibs library paths resolved inside the image, none missing;" \
     "$(wc -l < "$bundle/packages.txt") packages, no build tools"
