#!/usr/bin/env bash
# README command one: installs what is missing and builds (build.sh), then runs
# the main job: a throwaway local cluster (PostgreSQL, reshard-coordinator,
# five reshard-agents) and a training-like job whose state is resharded through
# a DP grow, a TP/PP change, a migration and a host loss, verified byte for byte
# after each step (deploy/local/main_job.py). Extra arguments go to main_job.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

"$ROOT/scripts/build.sh"
export UCX_NET_DEVICES=lo UCX_TLS=tcp
exec "$ROOT/.venv/bin/python" "$ROOT/deploy/local/main_job.py" --build "$ROOT/build" "$@"
