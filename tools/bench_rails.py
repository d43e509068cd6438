#!/usr/bin/env python3
"""tent-bench over TCP across two network namespaces joined by tbf-shaped
veth rails (tools/netns.sh): smart scheduling and round robin in one run.

Run through tools/bench-rails.sh (it builds tent-bench first); see its
header for the options. Each run gets fresh namespaces and a fresh target,
so a mid-run cut never leaks into the next run. GB/s is 1e9 bytes/s and
Gbit/s 1e9 bit/s, as tc counts rates.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
NETNS = os.path.join(TOOLS, "netns.sh")
POLICIES = {"smart": True, "rr": False}
# The recovery criterion: back to this fraction of the new rail sum.
RECOVERED = 0.85
# ... on average over every stretch this long from then on.
HOLD_MS = 500


def fail(msg):
    print(f"bench-rails: {msg}", file=sys.stderr)
    sys.exit(2)


def rate_bits(rate):
    """A tc rate in bit/s, read by netns.sh (the one parser of rates)."""
    out = subprocess.run([NETNS, "rate-bits", rate], capture_output=True, text=True)
    if out.returncode != 0:
        fail(out.stderr.strip() or f"bad rate {rate}")
    return int(out.stdout)


def size_bytes(s):
    """A size as tent-bench reads it: bytes, or with a K/M/G suffix (x1024)."""
    t = s.strip()
    mul = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:].lower(), 1)
    num = t[:-1] if mul > 1 else t
    try:
        n = int(num.rstrip("iBb")) * mul
    except ValueError:
        fail(f"bad size {s!r} (use e.g. 4096, 64K, 16M)")
    if n <= 0:
        fail(f"bad size {s!r}")
    return n


def human(n):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def merged(base, extra):
    """`extra` merged into `base`, objects key by key, anything else replaced."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_cut(spec, rails):
    """RAIL:RATE@SECONDS -> (rail, rate, seconds)."""
    try:
        rail, rest = spec.split(":", 1)
        rate, secs = rest.split("@", 1)
        rail, secs = int(rail), float(secs)
    except ValueError:
        fail(f"--cut {spec!r}: use RAIL:RATE@SECONDS, e.g. 2:100mbit@3")
    if not 1 <= rail <= rails:
        fail(f"--cut {spec!r}: rail {rail} is not one of 1..{rails}")
    if not secs > 0:
        fail(f"--cut {spec!r}: SECONDS must be positive")
    rate_bits(rate)
    return rail, rate, secs


class Namespaces:
    """NAME-a (initiator) and NAME-b (target) joined by shaped rails."""

    def __init__(self, name, rates):
        self.name = name
        subprocess.run([NETNS, "down", name], capture_output=True)
        if subprocess.run([NETNS, "up", name, str(len(rates)), ",".join(rates)]).returncode:
            fail(f"tools/netns.sh up {name} failed (root and iproute2 needed)")

    def shape(self, rail, rate):
        return subprocess.run([NETNS, "shape", self.name, str(rail), rate]).returncode == 0

    def close(self):
        subprocess.run([NETNS, "down", self.name], capture_output=True)


def start_target(bench, ns, buffer_size):
    env = dict(os.environ, TENT_CONF=json.dumps({"rpc_server_hostname": "10.77.1.2"}))
    env.setdefault("TENT_LOG", "warn")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", f"{ns.name}-b", bench, "--mode", "target", "--transport", "tcp",
         "--buffer-size", str(buffer_size)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    seg = proc.stdout.readline().strip()
    if not seg:
        proc.kill()
        proc.wait()
        fail("the target did not start (no segment name)")
    return proc, seg


