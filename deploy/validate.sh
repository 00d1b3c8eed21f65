#!/usr/bin/env bash
# Offline checks of deploy/ (docs/deploy.md, "Validation"). No cluster, no container
# engine, no network beyond the npm registry for the first install.
#
#   bash deploy/validate.sh [--ps-server PATH]
#
# 1. Renders the kustomize base, the worker Job and every overlay with `kubectl kustomize`.
# 2. Validates every rendered object against the Kubernetes OpenAPI models
#    (deploy/validate/validate-k8s.mjs: schema, unknown fields, ps-server topology).
# 3. Negative tests: copies of a rendered overlay with a misspelled field (replicsa,
#    contianerPort, a misspelled probe field), a probe on the TLS port, the data port
#    missing from the pod or the Service, the TCP data plane without a fixed data port,
#    and replicas != num-shards must fail.
# 4. Dockerfile, statically: every package in its *_PACKAGES lists exists in the apt
#    lists, and its build list covers run.sh's PACKAGES (less test/demo-only ones).
# 5. With a ps-server binary (--ps-server PATH, PS_SERVER_BIN, else build/bin/ps-server
#    when it exists; skipped otherwise): every key of the ConfigMap's TOML is a flag of
#    that binary, and the binary starts with that file on loopback (network and path
#    settings overridden) and exits 0 on SIGTERM.
#
# Needs kubectl (with kustomize v5; Debian package kubectl) and node >= 18 with npm
# (package nodejs); missing ones are installed with apt-get when run as root. The npm
# packages (deploy/validate/package.json) go to $PS_DEPLOY_CACHE (default
# build/deploy-validate) once. Exit 0 when every check passes.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPLOY="$ROOT/deploy"
CACHE=${PS_DEPLOY_CACHE:-$ROOT/${PS_BUILD_DIR:-build}/deploy-validate}
PS_SERVER=${PS_SERVER_BIN:-}
while [ $# -gt 0 ]; do
  case $1 in
    --ps-server) PS_SERVER=${2:?--ps-server needs a path}; shift 2 ;;
    --ps-server=*) PS_SERVER=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "validate.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

passed=0
die() { echo "validate.sh: $*" >&2; exit 1; }
ok() { passed=$((passed + 1)); echo "  ok: $*"; }

# --- tools ---------------------------------------------------------------------------
apt_install() {
  [ "$(id -u)" -eq 0 ] || return 1
  echo "validate.sh: installing $* with apt-get"
  apt-get update >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null 2>&1
}
if ! command -v kubectl >/dev/null; then
  apt_install kubectl || die "kubectl is missing and 'apt-get install kubectl' failed (or not root).
  Install the Debian package kubectl (kubectl >= 1.27, bundling kustomize v5); Debian's own
  kubernetes-client (1.20) is too old for these kustomizations."
fi
kustomize_version=$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v//p')
[[ ${kustomize_version%%.*} -ge 5 ]] 2>/dev/null ||
  die "kubectl bundles kustomize '${kustomize_version:-unknown}'; need v5 or later (kubectl >= 1.27)"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt_install nodejs npm || die "node and npm are missing and 'apt-get install nodejs npm' failed (or not root)"
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 18 ] || die "node $node_major is too old; need 18 or later"

# npm packages, installed once per package.json into the cache (no lock file: it would
# record download addresses; the versions are pinned in package.json).
mkdir -p "$CACHE"
if ! cmp -s "$DEPLOY/validate/package.json" "$CACHE/package.json" || [ ! -d "$CACHE/node_modules" ]; then
  echo "validate.sh: npm install into $CACHE (log: $CACHE/npm.log)"
  rm -rf "$CACHE/node_modules"
  cp "$DEPLOY/validate/package.json" "$CACHE/package.json"
  (cd "$CACHE" && npm install --no-package-lock --no-audit --no-fund --loglevel=error >npm.log 2>&1) ||
    { tail -n 30 "$CACHE/npm.log" >&2; rm -f "$CACHE/package.json"; die "npm install failed"; }
fi
# ESM resolves packages next to the script, so the validator runs from the cache.
cp "$DEPLOY/validate/validate-k8s.mjs" "$CACHE/validate-k8s.mjs"
validate_k8s() { node "$CACHE/validate-k8s.mjs" "$@"; }

