#!/usr/bin/env bash
# The emulated-cluster benchmark (bench/cluster/README.md): builds ./build when
# the agent or coordinator binaries are missing (scripts/build.sh), then runs
# bench/cluster/bench_cluster.py with the given arguments, e.g.
#   scripts/bench_cluster.sh                      # 4 hosts, 2 Gbit/s, 4 cases, 3 reps
#   scripts/bench_cluster.sh --rate-gbit 10 --cases 1 --json out.json
#   scripts/bench_cluster.sh --unshaped           # CPU and rate yardsticks
#   scripts/bench_cluster.sh --quick              # smoke run (what CTest runs)
# Needs root (network namespaces, tc). Exit status 77: skipped.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$ROOT/build"

if [ ! -x "$BUILD_DIR/agent/process/reshard-agent" ] ||
   [ ! -x "$BUILD_DIR/services/coordinator/server/reshard-coordinator" ] ||
   [ ! -d "$BUILD_DIR/python/reshard" ]; then
  bash "$ROOT/scripts/build.sh"
else
  bash "$ROOT/scripts/bootstrap.sh"
fi
exec "$ROOT/.venv/bin/python" "$ROOT/bench/cluster/bench_cluster.py" --build "$BUILD_DIR" "$@"
