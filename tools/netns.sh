#!/usr/bin/env bash
# Two network namespaces joined by N veth pairs (one per rail), for tests
# that must cross a real link. Addresses exist only inside the namespaces:
# rail i is 10.77.i.1/24 in NAME-a and 10.77.i.2/24 in NAME-b.
#
#   tools/netns.sh up NAME RAILS [RATES]  # RATES: tbf rate of every rail (1gbit),
#                                         # or one per rail (1gbit,200mbit)
#   tools/netns.sh shape NAME I RATE      # set rail I's tbf to RATE (both ends)
#   tools/netns.sh rate-bits RATE         # RATE (tc's units) in bit/s
#   tools/netns.sh down NAME              # idempotent
#   tools/netns.sh rail-down NAME I       # set rail I's link down (both ends)
#   tools/netns.sh mute NAME I            # rail I's NAME-b end sends nothing (link up)
#   tools/netns.sh check                  # can this machine do it? (exit 0/1)
set -euo pipefail
cmd=${1:-}

# shape NAME I RATE: rail I's egress at both ends through tbf at RATE. The
# burst holds a 64 KiB GSO packet with room to spare (veth sends those) and
# is at least 2 ms at RATE, so high rates are not capped by timer slack;
# the queue holds 50 ms at RATE. `replace` adds the qdisc or, when rail I
# has one, changes it in place (a mid-run cut keeps the queued packets).
shape() {
  local name=$1 i=$2 rate=$3 bits burst
  bits=$(rate_bits "$rate") || { echo "netns.sh: bad rate $rate (use e.g. 100mbit, 1gbit)" >&2; exit 2; }
  burst=$((bits / 8 / 500))
  [ "$burst" -ge 262144 ] || burst=262144
  ip netns exec "$name-a" tc qdisc replace dev "${name}a$i" root tbf rate "$rate" burst "$burst" latency 50ms
  ip netns exec "$name-b" tc qdisc replace dev "${name}b$i" root tbf rate "$rate" burst "$burst" latency 50ms
}

# rate_bits RATE: tc's rate (number and unit, bit or bps, SI or IEC) in bit/s.
rate_bits() {
  local r=${1,,} num unit mul
  [[ $r =~ ^([0-9]+)([kmgt]?i?)(bit|bps)$ ]] || return 1
  num=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case "$unit" in
    '') mul=1 ;; k) mul=1000 ;; m) mul=1000000 ;; g) mul=1000000000 ;; t) mul=1000000000000 ;;
    ki) mul=1024 ;; mi) mul=1048576 ;; gi) mul=1073741824 ;; ti) mul=1099511627776 ;;
  esac
  [ "${BASH_REMATCH[3]}" = bps ] && mul=$((mul * 8))
  echo $((num * mul))
}

case "$cmd" in
  check)
    command -v ip >/dev/null && [ "$(id -u)" -eq 0 ] || exit 1
    probe="tentprobe$$"
    ip netns add "$probe" 2>/dev/null || exit 1
    ip netns del "$probe"
    ;;
  up)
    name=$2; rails=${3:-1}; rates=${4:-}
    [ "${#name}" -le 8 ] || { echo "netns.sh: name $name longer than 8 (interface names max 15)" >&2; exit 2; }
    IFS=, read -r -a rate <<<"$rates"
    case "${#rate[@]}" in
      0|1|"$rails") ;;
      *) echo "netns.sh: ${#rate[@]} rates for $rails rails" >&2; exit 2 ;;
    esac
    for r in "${rate[@]}"; do
      rate_bits "$r" >/dev/null || { echo "netns.sh: bad rate $r (use e.g. 100mbit, 1gbit)" >&2; exit 2; }
    done
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
      case "${#rate[@]}" in
        0) ;;
        1) shape "$name" "$i" "${rate[0]}" ;;
        *) shape "$name" "$i" "${rate[$((i - 1))]}" ;;
      esac
    done
    ;;
  shape)
    shape "$2" "$3" "$4"
    ;;
  rate-bits)
    rate_bits "$2" || { echo "netns.sh: bad rate $2 (use e.g. 100mbit, 1gbit)" >&2; exit 2; }
    ;;
  mute)
    # Every packet NAME-b sends on rail I is dropped while both links stay
    # up: a peer that has gone silent (a connect to it hangs in SYN_SENT).
    # A tbf whose burst is smaller than any packet drops each one (this
    # kernel has no tc classifier, action or netem to do it otherwise).
    # NAME-a knows b's address for good beforehand (b's ARP replies are
    # dropped too), so a's SYNs do go out and hang unanswered.
    name=$2; i=$3
    mac=$(ip -n "$name-b" -o link show "${name}b$i" | grep -o 'link/ether [0-9a-f:]*' | cut -d' ' -f2)
    ip -n "$name-a" neigh replace "10.77.$i.2" lladdr "$mac" dev "${name}a$i" nud permanent
    ip netns exec "$name-b" tc qdisc replace dev "${name}b$i" root tbf rate 1mbit burst 10 latency 1ms
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
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
