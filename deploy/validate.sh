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
for dir in "$DEPLOY"/k8s/base "$DEPLOY"/k8s/worker-job "$DEPLOY"/k8s/run "$DEPLOY"/k8s/run-python \
  "$DEPLOY"/k8s/overlays/*/; do
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
validate_k8s --ps-consistency "$RENDER"/run.yaml >/dev/null
ok "run (a JobSet owning its shards) renders, matches the Kubernetes and JobSet models, and agrees with itself"
validate_k8s --ps-consistency "$RENDER"/run-python.yaml >/dev/null
grep -q 'image: ps-server-worker-python:' "$RENDER"/run-python.yaml ||
  die "run-python: the workers do not run the worker-python image"
ok "run-python (the run with the Python example as its workers) renders, validates and agrees with itself"

# The overlays write the worker count once (the worker Job's completions): a copy of the
# tree with another count must render with every copy following, and still validate.
tree="$RENDER/tree-counts"
rm -rf "$tree" && mkdir -p "$tree" && cp -r "$DEPLOY/k8s" "$tree/k8s"
sed -i 's/^  completions: 6$/  completions: 9/' "$tree/k8s/worker-job/job.yaml"
kubectl kustomize "$tree/k8s/overlays/cpu" >"$RENDER/cpu-counts.yaml" || die "kubectl kustomize of the cpu overlay with 9 workers failed"
[ "$(grep -c -e 'parallelism: 9' -e 'value: "9"' "$RENDER/cpu-counts.yaml")" -eq 3 ] ||
  die "cpu overlay with completions 9: parallelism, PS_NUM_WORKERS and the shards' PS_WORKERS did not all follow"
validate_k8s --ps-consistency "$RENDER/cpu-counts.yaml" >/dev/null || die "the cpu overlay with 9 workers does not validate"
ok "overlays: the worker count is written once (the Job's completions 9 reaches parallelism, PS_NUM_WORKERS, --workers and the shards' PS_WORKERS)"

# The run writes each count once (its Job's completions); kustomize copies it. A copy of
# the run with other counts must render with every copy following, and still validate.
counts="$RENDER/run-counts"
rm -rf "$counts" && cp -r "$DEPLOY/k8s/run" "$counts"
sed -i -e 's/^          completions: 6 /          completions: 9 /' -e 's/^          completions: 2 /          completions: 3 /' \
  -e 's|^\(                      value: \)\$(JOBSET_NAME)-shard-0-0.*|\1$(JOBSET_NAME)-shard-0-0.$(JOBSET_NAME):7070,$(JOBSET_NAME)-shard-0-1.$(JOBSET_NAME):7070,$(JOBSET_NAME)-shard-0-2.$(JOBSET_NAME):7070|' \
  "$counts/jobset.yaml"
kubectl kustomize "$counts" >"$RENDER/run-counts.yaml" || die "kubectl kustomize of the run with 9 workers and 3 shards failed"
for want in 'parallelism: 9' 'parallelism: 3' 'value: "9"' 'value: "3"'; do
  [ "$(grep -c -- "$want" "$RENDER/run-counts.yaml")" -ge 1 ] || die "run with 9 workers, 3 shards: no '$want' in the rendered copy"
done
[ "$(grep -c 'value: "9"' "$RENDER/run-counts.yaml")" -eq 2 ] || die "run with 9 workers: PS_WORKERS and PS_NUM_WORKERS did not both follow completions"
validate_k8s --ps-consistency "$RENDER/run-counts.yaml" >/dev/null || die "run with 9 workers and 3 shards does not validate"
ok "run: the worker and shard counts are written once (completions 9 and 3 reach parallelism, PS_WORKERS, PS_NUM_WORKERS, PS_NUM_SHARDS)"

# --- 3: negative tests ---------------------------------------------------------------
# Each mutation of a rendered overlay must be refused with a message naming the field.
# The run's negative tests mutate the rendered run instead (NEGATIVE_OF).
expect_refused() {
  local what=$1 sed_expr=$2 expect=$3 file="$RENDER/negative.yaml" out of=${NEGATIVE_OF:-${overlays[0]}}
  sed -e "$sed_expr" "$of" >"$file"
  cmp -s "$file" "$of" && die "negative test '$what': the mutation '$sed_expr' changed nothing"
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
expect_refused "the default (TCP) data plane without a data port" '/^    data-plane = "tcp"/d; /^    data-port = 7072/d' 'needs a fixed data-port'
expect_refused "replicas != num-shards" 's/^  replicas: \([0-9]*\)/  replicas: 1\1/' '!= num-shards'
expect_refused "a second worker count" '0,/value: "6"/s/value: "6"/value: "5"/' "completions 6 != the shards' workers 5"
expect_refused "the worker count in ps-server.toml too" 's/^    byzantine = 1/    workers = 6\n    byzantine = 1/' 'the worker count is both PS_WORKERS and workers'
expect_refused "worker Job of another run" '/^kind: Job$/,$s/key: run-id$/key: run-id-2/' "PS_RUN_ID ConfigMap"
expect_refused "checkpoints shared by every run" 's|/var/lib/ps-server/checkpoints/\$(PS_RUN_ID)|/var/lib/ps-server/checkpoints|' "must contain \$(PS_RUN_ID)"
expect_refused "a misspelled variable in a flag" 's/tls\/shard-$(POD_INDEX).pem/tls\/shard-$(POD_IDX).pem/' 'refers to $(POD_IDX), which the container does not define'
NEGATIVE_OF="$RENDER/run.yaml"
expect_refused "run: a misspelled variable in the peers" 's/value: $(JOBSET_NAME)-shard-0-0/value: $(JOBSET_NAMES)-shard-0-0/' 'refers to $(JOBSET_NAMES), which the container does not define'
expect_refused "run: misspelled JobSet field" 's/^  successPolicy:/  sucessPolicy:/' 'unknown field "sucessPolicy"'
expect_refused "run: misspelled field in a pod template" '0,/readinessProbe:/s/readinessProbe:/readinesProbe:/' 'unknown field "readinesProbe"'
expect_refused "run: a second worker count" '0,/value: "6"/s/value: "6"/value: "5"/' "PS_WORKERS 5 != the worker Job's completions 6"
expect_refused "run: success when the shards succeed" 's/^    - worker$/    - shard/' 'the run ends with its workers'
expect_refused "run: a run id that outlives the run" 's/jobset.sigs.k8s.io\/jobset-uid/jobset.sigs.k8s.io\/jobset-name/' "PS_RUN_ID must be the JobSet's UID"
expect_refused "run: peers short of the shard count" 's/^\(        \)completions: 2$/\1completions: 3/' '(completions 3, one per shard in id order)'
expect_refused "run: the worker count in ps-server.toml" 's/^    byzantine = 1/    workers = 6\n    byzantine = 1/' 'sets workers, which the JobSet gives every shard'
unset NEGATIVE_OF
# Kubernetes expands in an env value only the variables defined before it.
cat >"$RENDER/order.yaml" <<'YAML'
apiVersion: batch/v1
kind: Job
metadata:
  name: order
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: c
          image: busybox
          env:
            - name: PS_SHARDS
              value: $(SHARD_HOST):7070
            - name: SHARD_HOST
              value: shard-0
YAML
if out=$(validate_k8s "$RENDER/order.yaml" 2>&1); then die "negative test 'a variable used before it is defined': accepted"; fi
grep -q 'refers to $(SHARD_HOST), defined only after it' <<<"$out" ||
  die "negative test 'a variable used before it is defined': no such message in: $out"
ok "negative test: a variable used before it is defined is refused"

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

# --- 4b: certificates for the run ----------------------------------------------------
# make-certs.sh --jobset NAME must sign, for shard N, the very name the run's workers and
# peers dial (PS_PEERS of the rendered run, $(JOBSET_NAME) resolved).
if command -v openssl >/dev/null; then
  certs=$(mktemp -d)
  run_name=$(sed -n '/^kind: JobSet$/,$p' "$RENDER/run.yaml" | sed -n 's/^  name: //p' | head -n 1)
  peers=$(grep -m1 -A1 'name: PS_PEERS' "$RENDER/run.yaml" | sed -n 's/^ *value: //p' | sed "s/\$(JOBSET_NAME)/$run_name/g")
  "$DEPLOY/tls/make-certs.sh" --jobset "$run_name" "$certs" "$(tr ',' '\n' <<<"$peers" | grep -c .)" 1 >/dev/null 2>&1 ||
    die "make-certs.sh --jobset $run_name failed"
  i=0
  for peer in ${peers//,/ }; do
    sans=$(openssl x509 -in "$certs/shard-$i.pem" -noout -ext subjectAltName)
    [[ $sans == *"DNS:${peer%:*},"* || $sans == *"DNS:${peer%:*}" ]] ||
      die "make-certs.sh --jobset $run_name: shard-$i.pem does not name ${peer%:*} (the run's PS_PEERS): $sans"
    i=$((i + 1))
  done
  rm -rf "$certs"
  ok "make-certs.sh --jobset $run_name signs the name of every shard of the run ($peers)"
else
  echo "  skipped: run certificates (no openssl)"
fi

# --- 5: the TOML config against a real ps-server -------------------------------------
if [ -z "$PS_SERVER" ] && [ -x "$ROOT/${PS_BUILD_DIR:-build}/bin/ps-server" ]; then
  PS_SERVER="$ROOT/${PS_BUILD_DIR:-build}/bin/ps-server"
fi
if [ -z "$PS_SERVER" ]; then
  echo "  skipped: ps-server config check (no build/bin/ps-server; pass --ps-server PATH or PS_SERVER_BIN)"
else
  [ -x "$PS_SERVER" ] || die "ps-server binary '$PS_SERVER' is not executable"
  flags=" $("$PS_SERVER" --help | grep -o -- '--[a-z0-9-]*' | sed 's/^--//' | sort -u | tr '\n' ' ') "
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  if [[ $flags == *" tls-cert "* ]]; then
    [ -x "$DEPLOY/tls/make-certs.sh" ] || die "deploy/tls/make-certs.sh is missing (needed for the TLS settings)"
    "$DEPLOY/tls/make-certs.sh" "$work/tls" 1 1 >"$work/make-certs.log" 2>&1 ||
      { cat "$work/make-certs.log" >&2; die "deploy/tls/make-certs.sh failed"; }
  fi

  # check_toml FILE [VAR=VALUE...]: every key is a flag; ps-server starts with the file
  # as is (and the environment the pod gives it), overriding only what ties it to the
  # pod: address, shard id, paths. The certificates are test ones from make-certs.sh. A
  # parse error or a failed Validate() exits 2 at once; a good file serves until SIGTERM.
  check_toml() {
    local toml=$1 rel=${1#"$ROOT/"} unknown=() overrides key pid rc
    shift
    for key in $(sed -n 's/^[[:space:]]*\([A-Za-z0-9_-]*\)[[:space:]]*=.*/\1/p' "$toml" | tr '_' '-'); do
      [[ $flags == *" $key "* ]] || unknown+=("$key")
    done
    [ ${#unknown[@]} -eq 0 ] || die "$rel sets keys that $PS_SERVER does not know: ${unknown[*]}"
    ok "every key of $rel is a flag of $PS_SERVER"
    rm -f "$work/port"
    overrides=(--host=127.0.0.1 --port=0 --port-file="$work/port" --shard-id=0)
    if [[ $flags == *" tls-cert "* ]]; then
      overrides+=(--tls-cert="$work/tls/shard-0.pem" --tls-key="$work/tls/shard-0.key")
      grep -Eq '^[[:space:]]*tls[-_]ca[[:space:]]*=' "$toml" && overrides+=(--tls-ca="$work/tls/ca.pem")
    fi
    [[ $flags == *" checkpoint-dir "* ]] && overrides+=(--checkpoint-dir="$work/checkpoints")
    [[ $flags == *" metrics-port "* ]] && overrides+=(--metrics-port=0)
    [[ $flags == *" health-port "* ]] && overrides+=(--health-port=0)
    env -u PS_CONFIG "$@" "$PS_SERVER" --config "$toml" "${overrides[@]}" >"$work/log" 2>&1 &
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
      die "ps-server did not start with $rel (environment: $*; overrides: ${overrides[*]})"
    fi
    kill -TERM "$pid"
    rc=0
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; die "ps-server did not exit within 30 s of SIGTERM"; fi
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ] || { cat "$work/log" >&2; die "ps-server exited $rc after SIGTERM (expected 0)"; }
    # What the environment sets must be what the shard serves with (its serving line).
    local var want
    for var in "$@"; do
      case ${var%%=*} in
        PS_WORKERS) want="${var#*=} workers," ;;
        PS_RUN_ID) want=", run ${var#*=}" ;;
        *) continue ;;
      esac
      grep -q "serving on.*$want" "$work/log" || { cat "$work/log" >&2; die "ps-server with $var: no '$want' in its serving line"; }
    done
    ok "ps-server starts with $rel${*:+ and $*} (on loopback, port $(cat "$work/port")) and exits 0 on SIGTERM"
  }
  check_toml "$DEPLOY/k8s/base/ps-server.toml" PS_WORKERS=6
  # The run's shards take the counts and the run id from the JobSet's environment.
  check_toml "$DEPLOY/k8s/run/ps-server.toml" PS_WORKERS=6 PS_NUM_SHARDS=1 \
    PS_RUN_ID=0b6f3d52-3c1e-4a52-9d7e-5f1c2a7b9e10
fi

echo "deploy/validate.sh: all $passed checks passed"
