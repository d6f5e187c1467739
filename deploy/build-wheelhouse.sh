#!/usr/bin/env bash
# Collect wheels for every dependency of privet (and the build backend), so that
# `docker build` can install them with `pip install --no-index --find-links`: for
# air-gapped sites and for CI.
#
#   deploy/build-wheelhouse.sh [DIR]     (default DIR: .wheelhouse at the repo root,
#                                          which the Dockerfile picks up; git-ignored)
#
# Run it on a Linux x86_64 machine with Python 3.11 (the image's Python) and pip access to
# an index (or a pip cache). Wheels already in DIR are reused.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-$ROOT/.wheelhouse}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first and pinned: the CPU build (pip takes a local file where the machine has one);
# a plain `torch` would pull a multi-GB CUDA build.
"$PY" -m pip download --quiet --dest "$DIR" --find-links "$DIR" "torch==2.13.0"
# everything else the project needs, as wheels (sdists are built into wheels here)
# at the exact versions tested here (constraints.txt; pyproject.toml only states ranges)
"$PY" -m pip wheel --quiet --wheel-dir "$DIR" --find-links "$DIR" -c "$ROOT/constraints.txt" "$ROOT" hatchling
rm -f "$DIR"/privet-*.whl   # the image builds privet from its own source
echo "wheelhouse $DIR: $(ls "$DIR" | wc -l) files, $(du -sh "$DIR" | cut -f1)"
