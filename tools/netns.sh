#!/usr/bin/env bash
# Two network namespaces joined by N veth pairs (one per rail), for tests
# that must cross a real link. Addresses exist only inside the namespaces:
# rail i is 10.77.i.1/24 in NAME-a and 10.77.i.2/24 in NAME-b.
#
#   tools/netns.sh up NAME RAILS [RATE]   # RATE: per-rail tbf, e.g. 1gbit
#   tools/netns.sh down NAME              # idempotent
#   tools/netns.sh rail-down NAME I       # set rail I's link down (both ends)
#   tools/netns.sh check                  # can this machine do it? (exit 0/1)
set -euo pipefail
cmd=${1:-}
case "$cmd" in
  check)
    command -v ip >/dev/null && [ "$(id -u)" -eq 0 ] || exit 1
    probe="tentprobe$$"
    ip netns add "$probe" 2>/dev/null || exit 1
    ip netns del "$probe"
    ;;
  up)
    name=$2; rails=${3:-1}; rate=${4:-}
    [ "${#name}" -le 8 ] || { echo "netns.sh: name $name longer than 8 (interface names max 15)" >&2; exit 2; }
    # Torn down even when a step fails half-way.
    trap '"$0" down "$name" >/dev/null 2>&1 || true' ERR
    ip netns add "$name-a"
    ip netns add "$name-b"
    ip -n "$name-a" link set lo up
    ip -n "$name-b" link set lo up
    for i in $(seq 1 "$rails"); do
      a="${name}a$i"; b="${name}b$i"
      ip link add "$a" type veth peer name "$b"
      ip link set "$a" netns "$name-a"
      ip link set "$b" netns "$name-b"
      ip -n "$name-a" addr add "10.77.$i.1/24" dev "$a"
      ip -n "$name-b" addr add "10.77.$i.2/24" dev "$b"
      ip -n "$name-a" link set "$a" up
      ip -n "$name-b" link set "$b" up
      if [ -n "$rate" ]; then
        ip netns exec "$name-a" tc qdisc add dev "$a" root tbf rate "$rate" burst 256kb latency 50ms
        ip netns exec "$name-b" tc qdisc add dev "$b" root tbf rate "$rate" burst 256kb latency 50ms
      fi
    done
    ;;
  rail-down)
    name=$2; i=$3
    ip -n "$name-a" link set "${name}a$i" down
    ip -n "$name-b" link set "${name}b$i" down
    ;;
  down)
    name=$2
    ip netns del "$name-a" 2>/dev/null || true
    ip netns del "$name-b" 2>/dev/null || true
    ;;
  *)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
