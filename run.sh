#!/usr/bin/env bash
# The two Quick start commands (see README.md):
#   bash run.sh demo   # local cluster on Fashion-MNIST with a Byzantine worker
#   bash run.sh test   # the whole test suite, then every libFuzzer target briefly
# and for benchmarks (docs/bench.md) and experiments (docs/evaluation.md):
#   bash run.sh bench aggregators [flags]   # ps-bench; also installs python3-torch
#                                           # for bench/compare_torch.py
#   bash run.sh experiment [flags]          # ps-experiment on the default grid (or
#                                           # --config FILE); installs python3-matplotlib
#   bash run.sh install                     # builds and installs into /usr/local
#                                           # (PS_INSTALL_PREFIX): ps-server, ps-launch,
#                                           # the C++ library and the Python package
#   bash run.sh gpu-check [OUT_DIR]         # on a machine with a CUDA device: the GPU
#                                           # tests and benches (bench/gpu_check.sh)
# Each installs missing Debian packages (as root, through apt-get), configures and
# builds in build/, then runs. Quiet unless something fails.
#
# After ctest, `test` validates deploy/ offline (deploy/validate.sh, when kubectl is
# installed; PS_DEPLOY_CHECK=0 skips), then builds the fuzz targets with clang (ASan + UBSan + libFuzzer) in
# build-fuzz/ and runs each for PS_FUZZ_SECONDS seconds (default 10; 13 targets, one per
# core at a time, so about 80 s on two cores plus the first clang build), failing on a crash (tests/fuzz/run_fuzzers.sh,
# docs/fuzzing.md). PS_FUZZ_SECONDS=0 skips that step.
# Then it builds the integration tests with ASan + UBSan (clang, in build-fuzz/, whose
# libraries the fuzz targets share) and with TSan (g++, build-tsan/) and runs them
# (tests/sanitizers/run_sanitizers.sh, docs/sanitizers.md; with fuzzing about 25 minutes
# on 2 cores with fresh build directories). The whole of `test` from a fresh clone with
# the packages installed: under an hour on 2 cores (docs/building.md).
# PS_SANITIZERS=0 skips that step.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  g++ cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libssl-dev zlib1g-dev libboost-dev
  libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libgmock-dev
  libtorch-dev libopenblas0-pthread dataset-fashion-mnist python3
  prometheus-cpp-dev
  python3-dev pybind11-dev python3-numpy
)
BUILD_DIR=${PS_BUILD_DIR:-build}
LOG_DIR="$BUILD_DIR/logs"

die() { echo "run.sh: $*" >&2; exit 1; }

# Runs a command with its output in a log file; shows the log's tail only on failure.
quietly() {
  local log=$1; shift
  if ! "$@" >"$log" 2>&1; then
    echo "run.sh: '$*' failed; last lines of $log:" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
}

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root or install them first"
  echo "Installing ${#missing[@]} Debian packages: ${missing[*]}"
  mkdir -p /tmp/ps-server-setup
  quietly /tmp/ps-server-setup/apt-update.log apt-get update
  quietly /tmp/ps-server-setup/apt-install.log \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
}

configure() {
  mkdir -p "$LOG_DIR"
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    echo "Configuring in $BUILD_DIR/"
    # Line tables only (-g1): backtraces and sanitizer reports keep file:line, and the
    # build takes about two thirds of the time full debug information does
    # (docs/building.md); configure a build of your own for a debugger's variables.
    quietly "$LOG_DIR/configure.log" \
      cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
  fi
}

configure_and_build() {
  configure
  echo "Building $* (log: $LOG_DIR/build.log)"
  quietly "$LOG_DIR/build.log" cmake --build "$BUILD_DIR" -j"$(nproc)" ${1:+--target "$@"}
}