# --- 1 and 2: render and validate ----------------------------------------------------
echo "validate.sh: rendering and validating deploy/k8s (kubectl $(kubectl version --client 2>/dev/null | sed -n 's/^Client Version: //p'), kustomize v$kustomize_version)"
RENDER="$CACHE/rendered"
rm -rf "$RENDER" && mkdir -p "$RENDER"
overlays=()
for dir in "$DEPLOY"/k8s/base "$DEPLOY"/k8s/worker-job "$DEPLOY"/k8s/overlays/*/; do
  dir=${dir%/}
  name=${dir#"$DEPLOY/k8s/"}; name=${name//\//-}
  kubectl kustomize "$dir" >"$RENDER/$name.yaml" 2>"$RENDER/$name.err" ||
    { cat "$RENDER/$name.err" >&2; die "kubectl kustomize ${dir#"$ROOT/"} failed"; }
  case $name in overlays-*) overlays+=("$RENDER/$name.yaml") ;; esac
done
[ ${#overlays[@]} -gt 0 ] || die "no overlays under deploy/k8s/overlays"
validate_k8s "$RENDER"/base.yaml "$RENDER"/worker-job.yaml >/dev/null
ok "base and worker-job render and match the Kubernetes OpenAPI models"
validate_k8s --ps-consistency "${overlays[@]}" >/dev/null
names=("${overlays[@]##*/overlays-}")
ok "overlays (${names[*]%.yaml}) render, match the models, and agree on the topology"

# --- 3: negative tests ---------------------------------------------------------------
# Each mutation of a rendered overlay must be refused with a message naming the field.
expect_refused() {
  local what=$1 sed_expr=$2 expect=$3 file="$RENDER/negative.yaml" out
  sed -e "$sed_expr" "${overlays[0]}" >"$file"
  cmp -s "$file" "${overlays[0]}" && die "negative test '$what': the mutation '$sed_expr' changed nothing"
  if out=$(validate_k8s --ps-consistency "$file" 2>&1); then
    die "negative test '$what': the validator accepted it"
  fi
  grep -qF -- "$expect" <<<"$out" || die "negative test '$what': no '$expect' in:
$out"
  ok "negative test: $what is refused ($(grep -F -- "$expect" <<<"$out" | head -n 1 | sed 's/^ *//; s/^[^:]*: //'))"
}
expect_refused "misspelled replicas" 's/^  replicas:/  replicsa:/' 'unknown field "replicsa"'
expect_refused "misspelled containerPort" '0,/containerPort:/s/containerPort:/contianerPort:/' 'unknown field "contianerPort"'
expect_refused "misspelled probe field" '0,/periodSeconds:/s/periodSeconds:/periodSecond:/' 'unknown field "periodSecond"'
expect_refused "probe on the TLS port" '0,/ port: 7071/s/ port: 7071/ port: 7070/' 'plaintext health is on'
expect_refused "data port not on the pod" '0,/containerPort: 7072/s/containerPort: 7072/containerPort: 7073/' 'no containerPort 7072'
expect_refused "data port not on the Service" '0,/targetPort: data/s/targetPort: data/targetPort: metrics/' 'no port 7072 for the data plane'
expect_refused "TCP data plane on a free port" 's/^    data-port = 7072/    data-port = 0/' 'needs a fixed data-port'
expect_refused "replicas != num-shards" 's/^  replicas: \([0-9]*\)/  replicas: 1\1/' '!= num-shards'

