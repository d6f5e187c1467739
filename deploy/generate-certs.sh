#!/usr/bin/env bash
# Generate what a privet deployment needs for TLS and SuperNode authentication.
#
#   deploy/generate-certs.sh [N] [--out DIR] [--san NAME]...
#
#   N          number of SuperNode key pairs (default 3): keys/supernode-0{,.pub} ..
#   --out DIR  where to write (default: the folder of this script, i.e. deploy/)
#   --san X    extra subjectAltName for the SuperLink certificate (DNS name or IP),
#              repeatable; e.g. the public host name SuperNodes use to reach it.
#
# Writes DIR/certs/{ca.crt,ca.key,server.pem,server.key} (a private CA and a SuperLink
# server certificate whose SANs cover the compose service name `superlink`, localhost,
# 127.0.0.1, the SuperLink's address on the compose stack's operator-only network
# ($PRIVET_CONTROL_NET.2, default 172.30.93.2: its Control API listens only there), plus
# every --san) and DIR/keys/supernode-<i>{,.pub} (ECDSA P-384 OpenSSH key
# pairs; Flower's SuperNode authentication needs exactly this key type).
# Existing files are kept (re-run to add keys); delete a file to regenerate it.
# Nothing here is committed: deploy/certs/ and deploy/keys/ are git-ignored.
#
# Which file goes where:
#   SuperLink host:  certs/ca.crt certs/server.pem certs/server.key
#   each SuperNode:  certs/ca.crt and its own keys/supernode-<i> (private key, never shared)
#   operator (flwr): certs/ca.crt, and keys/supernode-<i>.pub to register each node
#   keep offline:    certs/ca.key
set -euo pipefail

N=3
OUT="$(cd "$(dirname "$0")" && pwd)"
SANS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --san) SANS+=("$2"); shift 2 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) N="$1"; shift ;;
    esac
done
[[ "$N" =~ ^[0-9]+$ ]] || { echo "N must be a number, got '$N'" >&2; exit 2; }

command -v openssl >/dev/null || { echo "openssl is required (apt-get install openssl)" >&2; exit 1; }
command -v ssh-keygen >/dev/null || { echo "ssh-keygen is required (apt-get install openssh-client)" >&2; exit 1; }

CERTS="$OUT/certs"
KEYS="$OUT/keys"
mkdir -p "$CERTS" "$KEYS"
umask 077

if [[ ! -f "$CERTS/ca.key" || ! -f "$CERTS/ca.crt" ]]; then
    openssl genrsa -out "$CERTS/ca.key" 4096 2>/dev/null
    openssl req -x509 -new -key "$CERTS/ca.key" -sha256 -days 825 \
        -subj "/CN=privet federation CA" -out "$CERTS/ca.crt"
    echo "created $CERTS/ca.crt (CA; keep ca.key offline)"
fi

if [[ ! -f "$CERTS/server.pem" || ! -f "$CERTS/server.key" ]]; then
    alt="DNS.1 = superlink
DNS.2 = localhost
IP.1 = 127.0.0.1
IP.2 = ::1
IP.3 = ${PRIVET_CONTROL_NET:-172.30.93}.2"
    d=3; i=4
    for san in "${SANS[@]}"; do
        if [[ "$san" =~ ^[0-9.]+$ || "$san" == *:* ]]; then alt+=$'\n'"IP.$i = $san"; i=$((i + 1))
        else alt+=$'\n'"DNS.$d = $san"; d=$((d + 1)); fi
    done
    cnf="$(mktemp)"
    trap 'rm -f "$cnf"' EXIT
    cat > "$cnf" <<CNF
[req]
distinguished_name = dn
req_extensions = ext
prompt = no
[dn]
CN = superlink
[ext]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt
[alt]
$alt
CNF
    openssl genrsa -out "$CERTS/server.key" 4096 2>/dev/null
    openssl req -new -key "$CERTS/server.key" -out "$CERTS/server.csr" -config "$cnf"
    openssl x509 -req -in "$CERTS/server.csr" -CA "$CERTS/ca.crt" -CAkey "$CERTS/ca.key" \
        -CAcreateserial -out "$CERTS/server.pem" -days 825 -sha256 \
        -extfile "$cnf" -extensions ext 2>/dev/null
    rm -f "$CERTS/server.csr" "$CERTS/ca.srl"
    echo "created $CERTS/server.pem (SANs: superlink, localhost, 127.0.0.1, ::1, ${PRIVET_CONTROL_NET:-172.30.93}.2${SANS[*]:+, ${SANS[*]}})"
fi

for ((k = 0; k < N; k++)); do
    key="$KEYS/supernode-$k"
    if [[ ! -f "$key" ]]; then
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$k" -f "$key"
        echo "created $key (+ .pub)"
    fi
done

# Containers run as a non-root user (uid 10001 in the privet image): the files must be
# readable there. Private keys stay unreadable to other users of the host.
chmod 0755 "$CERTS" "$KEYS"
chmod 0644 "$CERTS/ca.crt" "$CERTS/server.pem" "$KEYS"/*.pub
chmod 0600 "$CERTS/ca.key"
if [[ "$(id -u)" == 0 ]]; then
    chown 10001:10001 "$CERTS/server.key" "$KEYS"/supernode-* 2>/dev/null || true
fi
chmod 0600 "$CERTS/server.key" "$KEYS"/supernode-*[0-9]
