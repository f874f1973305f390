#!/usr/bin/env bash
# Builds (build.sh) and runs the whole test suite; exits with ctest's status.
# Extra arguments go to ctest (e.g. -L cli, -R planner).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

"$ROOT/scripts/build.sh"
exec ctest --test-dir "$ROOT/build" --output-on-failure -j2 "$@"
