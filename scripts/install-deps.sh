#!/usr/bin/env bash
# Installs the Debian packages k3pack needs to build, test and demo.
# Idempotent: installs only what is missing, and runs `apt-get update` only then.
set -euo pipefail

PACKAGES=(
  build-essential g++ cmake make ninja-build pkg-config ccache
  libssl-dev nlohmann-json3-dev liburing-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-dev python3-pip python3-numpy python3-torch pybind11-dev
  clang libclang-rt-14-dev
  coreutils util-linux
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "k3pack: missing Debian packages: ${missing[*]}" >&2
  echo "k3pack: run as root (or install them) and try again" >&2
  exit 1
fi

echo "k3pack: installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
