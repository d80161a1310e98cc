#!/usr/bin/env bash
# Installs the Debian 12 packages k3pd needs to build, test and run (idempotent; skips apt when
# everything is already present). Run as root (or with sudo available).
set -euo pipefail
PKGS=(build-essential cmake pkg-config git ca-certificates
      libgrpc-dev libssl-dev libgnutls28-dev protobuf-c-compiler libprotobuf-c-dev protobuf-compiler
      libucx-dev ucx-utils libuv1-dev check libjansson-dev libpcre2-dev libmicrohttpd-dev
      libxxhash-dev python3 python3-grpcio python3-protobuf python3-numpy python3-regex yamllint
      clang libclang-rt-14-dev
      curl procps
      mmdebstrap umoci)
# mmdebstrap + umoci: scripts/image/build.sh writes the container image from Debian's packages
# without Docker or a registry (ctest deploy_image, docs/operations.md §2).
# kubectl renders the Kubernetes manifests offline; some images ship it already (from another
# package), and installing Debian's kubernetes-client over it would conflict.
command -v kubectl >/dev/null 2>&1 || PKGS+=(kubernetes-client)
# Node.js + npm run the HTTP API test with the official OpenAI client library (tests/http, which
# installs the pinned `openai` package with npm ci at test time). A Node from another source
# (e.g. NodeSource, which bundles npm) is used as it is: Debian's npm would conflict with it.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "k3pd: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
