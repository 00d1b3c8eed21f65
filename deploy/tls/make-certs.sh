#!/usr/bin/env bash
# Makes a private CA and certificates for a ps-server cluster (docs/operations.md,
# "Securing"):
#   deploy/tls/make-certs.sh [--hosts H1,H2,...] [--jobset NAME] OUT_DIR [SHARDS=2] [WORKERS=4] [SERVICE=ps-shard] [NAMESPACE=default]
# --hosts adds the names (DNS) and addresses (IP) of the machines shards run on to every
# shard certificate (ps-launch -H does so for its shard hosts). --jobset NAME adds, to
# shard N's, the pod name it has in a run deployed as the JobSet NAME (deploy/k8s/run):
# NAME-shard-0-N.NAME[.NAMESPACE.svc[.cluster.local]]. Writes into OUT_DIR:
#   ca.pem, ca.key                 the CA (keep ca.key offline)
#   shard-N.pem, shard-N.key       server and peer certificate of shard N, common name
#                                  shard-N; names: localhost, 127.0.0.1, ::1,
#                                  SERVICE-N.SERVICE[.NAMESPACE.svc[.cluster.local]],
#                                  those of --jobset, and each of --hosts
#   worker-N.pem, worker-N.key     client certificate of worker N (common name worker-N)
#   admin.pem, admin.key           client certificate of the operator (common name admin)
#   tokens                         one "IDENTITY TOKEN" line per identity (--tokens), and
#                                  token-IDENTITY files holding the bare token (clients'
#                                  --token-file)
# The common name is the identity the shards act on: a worker's id comes from it.
# Keys are EC P-256; certificates last 365 days.
set -euo pipefail
usage="usage: $0 [--hosts H1,H2,...] [--jobset NAME] OUT_DIR [SHARDS] [WORKERS] [SERVICE] [NAMESPACE]"
extra_san=""
jobset=""
while [ $# -gt 0 ]; do
  case $1 in
    --hosts)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      IFS=, read -r -a hosts <<<"$2"
      shift 2
      for h in "${hosts[@]}"; do
        if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then
          extra_san+=",IP:$h"
        elif [[ $h =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]]; then
          extra_san+=",DNS:$h"
        else
          echo "$0: --hosts: '$h' is neither a host name nor an IP address" >&2
          exit 2
        fi
      done
      ;;
    --jobset)
      [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
      jobset=$2
      shift 2
      [[ $jobset =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ && ${#jobset} -le 63 ]] ||
        { echo "$0: --jobset: '$jobset' is not a JobSet name (a DNS-1035 label)" >&2; exit 2; }
      ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
out=$1
shards=${2:-2}
workers=${3:-4}
service=${4:-ps-shard}
namespace=${5:-default}
command -v openssl >/dev/null || { echo "$0: openssl is missing (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$out"
umask 077
cd "$out"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days 365 -subj "/CN=ps-server test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem 2>/dev/null

# cert NAME SAN USAGE
cert() {
  local name=$1 san=$2 usage=$3
  key "$name.key"
  openssl req -new -key "$name.key" -subj "/CN=$name" -out "$name.csr" 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n%s' \
    "$usage" "${san:+subjectAltName=$san}" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 \
    -sha256 -extfile "$name.ext" -out "$name.pem" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

: >tokens
token() {
  local t
  t=$(openssl rand -hex 32)
  echo "$1 $t" >>tokens
  printf '%s\n' "$t" >"token-$1"
}

for ((i = 0; i < shards; i++)); do
  san="DNS:localhost,IP:127.0.0.1,IP:::1"
  for host in "$service-$i.$service" ${jobset:+"$jobset-shard-0-$i.$jobset"}; do
    san+=",DNS:$host,DNS:$host.$namespace.svc,DNS:$host.$namespace.svc.cluster.local"
  done
  cert "shard-$i" "$san$extra_san" "serverAuth,clientAuth"
  token "shard-$i"
done
for ((i = 0; i < workers; i++)); do
  cert "worker-$i" "" clientAuth
  token "worker-$i"
done
cert admin "" clientAuth
token admin
rm -f ca.srl
chmod 0644 ./*.pem
echo "wrote CA, $shards shard, $workers worker and admin certificates and tokens to $out"
