#!/bin/sh
# /init of the Soft-RoCE guest built by tools/rxe-vm.sh (busybox sh, PID 1).
# It sets up N rails (rxe0..rxe{N-1} on dummy0..dummy{N-1}), runs the test
# binaries listed in /rxe/runs.sh one after another and powers off.
# The host harness decides pass/fail from the markers printed here:
#   RXE-SETUP-FAILED <why>   the rails could not be brought up (nothing ran)
#   RXE-RUN <name>           a binary starts
#   RXE-EXIT <name> <code>   it ended with that exit status
#   RXE-DONE                 every binary has run
# Never let this script exit: PID 1 exiting panics the kernel.

export PATH=/usr/bin:/usr/sbin:/bin:/sbin
export HOME=/root
. /rxe/config   # RAILS=<n>

fail() {
    echo "RXE-SETUP-FAILED $*"
    poweroff -f
    sleep 60
}

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm /dev/pts /tmp
# Tests map files in /dev/shm and write to /tmp (std::env::temp_dir).
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t devpts devpts /dev/pts 2>/dev/null

# Order matters: crc32_generic first, or `rdma link add` fails with ENOENT
# (rdma_rxe needs the crc32 shash for the ICRC).
for m in crc32_generic ib_core ib_uverbs udp_tunnel ip6_udp_tunnel rdma_rxe; do
    insmod "/mods/$m.ko" || fail "insmod $m"
done
insmod /mods/dummy.ko numdummies="$RAILS" || fail "insmod dummy numdummies=$RAILS"

ip link set lo up
i=0
while [ "$i" -lt "$RAILS" ]; do
    # IPv4 too: tests may run TCP (control plane) over the rails.
    ip addr add "10.88.$i.1/24" dev "dummy$i" || fail "ip addr dummy$i"
    ip link set "dummy$i" up || fail "link up dummy$i"
    i=$((i + 1))
done

# The rxe GID table is filled from the netdev's addresses: wait (up to ~5 s)
# for each dummy's IPv6 link-local address instead of a blind sleep.
# /proc/net/if_inet6 columns: addr ifindex plen scope flags name; scope 20 is
# link-local, flag 0x40 is "tentative" (hex digit before last in 4567cdef).
has_ll() {
    awk -v dev="$1" '$6 == dev && $4 == "20" && !index("4567cdef", substr($5, length($5) - 1, 1)) { ok = 1 }
                     END { exit !ok }' /proc/net/if_inet6
}
i=0
while [ "$i" -lt "$RAILS" ]; do
    t=0
    until has_ll "dummy$i"; do
        t=$((t + 1))
        [ "$t" -le 50 ] || fail "no IPv6 link-local address on dummy$i after 5 s"
        usleep 100000
    done
    i=$((i + 1))
done

i=0
while [ "$i" -lt "$RAILS" ]; do
    rdma link add "rxe$i" type rxe netdev "dummy$i" || fail "rdma link add rxe$i"
    i=$((i + 1))
done

# Wait (up to ~5 s) for every port to be ACTIVE with a GID 0.
i=0
while [ "$i" -lt "$RAILS" ]; do
    p=/sys/class/infiniband/rxe$i/ports/1
    t=0
    until grep -q ACTIVE "$p/state" 2>/dev/null &&
          ! grep -q '^0000:0000:0000:0000:0000:0000:0000:0000$' "$p/gids/0" 2>/dev/null; do
        t=$((t + 1))
        [ "$t" -le 50 ] || fail "rxe$i port not ACTIVE with a GID after 5 s"
        usleep 100000
    done
    i=$((i + 1))
done

echo "rxe-vm guest: kernel $(uname -r), $(nproc) cpus, $(awk '/MemTotal/{print int($2/1024) " MiB"}' /proc/meminfo)"
rdma link show
ibv_devinfo | grep -E 'hca_id|state|active_mtu|link_layer'
i=0
while [ "$i" -lt "$RAILS" ]; do
    echo "rxe$i gid0 $(cat /sys/class/infiniband/rxe$i/ports/1/gids/0)"
    i=$((i + 1))
done

# run NAME BINARY [ARGS...]: the leading newline keeps the marker at the
# start of a line even when the binary's output did not end with one.
run() {
    name=$1
    shift
    echo "RXE-RUN $name"
    (cd /tmp && TENT_RXE_GUEST=1 TENT_RXE_RAILS="$RAILS" RUST_BACKTRACE=1 "$@")
    code=$?
    echo
    echo "RXE-EXIT $name $code"
}
. /rxe/runs.sh

echo "RXE-DONE"
sync
poweroff -f
sleep 60
