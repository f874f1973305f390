#!/usr/bin/env bash
# Sets up what reshard needs, idempotent and non-interactive; used by both README
# commands and by CI:
#  1. the Debian packages (C++ toolchain and libraries, PostgreSQL, protoc,
#     python3-venv), only those that are missing;
#  2. the project's Python environment <repo>/.venv, from the exact pins in
#     requirements/python.txt (torch 2, numpy, grpcio, ...). Nothing is
#     installed into the system Python;
#  3. the project itself in that venv, as an editable install would: a .pth
#     file puts the package staged by the build (<repo>/build/python) on the
#     venv's path, and .venv/bin gets the console script `reshard` (`reshard
#     run`, the launcher) and a link `reshardctl` to build/client/cli/
#     reshardctl, so `.venv/bin/python -c "import reshard"`, `reshard run` and
#     `reshardctl` work once the build is done (after `. .venv/bin/activate`,
#     by their names). Written every run (cheap), so a new build needs nothing.
# A venv that already matches the requirements (a stamp holds the hash of the
# requirements file and the base interpreter) is left alone, so re-runs take
# well under a second. Otherwise the venv is made anew, from wheels kept in
# RESHARD_WHEELHOUSE (default ~/.cache/reshard/wheels): the ones missing there
# are downloaded from the package index first (pip's own HTTP cache cannot be
# relied on to keep them), so a second clone on the same machine installs
# offline.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

PACKAGES=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libucx-dev ucx-utils libpqxx-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libxxhash-dev libssl-dev
  openssl postgresql prometheus nginx-light sshfs openssh-sftp-server python3 python3-venv
  util-linux  # setpriv: the local cluster starts its processes through it
  stress-ng   # bench/load: the product beside CPU, memory and thread-churn hogs
  slurm-wlm munge  # deploy/slurm: a real Slurm driving reshard (docs/slurm.md)
)

install_debian_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "bootstrap: all ${#PACKAGES[@]} Debian packages present"
    return
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then sudo="sudo"; else
      echo "bootstrap: missing packages ${missing[*]} and not root (no sudo)" >&2
      exit 1
    fi
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The base interpreter is Debian's (python3-venv gives it ensurepip); a pyenv or
# conda python3 earlier on PATH is not used.
BASE_PYTHON=/usr/bin/python3
VENV="$ROOT/.venv"
REQUIREMENTS="$ROOT/requirements/python.txt"
STAMP="$VENV/.requirements.sha256"
WHEELHOUSE="${RESHARD_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/reshard/wheels}"
PIP_FLAGS=(--no-deps --only-binary=:all: --no-input --disable-pip-version-check --progress-bar off)

requirements_hash() {
  { cat "$REQUIREMENTS"; "$BASE_PYTHON" -c 'import sys; print(sys.version)'; } |
    sha256sum | cut -d' ' -f1
}

# Installs the pinned wheels into $1 (a new venv) from the wheelhouse, fetching
# the missing ones first. --no-deps: the file lists the whole closure.
install_requirements() {
  local python="$1"
  mkdir -p "$WHEELHOUSE"
  if ! "$python" -m pip install -q "${PIP_FLAGS[@]}" --no-index --find-links "$WHEELHOUSE" \
      -r "$REQUIREMENTS" 2>/dev/null; then
    echo "bootstrap: downloading wheels into $WHEELHOUSE"
    # One download at a time into a shared wheelhouse (several clones may bootstrap at once).
    (
      flock 8
      "$python" -m pip download -q "${PIP_FLAGS[@]}" -d "$WHEELHOUSE" -r "$REQUIREMENTS"
    ) 8>"$WHEELHOUSE/.lock"
    "$python" -m pip install -q "${PIP_FLAGS[@]}" --no-index --find-links "$WHEELHOUSE" \
      -r "$REQUIREMENTS"
  fi
  "$python" -m pip check
}

setup_venv() {
  local want
  want="$(requirements_hash)"
  if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
    echo "bootstrap: $VENV matches requirements/python.txt"
    return
  fi
  local start=$SECONDS
  echo "bootstrap: creating $VENV from requirements/python.txt"
  # Made anew rather than upgraded in place, so nothing outside the pins survives.
  rm -rf "$VENV"
  "$BASE_PYTHON" -m venv "$VENV"
  install_requirements "$VENV/bin/python"
  echo "$want" >"$STAMP"
  echo "bootstrap: $VENV ready ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), $((SECONDS - start)) s)"
}

# Step 3: the staged package and its commands in the venv (see the head).
# Only files that differ are written, so a re-run changes nothing.
install_project() {
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  write_if_changed "$site/reshard-build.pth" "$ROOT/build/python"
  write_if_changed "$VENV/bin/reshard" "#!$VENV/bin/python
# reshard's console script (client/python/pyproject.toml), made by scripts/bootstrap.sh.
import sys

from reshard.launcher.launch import main

sys.exit(main())"
  chmod 755 "$VENV/bin/reshard"
  ln -sfn "$ROOT/build/client/cli/reshardctl" "$VENV/bin/reshardctl"
}

write_if_changed() {
  if [ "$(cat "$1" 2>/dev/null)" != "$2" ]; then
    printf '%s\n' "$2" >"$1.tmp.$$"
    mv "$1.tmp.$$" "$1"
  fi
}

install_debian_packages
# Two bootstraps of one checkout at once (say build.sh and bench_cluster.sh)
# must not build the same venv together: hold a lock on the requirements file.
exec 9<"$REQUIREMENTS"
flock 9
setup_venv
install_project
