#!/usr/bin/env bash
# Installs what tent needs on a fresh Debian 12 machine, only when missing.
# Idempotent: a second run does nothing but check.
set -euo pipefail

# Debian packages: hwloc + udev headers for hwlocality (NUMA/core topology),
# pkg-config to find them, linux-perf for tools/profile.sh; rdma-core's
# verbs headers and libclang for build.rs (bindgen; nothing links against
# libibverbs: it is dlopened at run time), iproute2 for the netns tests.
# The Soft-RoCE guest (tools/rxe-vm.sh, run by the real-verbs tests): qemu,
# busybox, cpio, the rxe provider and verbs utilities; it fetches Debian's
# kernel package itself on first use.
# python3 + python3-venv for the Python module's venv (python/setup.sh).
# etcd-server for the etcd tests (the client's, tests/etcd_metadata.rs,
# tests/peer_restart.rs), which start their own etcd on free loopback
# ports; only the binary is used. openssl makes the TLS test's CA and
# certificates.
pkgs=(pkg-config libhwloc-dev libudev-dev linux-perf libibverbs-dev libclang-dev iproute2
  qemu-system-x86 busybox-static cpio rdma-core ibverbs-providers ibverbs-utils binutils
  python3 python3-venv etcd-server openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "tools/setup.sh: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # The package enables and starts a system etcd on 2379 where systemd
  # runs (a container's policy-rc.d usually blocks it); the tests start
  # their own, so stop it and keep it from starting at boot.
  if [[ " ${missing[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now etcd.service >/dev/null 2>&1 || true
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "tools/setup.sh: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi
for c in rustfmt clippy; do
  if ! rustup component list --installed 2>/dev/null | grep -q "^$c"; then
    rustup component add "$c" >/dev/null 2>&1 || true
  fi
done

# Nightly with Miri for .ci/run's Miri pass over tent-rings.
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "tools/setup.sh: installing the nightly toolchain (for Miri)" >&2
  rustup toolchain install nightly --profile minimal
fi
if ! rustup +nightly component list --installed 2>/dev/null | grep -q '^miri'; then
  echo "tools/setup.sh: installing miri and rust-src on nightly" >&2
  rustup +nightly component add miri rust-src
fi

# The Python module's venv (maturin, pytest, numpy, pinned): used by
# python/test.sh, which tests/python_module.rs runs.
"$(dirname "$0")/../python/setup.sh"
