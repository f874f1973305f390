#!/usr/bin/env bash
# Installs the Debian packages reshard needs, only those that are missing.
# Idempotent and non-interactive; used by both README commands and by CI.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libucx-dev ucx-utils libpqxx-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libssl-dev
  openssl postgresql python3-grpcio python3-protobuf python3-numpy python3-pytest
  python3-yaml python3-xxhash python3-torch prometheus nginx-light python3-matplotlib
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "bootstrap: missing packages ${missing[*]} and not root (no sudo)" >&2
    exit 1
  fi
fi

echo "bootstrap: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