def run_initiator(bench, ns, seg, conf, argv, cut):
    """Run one initiator; with `cut`, shape the rail at its time (from the
    initiator's live start line) and note when, on the series' clock."""
    env = dict(os.environ, TENT_CONF=json.dumps(conf))
    env.setdefault("TENT_LOG", "warn")
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", f"{ns.name}-a", bench, "--mode", "initiator", "--transport",
         "tcp", "--target", seg, "--json", "--no-baseline"] + argv,
        stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    lines, cut_at, timer, ended = [], {}, None, threading.Event()
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        o = json.loads(line)
        lines.append(o)
        if o.get("event") == "start" and cut:
            origin = time.monotonic()
            due = origin + o["warmup_ms"] / 1e3 + cut[2]

            def apply(origin=origin, due=due):
                # An initiator that ended first gets no cut (none reported).
                if ended.wait(max(0.0, due - time.monotonic())):
                    return
                t0 = (time.monotonic() - origin) * 1e3
                if ns.shape(cut[0], cut[1]):
                    cut_at.update(from_ms=t0, to_ms=(time.monotonic() - origin) * 1e3)

            timer = threading.Thread(target=apply, daemon=True)
            timer.start()
    rc = proc.wait()
    ended.set()
    if timer:
        timer.join()
    err.seek(0)
    return rc, lines, cut_at, err.read()


def one_run(args, rates, policy, cut):
    """Fresh namespaces and target, one initiator: its summary, series and
    rails. With --cut every run (the reference too) is the same stream of
    moderate ops; `cut` says whether this one cuts."""
    ns = Namespaces(args.name, rates)
    target = None
    try:
        if args.cut:
            block, batch = size_bytes(args.cut_block), args.cut_inflight
            argv = ["--block-size", str(block), "--batch", str(batch),
                    "--interval-ms", str(args.interval_ms)]
        else:
            block, batch = size_bytes(args.size), 1
            argv = ["--block-size", str(block), "--batch", "1"]
        argv += ["--op", args.op, "--threads", "1", "--duration", str(args.duration),
                 "--max-seconds", str(args.max_seconds)]
        target, seg = start_target(args.bench, ns, block * batch)
        conf = {"rpc_server_hostname": "10.77.1.1"}
        if policy is not None:
            conf = merged(conf, {"transports": {"rdma": {"enable_smart_scheduling": POLICIES[policy]}}})
        conf = merged(conf, args.extra)
        rc, lines, cut_at, err = run_initiator(args.bench, ns, seg, conf, argv, cut)
    finally:
        if target:
            target.kill()
            target.wait()
        ns.close()
    summary = next((o for o in lines if "ops" in o and "block_size" in o), None)
    if summary is None:
        tail = "\n".join(err.strip().splitlines()[-5:])
        return {"error": f"tent-bench exited {rc} with no summary:\n{tail}"}
    return {
        "gbps": summary["gbps"],
        "error": summary.get("error") or (f"tent-bench exited {rc}" if rc else None),
        "series": [(o["t_ms"], o["gbps"]) for o in lines if "t_ms" in o],
        "start": next((o for o in lines if o.get("event") == "start"), None),
        "rails": [o["bytes"] for o in lines if "rail_local" in o],
        "cut": cut_at,
        # tent-bench prints seed 003's traffic statistics on stderr under --json.
        "traffic": [l for l in err.splitlines() if l.startswith(("=== Device", "Dev "))],
    }


def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "n/a"


def gbit(gbps):
    return "n/a" if gbps is None else f"{gbps * 8:.2f}"


def split(rails):
    total = sum(rails)
    return " / ".join(f"{100 * b / total:.0f}%" for b in rails) if total else "-"


def whole(series, interval_ms, lo_ms, hi_ms):
    """(start ms, GB/s) of the whole intervals inside [lo_ms, hi_ms]."""
    return [(t - interval_ms, g) for t, g in series if t - interval_ms >= lo_ms and t <= hi_ms]


def mean(series, interval_ms, lo_ms, hi_ms):
    xs = [g for _, g in whole(series, interval_ms, lo_ms, hi_ms)]
    return sum(xs) / len(xs) if xs else None