case "${1:-}" in
  demo)
    shift
    install_missing
    configure_and_build ps-server ps-fashion-mnist ps-demo
    exec "$BUILD_DIR/bin/ps-demo" "$@"
    ;;
  test)
    shift
    fuzz_seconds=${PS_FUZZ_SECONDS:-10}
    [[ $fuzz_seconds =~ ^[0-9]+$ ]] || die "PS_FUZZ_SECONDS must be a number of seconds, got '$fuzz_seconds'"
    # clang builds the fuzz targets and the ASan integration tests (one build, build-fuzz/).
    if [ "$fuzz_seconds" -gt 0 ] || [ "${PS_SANITIZERS:-1}" != 0 ]; then
      PACKAGES+=(clang libclang-rt-14-dev)
    fi
    # promtool (package prometheus) lints the metrics exposition in ps_metrics_scrape_test
    # and runs the alerting rules' unit tests (deploy_monitoring).
    # (deploy/validate.sh installs node and npm itself when they are missing: a node
    # from elsewhere brings its own npm, which Debian's npm package conflicts with.)
    PACKAGES+=(prometheus)
    # A real headless browser opens the shards' /status page (python_status_page).
    PACKAGES+=(chromium)
    # The Python package's tests (tests/python) run under pytest, with torch tensors too.
    PACKAGES+=(python3-pytest python3-torch)
    # ps-launch -H starts processes over OpenSSH: python_hosts runs an sshd per "host"
    # (a network namespace) and the client (openssh-client, iproute2 for the namespaces).
    PACKAGES+=(openssh-server openssh-client iproute2)
    # ps-bench udp --kernel-loss drops packets on a private loopback with an nftables
    # rule (bench_udp_kernel_loss_smoke).
    PACKAGES+=(nftables)
    # ps-launch --slurm under a real Slurm: python_slurm starts munged, slurmctld and
    # slurmd on this machine and submits examples/slurm/train.sbatch.
    PACKAGES+=(slurm-wlm munge)
    install_missing
    configure_and_build
    (cd "$BUILD_DIR" && ctest --output-on-failure --timeout 600 -j"$(nproc)" "$@")
    if [ "${PS_DEPLOY_CHECK:-1}" != 0 ]; then
      if command -v kubectl >/dev/null; then
        echo "Validating deploy/ offline (kustomize render, Kubernetes schemas, Dockerfile, ConfigMap; log: $LOG_DIR/deploy.log; PS_DEPLOY_CHECK=0 skips)"
        quietly "$LOG_DIR/deploy.log" bash deploy/validate.sh --ps-server "$BUILD_DIR/bin/ps-server"
        grep -c '  ok: ' "$LOG_DIR/deploy.log" | sed 's/$/ deploy checks passed/'
      else
        echo "Skipping deploy/validate.sh: no kubectl (>= 1.27; Debian bookworm's own is too old; see docs/deploy.md)"
      fi
    fi
    if [ "$fuzz_seconds" -gt 0 ]; then
      echo "Fuzzing every target for ${fuzz_seconds}s (clang build in build-fuzz/; log: $LOG_DIR/fuzz.log; PS_FUZZ_SECONDS=0 skips)"
      mkdir -p "$LOG_DIR"
      quietly "$LOG_DIR/fuzz.log" env PS_FUZZ_JOBS="$(nproc)" tests/fuzz/run_fuzzers.sh "$fuzz_seconds"
      grep -a '^===' "$LOG_DIR/fuzz.log" | tail -n 1
    fi
    if [ "${PS_SANITIZERS:-1}" != 0 ]; then
      echo "Integration tests under ASan + UBSan and TSan (build-fuzz/ with clang, build-tsan/; log: $LOG_DIR/sanitizers.log; PS_SANITIZERS=0 skips)"
      mkdir -p "$LOG_DIR"
      quietly "$LOG_DIR/sanitizers.log" env PS_SANITIZE_JOBS="$(nproc)" tests/sanitizers/run_sanitizers.sh
      grep -a '^===' "$LOG_DIR/sanitizers.log" | tail -n 1
    fi
    ;;
  experiment)
    shift
    PACKAGES+=(python3-matplotlib)
    install_missing
    configure_and_build ps-experiment
    config=()
    case " $* " in *" --config "*) ;; *) config=(--config examples/fashion_mnist/experiments/default.toml) ;; esac
    exec "$BUILD_DIR/bin/ps-experiment" "${config[@]}" "$@"
    ;;
  install)
    shift
    PACKAGES+=(python3-torch)  # for ps_server.torch
    install_missing
    configure_and_build
    prefix=${PS_INSTALL_PREFIX:-/usr/local}
    echo "Installing into $prefix (log: $LOG_DIR/install.log)"
    quietly "$LOG_DIR/install.log" cmake --install "$BUILD_DIR" --prefix "$prefix"
    package=$(grep -o '[^ ]*/dist-packages/ps_server/' "$LOG_DIR/install.log" | head -n 1 || true)
    echo "Installed ps-server, ps-admin${package:+, ps-launch and the Python package ps_server (${package%/})}"
    ;;
  bench)
    shift
    PACKAGES+=(python3-torch)
    install_missing
    configure_and_build ps-bench
    exec "$BUILD_DIR/bin/ps-bench" "$@"
    ;;
  gpu-check)
    shift
    install_missing
    configure
    ninja -C "$BUILD_DIR" -t targets all | grep -q '^ps_aggregators_cuda_test:' ||
      die "gpu-check needs a build with CUDA, and $BUILD_DIR/ was configured without a CUDA toolkit (docs/gpu.md)"
    configure_and_build ps-bench ps_aggregators_cuda_test ps_codecs_cuda_device_test
    exec bench/gpu_check.sh "$BUILD_DIR" "$@"
    ;;
  *)
    echo "usage: bash run.sh demo [ps-demo flags] | bash run.sh test [ctest flags]" \
      "| bash run.sh bench SUBCOMMAND [ps-bench flags] | bash run.sh experiment [ps-experiment flags]" \
      "| bash run.sh gpu-check [OUT_DIR] | bash run.sh install" >&2
    exit 2
    ;;
esac
