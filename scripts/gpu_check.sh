#!/usr/bin/env bash
# The device check of issue 23 (GPU-resident state), in two halves:
#
#   scripts/gpu_check.sh pack   here, on the CPU build machine: builds what the
#       check needs and puts it, stripped, with every shared library the GPU
#       machine lacks, PostgreSQL 15's server, UCX's transport modules and the
#       Python SDK (build/python, with a grpcio wheel matching its stubs) into
#       ONE ignored folder, .gpucheck/ (bundle.tar.xz + whl/), to be carried.
#   scripts/gpu_check.sh run    on the GPU machine (python3 with torch+CUDA, a
#       CUDA driver, no dev packages, no network): unpacks under /tmp/rs, starts
#       a real PostgreSQL + reshard-coordinator + reshard-agent and runs
#       bench/gpu_check/gpu_check.py: CUDA tensors published and loaded back
#       byte for byte, and GB/s against torch's own pinned copies. Output also
#       goes to $OUT/gpu_check.log when $OUT is set.
#
# With the device tool: run(command="scripts/gpu_check.sh run", carry=[".gpucheck"]).
# Under 8 minutes there. NCCL between two agents needs two GPUs: the check
# says so (its two-rank test skips on one), and runs it where there are two.
#
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PACK="$ROOT/.gpucheck"
BUILD="${RESHARD_BUILD_DIR:-$ROOT/build}"

pack() {
  local tests=(transfer_cuda_libraries_test transfer_cuda_device_test transfer_device_peer
               transfer_nccl_comm_test)
  local targets=(reshard-coordinator reshard-agent device_bench reshard_python "${tests[@]}")
  flock /tmp/reshard-build.lock cmake --build "$BUILD" --target "${targets[@]}" -j2 >/dev/null
  local stage
  stage="$(mktemp -d)"
  trap 'rm -rf "$stage"' RETURN
  local b="$stage/rs/build"
  mkdir -p "$b/services/coordinator/server" "$b/agent/process" "$b/tests" "$stage/rs/lib/ucx"
  install -s "$BUILD/services/coordinator/server/reshard-coordinator" "$b/services/coordinator/server/"
  install -s "$BUILD/agent/process/reshard-agent" "$b/agent/process/"
  for t in "${tests[@]}"; do install -s "$BUILD/tests/agent/transfer/$t" "$b/tests/"; done
  install -s "$BUILD/bench/transfer/device_bench" "$b/tests/"
  cp -r "$BUILD/python" "$b/python"
  find "$b/python" -name __pycache__ -prune -exec rm -rf {} +
  # Every library the binaries (and PostgreSQL) need, from this machine: the
  # GPU machine's own (another distribution) are left to it only for the C
  # runtime, libstdc++ and libssl, which it has in newer versions.
  local pg=/usr/lib/postgresql/15
  {
    for f in "$b"/services/coordinator/server/* "$b"/agent/process/* "$b"/tests/* \
             "$pg/bin/postgres" "$pg/bin/initdb" /usr/lib/x86_64-linux-gnu/ucx/*.so.0; do
      ldd "$f" | awk '$3 ~ /^\// {print $3}'
    done
  } | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux-x86-64|libssl|libcrypto|libz|libsystemd|libcap|libgcrypt|liblzma|libzstd|liblz4|libgpg-error|libnuma|libibverbs|librdmacm|libnl-3|libnl-route-3)\.so' \
    | while read -r lib; do cp -L "$lib" "$stage/rs/lib/"; done
  cp -L /usr/lib/x86_64-linux-gnu/ucx/*.so.0 "$stage/rs/lib/ucx/"
  strip --strip-unneeded "$stage"/rs/lib/*.so* "$stage"/rs/lib/ucx/*.so* 2>/dev/null || true
  mkdir -p "$stage/rs/pg/usr/lib/postgresql" "$stage/rs/pg/usr/share/postgresql"
  cp -r "$pg" "$stage/rs/pg/usr/lib/postgresql/"
  cp -r /usr/share/postgresql/15 "$stage/rs/pg/usr/share/postgresql/"
  rm -rf "$stage/rs/pg/usr/share/postgresql/15/man" "$stage/rs/pg/usr/lib/postgresql/15/lib/bitcode"
  mkdir -p "$PACK/whl"
  tar -C "$stage" -cJf "$PACK/bundle.tar.xz" rs
  local grpc
  grpc="$("$ROOT/.venv/bin/python" -c 'import grpc; print(grpc.__version__)')"
  if ! ls "$PACK"/whl/grpcio-"$grpc"-cp312-*.whl >/dev/null 2>&1; then
    # The stubs in build/python need grpcio >= the one that generated them.
    "$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      -d "$PACK/whl" "grpcio==$grpc"
  fi
  du -sh "$PACK"/bundle.tar.xz "$PACK"/whl
  echo "gpu_check: packed $PACK; carry it: run(command=\"scripts/gpu_check.sh run\", carry=[\".gpucheck\"])"
}

run() {
  local out="${OUT:-/tmp}"
  local rs=/tmp/rs
  exec > >(tee "$out/gpu_check.log") 2>&1
  echo "gpu_check: $(date -u +%FT%TZ) on $(hostname)"
  rm -rf "$rs" && tar -C /tmp -xJf "$PACK/bundle.tar.xz"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/rs/site "$PACK"/whl/*.whl
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  chmod 755 /tmp/rs /tmp/rs/pg
  local site
  site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  export LD_LIBRARY_PATH="$rs/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export UCX_MODULE_DIR="$rs/lib/ucx" UCX_NET_DEVICES=lo
  export RESHARD_PG_BINDIR="$rs/pg/usr/lib/postgresql/15/bin"
  export RESHARD_BUILD_DIR="$rs/build"
  export RESHARD_DEVICE_PEER_PATH="$rs/build/tests/transfer_device_peer"
  export PYTHONPATH="$rs/site:$rs/build/python:$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}"
  export RESHARD_CUDA_LIBRARY_PATH="$site/nvidia/cu13/lib:$site/nvidia/nccl/lib"
  export PYTHONUNBUFFERED=1
  # A second measurement with the agent's buffers on a tmpfs of huge pages
  # (pinning them costs less), where this machine lets root mount one.
  local extra=()
  mkdir -p /tmp/rs-huge
  if mount -t tmpfs -o huge=always,size=48G,mode=1777 tmpfs /tmp/rs-huge 2>/dev/null; then
    extra=(--huge-dir /tmp/rs-huge)
  else
    echo "gpu_check: no tmpfs with huge=always here: measuring /dev/shm only"
  fi
  cd "$ROOT"
  local rc=0
  timeout 450 python3 bench/gpu_check/gpu_check.py "${extra[@]}" "$@" || rc=$?
  if [ ${#extra[@]} -gt 0 ]; then umount /tmp/rs-huge || true; fi
  return $rc
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) echo "usage: scripts/gpu_check.sh pack | run [gpu_check.py flags]" >&2; exit 2 ;;
esac
