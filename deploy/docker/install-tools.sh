#!/usr/bin/env bash
# Debian packages the local image workflow needs (build-base.sh, build.sh, image-check.sh):
# podman + buildah (engine), crun and runc (OCI runtimes), debootstrap (the local base image),
# fuse-overlayfs/slirp4netns/uidmap (rootless fallbacks). Idempotent; needs root (or sudo).
# --compose adds podman-compose (deploy/compose/).
set -euo pipefail
PACKAGES=(podman buildah crun runc debootstrap fuse-overlayfs slirp4netns uidmap netavark aardvark-dns
          containernetworking-plugins iptables ca-certificates openssl)
[[ "${1:-}" == "--compose" ]] && PACKAGES+=(podman-compose)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
    echo "install-tools: all present"
    exit 0
fi
SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "install-tools: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
