#!/bin/sh
# The image's HEALTHCHECK: `proctor health` (the gRPC health service; exit 0 only when SERVING).
# Asks the plaintext health-only port when PROCTOR_HEALTH_PORT is set (the way with TLS on the main
# port), else the main port on loopback; with TLS there, PROCTOR_HEALTHCHECK_TLS_CA names the CA.
set -eu
if [ -n "${PROCTOR_HEALTH_PORT:-}" ] && [ "${PROCTOR_HEALTH_PORT}" != "0" ]; then
    exec proctor health --addr "127.0.0.1:${PROCTOR_HEALTH_PORT}" --timeout "${PROCTOR_HEALTHCHECK_TIMEOUT_S:-3}" --quiet
fi
if [ -n "${PROCTOR_TLS_CERT_FILE:-}" ]; then
    if [ -z "${PROCTOR_HEALTHCHECK_TLS_CA:-}" ]; then
        echo "healthcheck: TLS is on; set PROCTOR_HEALTH_PORT (plaintext health-only port) or PROCTOR_HEALTHCHECK_TLS_CA" >&2
        exit 1
    fi
    exec proctor health --addr "${PROCTOR_HEALTHCHECK_HOST:-localhost}:${PROCTOR_PORT:-50051}" \
        --tls-ca "${PROCTOR_HEALTHCHECK_TLS_CA}" --timeout "${PROCTOR_HEALTHCHECK_TIMEOUT_S:-3}" --quiet
fi
exec proctor health --addr "127.0.0.1:${PROCTOR_PORT:-50051}" --timeout "${PROCTOR_HEALTHCHECK_TIMEOUT_S:-3}" --quiet
