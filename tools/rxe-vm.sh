#!/usr/bin/env bash
# Run real-verbs test binaries inside a small QEMU guest with Soft-RoCE.
#
# The host kernel has no RDMA support, so the binaries run in ONE boot of
# Debian's stock kernel under QEMU/TCG (KVM hangs here: no nested virt).
# The guest loads rdma_rxe on dummy netdevs: rail i is rxe<i> on dummy<i>
# (IPv4 10.88.<i>.1/24). Each binary runs with TENT_RXE_GUEST=1 and
# TENT_RXE_RAILS=<rails>. Pass/fail comes only from the binaries' own exit
# codes, reported by the guest's /init (tools/rxe-vm/init.sh), never from
# the boot alone.
#
#   tools/rxe-vm.sh [--rails N] [--timeout S] [--mem MIB] [--no-strip] [--tool PATH]... BINARY[::ARGS]...
#   tools/rxe-vm.sh --check     # qemu + kernel package available? (exit 0/1, no boot)
#
# --tool copies a host program (and its libraries) into the guest's PATH,
# e.g. --tool /usr/bin/strace (readelf is always copied when the host has it).
# ARGS are split on whitespace (no quoting), e.g.
#   tools/rxe-vm.sh --rails 2 'target/debug/deps/rxe_verbs-abc123::--test-threads=1 --nocapture'
#
# Output: the guest console streams to stdout (and to $TENT_RXE_LOG, default
# <cache>/last-run.log), then one line per binary
#   rxe-vm: <name>: exit <code>, <N> passed
# and `rxe-vm: total passed: N`. Exit 0 only if every binary exited 0 and the
# guest reached RXE-DONE; otherwise `rxe-vm: FAIL: <reason>` and exit 1
# (2 for usage errors).
#
# Cache: ${TENT_RXE_CACHE:-$HOME/.cache/tent/rxe-vm} holds the unpacked
# kernel package (fetched once with apt-get download).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${TENT_RXE_CACHE:-$HOME/.cache/tent/rxe-vm}
RAILS=2
TIMEOUT=600
MEM=
STRIP=1
CHECK=0
RUNS=()
TOOLS=()

die() { echo "rxe-vm: FAIL: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --rails) RAILS=${2:?}; shift 2 ;;
        --timeout) TIMEOUT=${2:?}; shift 2 ;;
        --mem) MEM=${2:?}; shift 2 ;;
        --no-strip) STRIP=0; shift ;;
        --tool) TOOLS+=("${2:?}"); shift 2 ;;
        --check) CHECK=1; shift ;;
        -h|--help) usage ;;
        --) shift; RUNS+=("$@"); break ;;
        -*) echo "rxe-vm: unknown option $1" >&2; usage ;;
        *) RUNS+=("$1"); shift ;;
    esac
done
[[ "$RAILS" =~ ^[1-9][0-9]*$ ]] || { echo "rxe-vm: --rails must be >= 1" >&2; exit 2; }
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "rxe-vm: --timeout must be seconds" >&2; exit 2; }

# The kernel package the distribution currently points at, e.g.
# linux-image-6.1.0-56-amd64 (the cache is keyed by it, so a kernel update
# fetches the new one).
kernel_pkg() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}
# An already unpacked kernel in the cache (any version), newest first.
cached_kroot() {
    local d
    for d in $(ls -d "$CACHE"/linux-image-*/root 2>/dev/null | sort -rV); do
        [ -f "$d/../complete" ] && { echo "$d"; return 0; }
    done
    return 1
}

