#!/usr/bin/env bash
# Installs missing packages (bootstrap.sh), configures ./build (RelWithDebInfo)
# and builds every target. Idempotent; works from any directory. Extra
# arguments go to the cmake configure step (e.g. -DRESHARD_SANITIZE=ON).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$ROOT/build"

bash "$ROOT/scripts/bootstrap.sh"
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$BUILD_DIR" -j"$(nproc)"