def recovery(series, interval_ms, cut_ms, end_ms, target_gbps):
    """ms from the cut to the start of the first interval from which every
    HOLD_MS stretch up to the window's end averages at least
    `target_gbps`; None when the end comes first."""
    pts = whole(series, interval_ms, cut_ms, end_ms)
    hold = max(1, -(-HOLD_MS // interval_ms))
    means = [sum(g for _, g in pts[i:i + hold]) / hold for i in range(len(pts) - hold + 1)]
    short = [i for i, m in enumerate(means) if m < target_gbps]
    k = short[-1] + 1 if short else 0
    return pts[k][0] - cut_ms if k < len(means) else None


def print_series(series, interval_ms, cut_ms, end_ms):
    """Gbit/s per interval up to the window's end, one row a second, '|'
    at the cut."""
    series = [(t, g) for t, g in series if t <= end_ms]
    per_row = max(1, 1000 // interval_ms)
    print(f"    Gbit/s per {interval_ms} ms from the start, warm-up included ('|' marks the cut):")
    for i in range(0, len(series), per_row):
        row = []
        for t_ms, g in series[i:i + per_row]:
            if t_ms - interval_ms < cut_ms <= t_ms:
                row.append("|")
            row.append(f"{g * 8:.2f}")
        print(f"    {(series[i][0] - interval_ms) / 1e3:5.1f}s  " + " ".join(row))


def report_policies(args, results, rates_bits):
    total, fastest = sum(rates_bits), max(rates_bits)
    print(f"  {'policy':<8} {'GB/s':>7} {'Gbit/s':>7} {'x sum':>7} {'x fastest':>9}   bytes per rail (whole run)")
    for policy, r in results.items():
        if r.get("gbps") is None:
            print(f"  {policy:<8} no figure: {r.get('error')}")
            continue
        bits = r["gbps"] * 8e9
        print(f"  {policy:<8} {r['gbps']:>7.3f} {gbit(r['gbps']):>7} {ratio(bits, total):>7} "
              f"{ratio(bits, fastest):>9}   {split(r.get('rails', []))}")
        if r.get("error"):
            print(f"  {'':<8} but: {r['error']}")
    if len(results) == 2:
        s, rr = results["smart"].get("gbps"), results["rr"].get("gbps")
        print(f"  smart/rr: {ratio(s, rr)}")


def report_cut(args, results, rates, rates_bits, cut):
    rail, rate, secs = cut
    after = list(rates_bits)
    after[rail - 1] = rate_bits(rate)
    new_sum = sum(after)
    target = RECOVERED * new_sum / 8e9
    iv = args.interval_ms
    print(f"  cut: rail {rail} {rates[rail - 1]} -> {rate} at {secs:g} s into the window; rail sum "
          f"{sum(rates_bits) / 1e9:.2f} -> {new_sum / 1e9:.2f} Gbit/s; back = every {HOLD_MS} ms "
          f"from then to the window's end averages >= {RECOVERED}x the new sum ({target * 8:.2f} Gbit/s)")
    post = {}
    for policy, r in results.items():
        c, start = r.get("cut", {}), r.get("start")
        if r.get("gbps") is None or "from_ms" not in c or start is None:
            print(f"  {policy}: no figure: {r.get('error') or 'the cut did not happen'}")
            continue
        cut_ms = c["from_ms"]
        end_ms = start["warmup_ms"] + args.duration * 1e3
        # The second before the cut, and from a second after it to the end
        # of the window (the drain after the window is left out).
        before = mean(r["series"], iv, max(start["warmup_ms"], cut_ms - 1000), cut_ms)
        post[policy] = mean(r["series"], iv, cut_ms + 1000, end_ms)
        rec = recovery(r["series"], iv, cut_ms, end_ms, target)
        print(f"  {policy}: window {gbit(r['gbps'])} Gbit/s; the second before the cut "
              f"{gbit(before)} Gbit/s ({ratio(before, sum(rates_bits) / 8e9)} the sum); "
              + (f"back to {RECOVERED}x the new sum {rec / 1e3:.2f} s after the cut"
                 if rec is not None else f"not back to {RECOVERED}x the new sum by the end")
              + f"; from 1 s after the cut {gbit(post[policy])} Gbit/s "
              f"({ratio(post[policy], new_sum / 8e9)} the new sum); tc change took "
              f"{c['to_ms'] - c['from_ms']:.0f} ms")
        print_series(r["series"], iv, cut_ms, end_ms)
    if len(post) == 2:
        print(f"  smart/rr after the cut: {ratio(post['smart'], post['rr'])}")


def main():
    p = argparse.ArgumentParser(prog="tools/bench-rails.sh")
    p.add_argument("--bench", required=True, help=argparse.SUPPRESS)
    p.add_argument("--rails", type=int, default=2)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--rates")
    p.add_argument("--policy", choices=["smart", "rr", "both"], default="both")
    p.add_argument("--size", default="256M")
    p.add_argument("--op", choices=["read", "write"], default="read")
    p.add_argument("--duration", type=float)
    p.add_argument("--config-extra", default="{}")
    p.add_argument("--reference", action="store_true")
    p.add_argument("--cut")
    p.add_argument("--cut-block", default="4M")
    p.add_argument("--cut-inflight", type=int, default=8)
    p.add_argument("--interval-ms", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=300)
    args = p.parse_args()
    rates = args.rates.split(",") if args.rates else [args.rate] * args.rails
    if not rates or not 1 <= len(rates) <= 16:
        fail("between 1 and 16 rails")
    rates_bits = [rate_bits(r) for r in rates]
    try:
        args.extra = json.loads(args.config_extra)
    except ValueError as e:
        fail(f"--config-extra is not JSON: {e}")
    if not isinstance(args.extra, dict):
        fail("--config-extra must be a JSON object")
    cut = parse_cut(args.cut, len(rates)) if args.cut else None
    if args.interval_ms < 1 or args.cut_inflight < 1:
        fail("--interval-ms and --cut-inflight must be positive")
    if args.duration is None:
        # A cut needs time after it to show a recovery.
        args.duration = max(4.0, cut[2] + 3.0) if cut else 4.0
    if cut and cut[2] >= args.duration:
        fail(f"--cut at {cut[2]} s is not inside the {args.duration} s window")
    args.name = f"br{os.getpid() % 100000}"

    policies = ["smart", "rr"] if args.policy == "both" else [args.policy]
    what = f"tcp {args.op} " + (f"{args.cut_block} x {args.cut_inflight} in flight (stream)"
                                if cut else f"{human(size_bytes(args.size))} ops")
    print(f"{what}, {len(rates)} rail(s) of {', '.join(rates)} (sum {sum(rates_bits) / 1e9:.2f} "
          f"Gbit/s, fastest {max(rates_bits) / 1e9:.2f}), {args.duration:g} s window", flush=True)
    results = {}
    for policy in policies:
        print(f"  running {policy} ...", file=sys.stderr, flush=True)
        results[policy] = one_run(args, rates, policy, cut)
    if cut:
        report_cut(args, results, rates, rates_bits, cut)
    else:
        report_policies(args, results, rates_bits)
    for policy, r in results.items():
        if r.get("traffic"):
            print(f"  {policy}:")
            for line in r["traffic"]:
                print(f"    {line}")
    ok = all(r.get("gbps") is not None and not r.get("error") and (not cut or r.get("cut"))
             for r in results.values())
    if args.reference:
        fast = rates[rates_bits.index(max(rates_bits))]
        print("  running the 1-rail reference ...", file=sys.stderr, flush=True)
        ref = one_run(args, [fast], None, None)
        g = ref.get("gbps")
        if g is None:
            print(f"  reference, 1 rail of {fast}: no figure: {ref.get('error')}")
            ok = False
        else:
            base = [r.get("gbps") for r in results.values()]
            vs = ", ".join(f"{pol} {ratio(b, g)}" for pol, b in zip(results, base))
            print(f"  reference, 1 rail of {fast}: {g:.3f} GB/s = {gbit(g)} Gbit/s "
                  f"({ratio(g * 8e9, max(rates_bits))} its rate); {len(rates)} rails vs it: {vs}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