if [ "$CHECK" = 1 ]; then
    # Cheap: no installs, no downloads, no boot.
    command -v qemu-system-x86_64 >/dev/null || { echo "rxe-vm: qemu-system-x86_64 missing (apt-get install qemu-system-x86)"; exit 1; }
    if k=$(cached_kroot); then
        echo "rxe-vm: ok (qemu present, kernel cached at $k)"
    elif p=$(kernel_pkg) && [ -n "$p" ] && apt-cache show "$p" >/dev/null 2>&1; then
        echo "rxe-vm: ok (qemu present, kernel package $p available to apt-get download)"
    else
        echo "rxe-vm: no kernel package (apt-cache depends linux-image-amd64 names none)"
        exit 1
    fi
    exit 0
fi

[ ${#RUNS[@]} -gt 0 ] || usage

# ---------------------------------------------------------------- packages
# /usr/bin/rdma is in iproute2 on Debian 12; librxe-rdmav34.so and
# rxe.driver in ibverbs-providers; libibverbs.so.1 in libibverbs1 (a
# dependency of those).
need=()
for p in qemu-system-x86 busybox-static cpio rdma-core ibverbs-providers ibverbs-utils iproute2; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "rxe-vm: installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null ||
        { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; } ||
        die "apt-get install ${need[*]}"
fi

# Temp dir for the initramfs tree; removed on any exit.
WORK=$(mktemp -d /tmp/rxe-vm.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

# ------------------------------------------------------------------ kernel
mkdir -p "$CACHE"
PKG=$(kernel_pkg || true)
if [ -n "$PKG" ] && [ -f "$CACHE/$PKG/complete" ]; then
    KROOT=$CACHE/$PKG/root
elif [ -n "$PKG" ]; then
    echo "rxe-vm: fetching $PKG into $CACHE (once)"
    # Unpack into a temp dir and rename, so an interrupted fetch leaves no
    # half-unpacked kernel that looks complete.
    tmpk=$(mktemp -d "$CACHE/.fetch.XXXXXX")
    (cd "$tmpk" && apt-get download "$PKG" >/dev/null 2>&1) ||
        { rm -rf "$tmpk"; die "apt-get download $PKG"; }
    dpkg-deb -x "$tmpk"/"$PKG"_*.deb "$tmpk/root" || { rm -rf "$tmpk"; die "dpkg-deb -x $PKG"; }
    rm -f "$tmpk"/*.deb
    touch "$tmpk/complete"
    # Another run may have finished the same fetch meanwhile: keep its copy.
    if [ -f "$CACHE/$PKG/complete" ]; then rm -rf "$tmpk"
    else rm -rf "${CACHE:?}/$PKG"; mv "$tmpk" "$CACHE/$PKG"; fi
    KROOT=$CACHE/$PKG/root
else
    # apt metadata unavailable: fall back to whatever was fetched before.
    KROOT=$(cached_kroot) || die "no kernel package: apt-cache depends linux-image-amd64 names none and none is cached"
fi
KVER=$(ls "$KROOT/lib/modules" | head -1)
VMLINUZ=$KROOT/boot/vmlinuz-$KVER
[ -f "$VMLINUZ" ] || die "no $VMLINUZ"

# --------------------------------------------------------------- initramfs
# Usr-merged layout (bin, sbin, lib, lib64 -> usr/...), like the host, so
# every path ldd prints (/lib/..., /usr/lib/..., /lib64/ld-linux...) exists.
R=$WORK/root
mkdir -p "$R"/usr/{bin,sbin,lib/x86_64-linux-gnu/libibverbs,lib64} "$R"/{proc,sys,dev,tmp,root,mods,tests,rxe,etc/libibverbs.d}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$R/$d"; done

cp /bin/busybox "$R/usr/bin/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$R/usr/bin/$a"; done

# copy_lib FILE: FILE (symlinks resolved) under its own path in the tree.
copy_lib() {
    local dst=$R$1
    [ -e "$dst" ] && return 0
    mkdir -p "$(dirname "$dst")"
    cp -L "$1" "$dst"
}
# copy_deps FILE: every shared library `ldd FILE` names, and the loader.
copy_deps() {
    local l
    for l in $(ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
        copy_lib "$l"
    done
}
# copy_tool PATH: a host tool into /usr/bin, replacing busybox's applet
# link (rm first: cp onto the symlink would overwrite busybox itself).
copy_tool() {
    rm -f "$R/usr/bin/$(basename "$1")"
    cp -L "$1" "$R/usr/bin/"
    copy_deps "$1"
}
copy_tool /usr/bin/rdma
copy_tool /usr/bin/ibv_devinfo
copy_tool /usr/bin/ip    # full iproute2 ip (tests may use `ip -j`, link down, ...)
# readelf: tests/verbs_loading.rs checks the binary's NEEDED entries with it.
if command -v readelf >/dev/null; then copy_tool "$(command -v readelf)"; fi
for t in ${TOOLS[@]+"${TOOLS[@]}"}; do
    [ -x "$t" ] || t=$(command -v "$t") || die "--tool: no such program"
    copy_tool "$t"
done

# Our binaries dlopen libibverbs.so.1 at run time (no NEEDED entry), so ldd
# of them does not show it: copy it, its provider and their deps explicitly.
for l in /usr/lib/x86_64-linux-gnu/libibverbs.so.1* /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so; do
    copy_lib "$l"
    copy_deps "$l"
done
cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
copy_lib /lib64/ld-linux-x86-64.so.2
# Name resolution of "localhost" without DNS (glibc's files backend is in libc).
printf '127.0.0.1 localhost\n::1 localhost\n' > "$R/etc/hosts"
printf 'hosts: files\n' > "$R/etc/nsswitch.conf"
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$R/etc/passwd"

# Modules in load order (see init.sh); Debian 6.1 ships them as plain .ko,
# newer kernels compress them: decompress here, busybox insmod cannot.
for m in crypto/crc32_generic drivers/infiniband/core/ib_core drivers/infiniband/core/ib_uverbs \
         net/ipv4/udp_tunnel net/ipv6/ip6_udp_tunnel drivers/infiniband/sw/rxe/rdma_rxe drivers/net/dummy; do
    src=$KROOT/lib/modules/$KVER/kernel/$m.ko
    out=$R/mods/$(basename "$m").ko
    if [ -f "$src" ]; then cp "$src" "$out"
    elif [ -f "$src.xz" ]; then xz -dc "$src.xz" > "$out"
    elif [ -f "$src.zst" ]; then zstd -qdc "$src.zst" > "$out"
    else die "module $m not in $KROOT ($KVER)"; fi
done

# Test binaries: /tests/<name>. Debug info is stripped (a debug test binary
# is mostly DWARF; the symbol table stays, so backtraces keep names).
# The same binary may be listed twice (different args): later names get #2...
NAMES=()
sq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }   # single-quote for sh
: > "$R/rxe/runs.sh"
declare -A seen=()
for spec in "${RUNS[@]}"; do
    bin=${spec%%::*}
    args=
    [[ "$spec" == *::* ]] && args=${spec#*::}
    if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then die "not an executable file: $bin"; fi
    base=$(basename "$bin")
    name=$base
    n=${seen[$base]:-0}; n=$((n + 1)); seen[$base]=$n
    [ "$n" -gt 1 ] && name="$base#$n"
    NAMES+=("$name")
    if [ ! -e "$R/tests/$base" ]; then
        # (objcopy refuses non-ELF files such as scripts: copied as they are)
        if [ "$STRIP" = 0 ] || ! objcopy --strip-debug "$bin" "$R/tests/$base" 2>/dev/null; then
            cp "$bin" "$R/tests/$base"
        fi
        copy_deps "$bin"
    fi
    line="run $(sq "$name") $(sq "/tests/$base")"
    read -ra argv <<< "$args"
    for a in ${argv[@]+"${argv[@]}"}; do line+=" $(sq "$a")"; done
    echo "$line" >> "$R/rxe/runs.sh"
done
echo "RAILS=$RAILS" > "$R/rxe/config"
cp "$HERE/rxe-vm/init.sh" "$R/init"
chmod +x "$R/init"

# Uncompressed cpio: decompressing in the guest under TCG costs more than
# the kernel copying the bytes.
INITRD=$WORK/initrd.cpio
(cd "$R" && find . | cpio -o -H newc --quiet) > "$INITRD"
size_mib=$(( $(stat -c %s "$INITRD") / 1048576 + 1 ))
# The initramfs lives in guest RAM twice while it is unpacked (cpio image +
# rootfs files): leave room for that plus the tests themselves.
[ -n "$MEM" ] || MEM=$(( 1024 + 2 * size_mib ))
echo "rxe-vm: kernel $KVER, initramfs ${size_mib} MiB, guest ${MEM} MiB, ${RAILS} rail(s), ${#NAMES[@]} binary(ies), timeout ${TIMEOUT}s"

# -------------------------------------------------------------------- boot
# The verdict is read from this run's own copy of the console ($CONSOLE);
# $LOG is only a copy kept for people, so concurrent runs cannot mix.
CONSOLE=$WORK/console.log
LOG=${TENT_RXE_LOG:-$CACHE/last-run.log}
mkdir -p "$(dirname "$LOG")"
start=$(date +%s)
set +e
# panic=-1 + -no-reboot: a guest panic ends qemu instead of hanging until
# the timeout. stdin is /dev/null: nothing may type into the console.
# The console's CRs and SeaBIOS's terminal resets are dropped from the stream.
timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -m "$MEM" -smp 2 \
    -kernel "$VMLINUZ" -initrd "$INITRD" \
    -append "console=ttyS0 quiet panic=-1" \
    -nographic -no-reboot -nic none < /dev/null 2>&1 |
    tr -d '\r' | sed -u -e 's/\x1bc//g; s/\x1b\[[0-9;?]*[A-Za-z]//g' | tee "$CONSOLE"
rc=${PIPESTATUS[0]}
set -e
elapsed=$(( $(date +%s) - start ))
cp "$CONSOLE" "$LOG" || true
echo "rxe-vm: guest ran ${elapsed}s (qemu exit $rc), log: $LOG"

# ----------------------------------------------------------------- verdict
# Per binary: its exit code from RXE-EXIT and the sum of libtest's
# "test result: ok. N passed" lines between its RXE-RUN and RXE-EXIT.
total=0
reason=
for name in "${NAMES[@]}"; do
    read -r code passed < <(awk -v name="$name" '
        $1 == "RXE-RUN" && $2 == name { on = 1; next }
        on && $1 == "RXE-EXIT" && $2 == name { code = $3; on = 0 }
        on && /^test result: ok\. [0-9]+ passed/ { passed += $4 }
        END { print (code == "" ? "none" : code), passed + 0 }' "$CONSOLE")
    echo "rxe-vm: $name: exit $code, $passed passed"
    total=$((total + passed))
    if [ -z "$reason" ] && [ "$code" != 0 ]; then
        if [ "$code" = none ]; then
            grep -qxF "RXE-RUN $name" "$CONSOLE" && reason="$name did not finish" || reason="$name never started"
        else
            reason="$name exited $code"
        fi
    fi
done
echo "rxe-vm: total passed: $total"

if setup=$(grep -m1 '^RXE-SETUP-FAILED' "$CONSOLE"); then
    reason="guest setup failed: ${setup#RXE-SETUP-FAILED }"
elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    reason="timed out after ${TIMEOUT}s${reason:+ ($reason)}"
elif ! grep -q '^RXE-DONE$' "$CONSOLE"; then
    reason="guest stopped before RXE-DONE (qemu exit $rc)${reason:+: $reason}"
fi
if [ -n "$reason" ]; then
    echo "rxe-vm: FAIL: $reason"
    exit 1
fi
echo "rxe-vm: PASS"
