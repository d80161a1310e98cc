#!/usr/bin/env bash
# Runs one command inside an unpacked image's root filesystem, the way a container runtime
# would as far as files and users go, for hosts where podman cannot run (no CAP_SYS_RESOURCE
# for crun's setrlimit, nested containers): its own mount namespace (nothing leaks to the
# host's mounts, everything goes when the process exits), /proc, /dev and /sys of the host,
# a fresh tmpfs on /tmp (the pods' emptyDir), the given host directories bound at the same
# path, then chroot into the rootfs as the image's user with a clean environment. The program
# and every library it loads are the image's: the kernel resolves them inside the chroot.
# Not isolated: network, PIDs and IPC are the host's (the test talks to it on 127.0.0.1).
#
# usage: run-in-rootfs.sh ROOTFS --user UID:GID [--bind DIR]... [--env K=V]... -- CMD [ARG]...
#   The environment is PATH (the image's default) plus --env values and the host's K3PD_*,
#   ASAN_OPTIONS, UBSAN_OPTIONS and LSAN_OPTIONS. The command replaces this script's process
#   (same PID), so signals sent to it reach the program.
# Needs root (mount namespace, chroot).
set -euo pipefail
die() { echo "run-in-rootfs: $*" >&2; exit 125; }
[ $# -ge 1 ] || die "usage: run-in-rootfs.sh ROOTFS --user UID:GID [--bind DIR]... [--env K=V]... -- CMD..."
rootfs=$(cd "$1" && pwd) || die "no rootfs $1"
shift
user="" binds=() envs=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
while [ $# -gt 0 ]; do
  case "$1" in
    --user) user=$2; shift 2;;
    --bind) binds+=("$(cd "$2" && pwd)"); shift 2;;
    --env) envs+=("$2"); shift 2;;
    --) shift; break;;
    *) die "unknown argument $1";;
  esac
done
[ $# -gt 0 ] || die "no command"
[[ "$user" =~ ^[0-9]+:[0-9]+$ ]] || die "--user must be numeric UID:GID, got '$user'"
[ -x "$rootfs/usr/bin/env" ] || die "$rootfs has no /usr/bin/env: not an unpacked image"
for v in $(compgen -e); do
  case "$v" in K3PD_*|ASAN_OPTIONS|UBSAN_OPTIONS|LSAN_OPTIONS) envs+=("$v=${!v}");; esac
done
# The mount script gets its values as arguments: rootfs, user, number of binds, binds, then
# env -i's assignments and the command.
exec unshare --mount --propagation private -- bash -euc '
  r=$1 u=$2 n=$3; shift 3
  mount -t proc proc "$r/proc"
  mount --rbind /dev "$r/dev"
  mount --rbind /sys "$r/sys"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/tmp"
  for _ in $(seq "$n"); do mkdir -p "$r$1" && mount --bind "$1" "$r$1"; shift; done
  exec chroot --userspec="$u" "$r" /usr/bin/env -i "$@"
' run-in-rootfs "$rootfs" "$user" "${#binds[@]}" "${binds[@]}" "${envs[@]}" "$@"
