#!/usr/bin/env bash
# Tools the deploy/ checks need (tests/deploy): promtool (Debian's `prometheus` package) to check and
# unit-test the alert rules. kubectl with its built-in kustomize renders deploy/k8s; Debian's
# kubernetes-client (1.20) is too old for the overlays, so a newer kubectl must already be on PATH
# (these machines carry one); the tests say so when it is missing.
#
# Usage: scripts/deploy-tools.sh        (idempotent; installs only what is missing, needs root and apt-get)
set -euo pipefail

say() { echo "deploy-tools.sh: $*" >&2; }

if ! command -v promtool >/dev/null; then
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
        say "promtool is missing and cannot be installed here (needs root and apt-get): the rule checks will say so"
        exit 0
    fi
    say "installing promtool (Debian package prometheus, without recommends)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -q --no-install-recommends prometheus \
        || { apt-get update -q && apt-get install -y -q --no-install-recommends prometheus; }; } >&2 \
        || { say "apt-get install prometheus failed"; exit 1; }
fi
