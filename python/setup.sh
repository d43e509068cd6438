#!/usr/bin/env bash
# The Python side of tent's CI: a virtual environment with what building
# and testing the module needs (maturin, pytest, numpy), pinned. Idempotent:
# it creates the venv and installs only what is missing or at another
# version. The Rust side (cargo, hwloc headers) is tools/setup.sh's.
#
#   TENT_PY_VENV  where the venv lives (default: target/py-venv in the repo)
#   PYTHON        the interpreter to make it from (default: python3, >= 3.11)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${TENT_PY_VENV:-$root/target/py-venv}"
python="${PYTHON:-python3}"

# Versions that exist for CPython 3.11 to 3.13 (wheels on PyPI).
pins=(maturin==1.16.0 pytest==8.3.5 numpy==2.2.6)

if [ ! -x "$venv/bin/python" ]; then
  "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "python/setup.sh: $python is $("$python" -V 2>&1); the module needs 3.11 or later (set PYTHON)" >&2
    exit 1
  }
  echo "python/setup.sh: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "$venv"
fi

missing=$("$venv/bin/python" - "${pins[@]}" <<'PY'
import sys
from importlib import metadata
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    try:
        if metadata.version(name) == version:
            continue
    except metadata.PackageNotFoundError:
        pass
    print(pin)
PY
)
if [ -n "$missing" ]; then
  echo "python/setup.sh: installing $(echo $missing)" >&2
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install --disable-pip-version-check -q $missing
fi
