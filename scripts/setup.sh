#!/usr/bin/env bash
# Installs every dependency of jtok from Debian (and npm tarballs for data), idempotently.
# Each scripts/setup.d/*.sh adds one concern; they run in name order.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
PKGS=(build-essential cmake g++ libdnnl-dev libopenblas-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev libbenchmark-dev python3-torch python3-numpy
      libopenblas0-openmp libcpp-httplib-dev pkg-config curl  # serve (docs/serve.md)
      libopenmpi-dev openmpi-bin                    # distributed training (docs/distributed.md)
      clang-14 libfuzzer-14-dev libomp-14-dev  # scripts/fuzz.sh: libFuzzer + ASan/UBSan builds
      ccache)                                   # scripts/test.sh, test_asan.sh: rebuilds from the cache
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# node and npm may come from elsewhere on the machine; install Debian's only when absent.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: Debian packages present"
fi
for f in scripts/setup.d/*.sh; do
  [ -e "$f" ] || continue
  bash "$f"
done
