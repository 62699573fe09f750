#!/usr/bin/env bash
# Build the Proctor image here, with no registry: Debian packages → local base images (build-base.sh),
# this machine's pip → wheelhouse (wheelhouse.sh), then `podman build` with the Dockerfile.
#
#   deploy/docker/build.sh [extra podman build flags]      → localhost/proctor:dev (IMAGE=... to change)
#
# Elsewhere (public bases and indexes reachable) the plain command is enough:
#   docker build -f deploy/docker/Dockerfile -t proctor .
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
IMAGE="${IMAGE:-localhost/proctor:dev}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

command -v podman >/dev/null || bash "$here/install-tools.sh"
t0=$SECONDS
bash "$here/build-base.sh"
t1=$SECONDS
if [[ "${SKIP_WHEELHOUSE:-0}" != 1 ]]; then bash "$here/wheelhouse.sh"; fi
t2=$SECONDS
# --format docker keeps HEALTHCHECK (the OCI image format has no field for it).
podman build --format docker --network none \
    --ignorefile "$here/Dockerfile.dockerignore" -f "$here/Dockerfile" \
    --build-arg BASE_IMAGE=localhost/proctor-base:bookworm \
    --build-arg BUILD_IMAGE=localhost/proctor-build-base:bookworm \
    -t "$IMAGE" "$@" "$root"
t3=$SECONDS
echo "build.sh: $IMAGE built (base images $((t1 - t0)) s, wheelhouse $((t2 - t1)) s, image $((t3 - t2)) s)"
