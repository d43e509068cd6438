#!/usr/bin/env bash
# Build the Python module into the venv python/setup.sh makes, and run its
# tests. From the repository root or anywhere:
#
#   python/test.sh [pytest args...]
#
#   TENT_PY_VENV         the venv (default: target/py-venv)
#   TENT_PY_TARGET_DIR   cargo's target directory for the module (default:
#                        target/python; apart from the workspace's own so
#                        the two builds neither lock nor invalidate each other)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/python/setup.sh"
venv="${TENT_PY_VENV:-$root/target/py-venv}"
export CARGO_TARGET_DIR="${TENT_PY_TARGET_DIR:-$root/target/python}"
# maturin (the build backend, run by pip) is found on PATH.
export PATH="$venv/bin:$PATH"
cd "$root"
# `pip install ./python`, as a user would; without build isolation, so the
# pinned maturin in the venv builds it and nothing is fetched per run.
pip install --disable-pip-version-check --no-build-isolation -q ./python
# The installed module, not python/tent from the sources (pytest's own
# executable does not put the working directory on sys.path).
# Bounded: a test that hangs dumps every thread's stack after 120 s
# (faulthandler) and the run ends after 15 minutes instead of never.
timeout --kill-after=10 900 "$venv/bin/pytest" -q -o faulthandler_timeout=120 python/tests "$@"
