#!/usr/bin/env bash
# Build PostgreSQL and Prometheus images from Debian packages on the local base image
# (deploy/docker/build-base.sh), for machines that cannot pull the public ones. Grafana has no Debian
# package: it needs the public image. Then:
#   POSTGRES_IMAGE=localhost/proctor-postgres:15 PROMETHEUS_IMAGE=localhost/proctor-prometheus:2.42 \
#     podman-compose -f deploy/compose/compose.yaml up -d ...
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
docker_dir="$here/../../docker"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$docker_dir/containers.conf}"
bash "$docker_dir/build-base.sh"
podman build --format docker -t localhost/proctor-postgres:15 "$here/postgres"
podman build --format docker -t localhost/proctor-prometheus:2.42 "$here/prometheus"
