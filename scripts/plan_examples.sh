#!/usr/bin/env bash
# Offline planning of every example target (examples/index.json) with
# `reshardctl plan`: prints each summary, including the recovery after a lost
# host, and ends with the one example that must be refused (lost state with no
# surviving replica). Exits non-zero if any plan fails, or if the refused one is
# not refused. Builds first (build.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="$ROOT/.venv/bin/python"  # the project venv (bootstrap.sh, run by build.sh)

"$ROOT/scripts/build.sh"

cd "$ROOT"
RESHARDCTL=build/client/cli/reshardctl
failed=0
while IFS=$'\x1f' read -r job target lost what; do
  args=(plan --spec "examples/$job" --to "examples/$target")
  [ -n "$lost" ] && args+=(--lost "$lost")
  echo
  echo "=== $what"
  echo "\$ reshardctl ${args[*]}"
  if ! "$RESHARDCTL" "${args[@]}"; then
    echo "main: planning examples/$target failed" >&2
    failed=1
  fi
done < <("$PYTHON" -c '
import json, sys
for e in json.load(open(sys.argv[1]))["examples"]:
    print("\x1f".join([e["job"], e["target"], e["lost"], e["what"]]))
' examples/index.json)

echo
echo "=== dgx-1 of the Llama job is lost: its pipeline stage and optimizer shards"
echo "=== have no replica, so this must be refused (FAILED_PRECONDITION)"
args=(plan --spec examples/llama3-8b/job.json --to examples/llama3-8b/to-new-hosts.json
      --lost dgx-1)
echo "\$ reshardctl ${args[*]}"
set +e
err="$("$RESHARDCTL" "${args[@]}" 2>&1 >/dev/null)"
rc=$?
set -e
if [ "${#err}" -gt 1500 ]; then
  printf '%s ...\n[exit status %d; error message of %d characters cut to 1500]\n' \
    "${err:0:1500}" "$rc" "${#err}"
else
  printf '%s\n[exit status %d]\n' "$err" "$rc"
fi
if [ "$rc" -ne 1 ] || [[ "$err" != FAILED_PRECONDITION:* ]]; then
  echo "main: expected exit status 1 and FAILED_PRECONDITION for the lost Llama host" >&2
  failed=1
fi

echo
if [ "$failed" -ne 0 ]; then
  echo "main: some examples failed" >&2
  exit 1
fi
echo "main: every example planned; bytes crossing hosts shown against their lower bound"
