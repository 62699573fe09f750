#!/usr/bin/env bash
# Make the secrets compose.yaml mounts as files (deploy/compose/secrets/, git-ignored), once:
#   ca.crt, tls.crt, tls.key        a throwaway CA and the replicas' server certificate (SANs: proctor-1,
#                                   proctor-2, proctor, localhost, 127.0.0.1)
#   client.token, callers.yaml      a bearer token for the operator and the callers file that names its sha256
#   audit-signing.key               the Ed25519 key both replicas sign audit checkpoints with
#   audit-hmac.key                  the key for hmac prompt/output policies (32 random bytes, hex)
#   audit-log.pub                   its public half, for the witness
#   witness.key, witness.token      the witness's Ed25519 cosigning key and its bearer token (roles
#                                   audit:read and audit:witness in callers.yaml)
#   pg-owner-password, pg-appender-password, pg-owner.pgpass, pg-appender.pgpass
#                                   PostgreSQL: the table owner (init-postgres) and the server's
#                                   INSERT/SELECT-only role; the DSNs name passfiles, never a password
#   grafana-admin-password
# The files the server reads are owned by the image's user (10001) with mode 0400: libpq ignores a
# passfile that others can read. Rerun with --force to replace everything.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${SECRETS_DIR:-$here/secrets}"
PROCTOR_UID="${PROCTOR_UID:-10001}"
if [[ -e "$out/callers.yaml" && "${1:-}" != "--force" ]]; then
    echo "make-secrets: $out exists (--force replaces it)"; exit 0
fi
rm -rf "$out"; mkdir -m 0700 "$out"; cd "$out"
umask 077
rand() { openssl rand -hex "${1:-24}"; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 -subj "/CN=proctor compose CA" \
    -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=proctor" \
    -keyout tls.key -out tls.csr 2>/dev/null
printf 'subjectAltName=DNS:proctor,DNS:proctor-1,DNS:proctor-2,DNS:localhost,IP:127.0.0.1\n' > san.ext
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile san.ext \
    -out tls.crt 2>/dev/null
rm -f tls.csr san.ext ca.srl ca.key   # the CA signs once; nothing else may be issued from it

token="$(rand 32)"
printf '%s\n' "$token" > client.token
witness_token="$(rand 32)"
printf '%s\n' "$witness_token" > witness.token
cat > callers.yaml <<YAML
callers:
  - name: operator
    token_sha256: $(printf '%s' "$token" | sha256sum | cut -d' ' -f1)
    roles: [admin]
  - name: witness
    token_sha256: $(printf '%s' "$witness_token" | sha256sum | cut -d' ' -f1)
    roles: [audit:read, audit:witness]
YAML
openssl genpkey -algorithm ed25519 -out audit-signing.key
openssl pkey -in audit-signing.key -pubout -out audit-log.pub
openssl genpkey -algorithm ed25519 -out witness.key
rand 32 > audit-hmac.key
rand > pg-owner-password
rand > pg-appender-password
printf 'postgres:5432:proctor:proctor_owner:%s\n' "$(cat pg-owner-password)" > pg-owner.pgpass
printf 'postgres:5432:proctor:proctor_appender:%s\n' "$(cat pg-appender-password)" > pg-appender.pgpass
rand > grafana-admin-password

# Read by the proctor containers (uid 10001): theirs alone. Read by PostgreSQL and Grafana: readable.
chmod 0400 tls.key callers.yaml audit-signing.key audit-hmac.key pg-owner.pgpass pg-appender.pgpass witness.key \
    witness.token
chown "$PROCTOR_UID:$PROCTOR_UID" tls.key callers.yaml audit-signing.key audit-hmac.key pg-owner.pgpass \
    pg-appender.pgpass witness.key witness.token 2>/dev/null \
    || echo "make-secrets: could not chown to $PROCTOR_UID (not root?)" >&2
chmod 0444 ca.crt tls.crt audit-log.pub pg-owner-password pg-appender-password grafana-admin-password
chmod 0400 client.token
chmod 0755 "$out"
echo "make-secrets: wrote $(ls | wc -l) files to $out"
