#!/usr/bin/env bash
# Build the local base images from Debian packages, for machines that cannot pull from a registry:
#
#   localhost/proctor-base:bookworm        Debian 12 minbase + python3 (3.11) + venv + CA certificates
#   localhost/proctor-build-base:bookworm  the same + g++ and the Python headers (the image's build stage)
#
# Both come from one debootstrap of the same snapshot, so the build stage and the runtime stage run the
# same Python at the same path (the venv and the compiled kernels are copied from one to the other).
# Usage: deploy/docker/build-base.sh [--force]    (ENGINE=podman|buildah|docker, MIRROR=..., SUITE=bookworm)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ENGINE="${ENGINE:-podman}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
BASE="${BASE_TAG:-localhost/proctor-base:$SUITE}"
BUILD_BASE="${BUILD_BASE_TAG:-localhost/proctor-build-base:$SUITE}"
force=0; [[ "${1:-}" == "--force" ]] && force=1

have() { "$ENGINE" image exists "$1" 2>/dev/null || "$ENGINE" image inspect "$1" >/dev/null 2>&1; }
if ((!force)) && have "$BASE" && have "$BUILD_BASE"; then
    echo "build-base: $BASE and $BUILD_BASE present (--force rebuilds)"
    exit 0
fi
command -v debootstrap >/dev/null || bash "$here/install-tools.sh"

work="$(mktemp -d "${TMPDIR:-/var/tmp}/proctor-base.XXXXXX")"
cleanup() { umount -R "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
rootfs="$work/rootfs"
started=$SECONDS

echo "build-base: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$rootfs" "$MIRROR" \
    > "$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; exit 1; }
cat > "$rootfs/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES

slim() {  # what a container never needs: apt lists, caches, docs, man pages, locales but C
    rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/apt/archives/*.deb \
           "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* "$1"/var/log/*.log \
           "$1"/var/cache/debconf/*-old "$1"/usr/share/locale/*
}
import() {  # import a root filesystem as an image
    tar --numeric-owner --xattrs -C "$1" -c . | "$ENGINE" import \
        --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$2" >/dev/null
    echo "build-base: $2 ($(du -sh --apparent-size "$1" | cut -f1))"
}

slim "$rootfs"
import "$rootfs" "$BASE"

echo "build-base: adding g++ and the Python headers"
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
mount -t proc proc "$rootfs/proc"
chroot "$rootfs" /bin/sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends g++ python3-dev' > "$work/apt.log" 2>&1 || { tail -30 "$work/apt.log"; exit 1; }
umount "$rootfs/proc"
: > "$rootfs/etc/resolv.conf"
slim "$rootfs"
import "$rootfs" "$BUILD_BASE"
echo "build-base: done in $((SECONDS - started)) s"