# --- 4: Dockerfile, statically -------------------------------------------------------
DOCKERFILE="$DEPLOY/docker/Dockerfile"
# ARG NAME_PACKAGES="a b \ <newline> c" -> the words, per list.
docker_packages() {
  awk -v list="$1" '
    $0 ~ "^ARG " list "=" { on = 1; sub("^ARG " list "=\"", "") }
    on { line = $0; gsub(/[\\"]/, " ", line); printf "%s ", line; if ($0 ~ /"[[:space:]]*$/) on = 0 }
  ' "$DOCKERFILE" | xargs
}
for stage in build worker worker-python server; do
  grep -q "^FROM .* AS $stage\$" "$DOCKERFILE" || die "Dockerfile: no stage '$stage'"
done
[ "$(grep -c '^USER 65532:65532$' "$DOCKERFILE")" -eq 3 ] || die "Dockerfile: every final stage (worker, worker-python, server) must run as USER 65532:65532"
if ! apt-cache show libc6 >/dev/null 2>&1; then
  echo "  skipped: Dockerfile package names (no apt lists here; run apt-get update)"
else
  missing=()
  for list in BUILD_PACKAGES WORKER_PACKAGES WORKER_PYTHON_PACKAGES SERVER_PACKAGES; do
    pkgs=$(docker_packages "$list")
    [ -n "$pkgs" ] || die "Dockerfile: ARG $list not found or empty"
    # One apt-cache call per list (each call reads the whole cache).
    # shellcheck disable=SC2086
    found=" $(apt-cache show --no-all-versions $pkgs 2>/dev/null | sed -n 's/^Package: //p' | tr '\n' ' ') "
    for p in $pkgs; do
      [[ $found == *" $p "* ]] || missing+=("$p ($list)")
    done
  done
  [ ${#missing[@]} -eq 0 ] || die "Dockerfile: no such Debian package: ${missing[*]}"
  ok "Dockerfile: every package of BUILD/WORKER/WORKER_PYTHON/SERVER_PACKAGES exists in the apt lists"
fi
# run.sh's PACKAGES, less what only tests, the demo or the experiments need.
run_packages=$(sed -n '/^PACKAGES=(/,/^)/p' "$ROOT/run.sh" | sed '1d;$d' | tr -s ' \n' ' ')
build_packages=" $(docker_packages BUILD_PACKAGES) "
uncovered=()
for p in $run_packages; do
  case $p in libgtest-dev|libgmock-dev|dataset-fashion-mnist|python3) continue ;; esac
  # A run-time library of the training images, not a build dependency (OpenBLAS under
  # libtorch's matrix products): the images that train must have it.
  if [ "$p" = libopenblas0-pthread ]; then
    for list in WORKER_PACKAGES WORKER_PYTHON_PACKAGES; do
      [[ " $(docker_packages "$list") " == *" $p "* ]] || uncovered+=("$p ($list)")
    done
    continue
  fi
  [[ $build_packages == *" $p "* ]] || uncovered+=("$p (BUILD_PACKAGES)")
done
[ ${#uncovered[@]} -eq 0 ] || die "Dockerfile: run.sh's packages missing from the images: ${uncovered[*]}"
ok "Dockerfile: stages build/worker/worker-python/server, non-root, build packages cover run.sh's (OpenBLAS: the training images)"

# --- 5: the TOML config against a real ps-server -------------------------------------
if [ -z "$PS_SERVER" ] && [ -x "$ROOT/${PS_BUILD_DIR:-build}/bin/ps-server" ]; then
  PS_SERVER="$ROOT/${PS_BUILD_DIR:-build}/bin/ps-server"
fi
TOML="$DEPLOY/k8s/base/ps-server.toml"
if [ -z "$PS_SERVER" ]; then
  echo "  skipped: ps-server config check (no build/bin/ps-server; pass --ps-server PATH or PS_SERVER_BIN)"
else
  [ -x "$PS_SERVER" ] || die "ps-server binary '$PS_SERVER' is not executable"
  flags=" $("$PS_SERVER" --help | grep -o -- '--[a-z0-9-]*' | sed 's/^--//' | sort -u | tr '\n' ' ') "
  unknown=()
  for key in $(sed -n 's/^[[:space:]]*\([A-Za-z0-9_-]*\)[[:space:]]*=.*/\1/p' "$TOML" | tr '_' '-'); do
    [[ $flags == *" $key "* ]] || unknown+=("$key")
  done
  [ ${#unknown[@]} -eq 0 ] ||
    die "deploy/k8s/base/ps-server.toml sets keys that $PS_SERVER does not know: ${unknown[*]}"
  ok "every key of ps-server.toml is a flag of $PS_SERVER"

  # Start it with the file as is, as the StatefulSet does, overriding only what ties it
  # to the pod: address, shard id, paths. The certificates are test ones from
  # deploy/tls/make-certs.sh. A parse error or a failed Validate() exits 2 at once; a
  # good file serves until SIGTERM.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  overrides=(--host=127.0.0.1 --port=0 --port-file="$work/port" --shard-id=0)
  if [[ $flags == *" tls-cert "* ]]; then
    [ -x "$DEPLOY/tls/make-certs.sh" ] || die "deploy/tls/make-certs.sh is missing (needed for the TLS settings)"
    "$DEPLOY/tls/make-certs.sh" "$work/tls" 1 1 >"$work/make-certs.log" 2>&1 ||
      { cat "$work/make-certs.log" >&2; die "deploy/tls/make-certs.sh failed"; }
    overrides+=(--tls-cert="$work/tls/shard-0.pem" --tls-key="$work/tls/shard-0.key")
    grep -Eq '^[[:space:]]*tls[-_]ca[[:space:]]*=' "$TOML" && overrides+=(--tls-ca="$work/tls/ca.pem")
  fi
  [[ $flags == *" checkpoint-dir "* ]] && overrides+=(--checkpoint-dir="$work/checkpoints")
  [[ $flags == *" metrics-port "* ]] && overrides+=(--metrics-port=0)
  [[ $flags == *" health-port "* ]] && overrides+=(--health-port=0)
  env -u PS_CONFIG "$PS_SERVER" --config "$TOML" "${overrides[@]}" >"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    [ -s "$work/port" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ ! -s "$work/port" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    cat "$work/log" >&2
    die "ps-server did not start with deploy/k8s/base/ps-server.toml (overrides: ${overrides[*]})"
  fi
  kill -TERM "$pid"
  rc=0
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; die "ps-server did not exit within 30 s of SIGTERM"; fi
  wait "$pid" || rc=$?
  [ "$rc" -eq 0 ] || { cat "$work/log" >&2; die "ps-server exited $rc after SIGTERM (expected 0)"; }
  ok "ps-server starts with ps-server.toml (on loopback, port $(cat "$work/port")) and exits 0 on SIGTERM"
fi

echo "deploy/validate.sh: all $passed checks passed"
