#!/usr/bin/env bash
# Throwaway PKI for the TLS tests (issue #14, Security), made fresh at test time with Debian's openssl
# CLI so that no private key lives in the tree:
#   ca.pem/ca.key          the CA that signs server.pem and client.pem
#   server.pem/server.key  CN=localhost, SAN DNS:localhost, IP:127.0.0.1, ::1
#   client.pem/client.key  CN=maskd-test-client (clientAuth)
#   other-ca.pem           an unrelated CA (a client trusting only it must fail the handshake)
#   other.key              a key that belongs to no certificate here (mismatch tests)
#   server-encrypted.key   server.key under a passphrase (maskd must refuse it, never prompt)
# Usage: make_test_certs.sh DIR
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
q() { "$@" >/dev/null 2>&1 || { echo "make_test_certs: failed: $*" >&2; "$@"; exit 1; }; }
key() { q openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

key ca.key
q openssl req -x509 -new -key ca.key -sha256 -days 2 -subj "/CN=maskd test CA" -out ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
key other-ca.key
q openssl req -x509 -new -key other-ca.key -sha256 -days 2 -subj "/CN=maskd other CA" -out other-ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
key other.key

sign() {  # name subject extensions
  key "$1.key"
  q openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  q openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days 2 \
    -extfile "$1.ext" -out "$1.pem"
  rm -f "$1.csr" "$1.ext"
}
sign server "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage=serverAuth"
sign client "/CN=maskd-test-client" "extendedKeyUsage=clientAuth"
q openssl pkey -in server.key -aes256 -passout pass:maskd-test -out server-encrypted.key
