#!/usr/bin/env python3
"""The devices demo (doc/devices.md): one worker per device of a simulated
fleet, on three troupe nodes placed through Redis, exactly once.

Starts redis-server and device_server on ports of 127.0.0.1 of their own,
and three devices_node processes (dev-1 and dev-2 have the roles manager and
devices; dev-3 only devices), whose worker group "devices" reads the fleet
from the device server over HTTP. Then, step by step, waiting each time
until every device has exactly one worker:
  1. the fleet of --devices comes up;
  2. --add devices join and --remove leave, through the source;
  3. dev-3 is killed with SIGKILL: its devices run again on the others;
  4. dev-3 is started again and a rebalance gives it its share back.
Prints a summary: devices running, the moves, the longest time a device had
no worker after it had one, the longest wait of a new device for its first
worker, and the moments a device had two workers (the device server's own
count, which must be 0). Exits 0 when every step converged and there was no
double worker, 1 otherwise; everything it started is stopped at the end.

Usage: demo.py BIN_DIR [--devices N] [--add N] [--remove N] [--interval-ms MS]
                       [--sync-interval-ms MS] [--keep]
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
# The process helpers the payment example's end-to-end tests use.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "payment"))
from e2e_support import Proc, Redis, call, check, failures, finish, free_port, wait_until  # noqa: E402


class Node:
    """One devices_node on fixed ports, so that it comes back where it was."""

    def __init__(self, bin_dir, work, name, roles, redis, source, devices, sync_ms):
        self.bin_dir, self.work, self.name = bin_dir, work, name
        self.admin, self.peer = free_port(), free_port()
        self.starts, self.proc = 0, None
        self.config = f"{work}/{name}.toml"
        with open(self.config, "w") as f:
            f.write(f"""[node]
id = "{name}"
data_dir = "{work}/{name}-data"
roles = {roles}
drain_grace_ms = 0
[admin]
port = {self.admin}
[journal]
backend = "memory"
[cluster]
redis = "127.0.0.1:{redis.port}"
key_prefix = "devices-demo"
listen_port = {self.peer}
insecure = true
heartbeat_ms = 500
liveness_threshold_ms = 3000
takeover_margin_ms = 500
[[workers]]
group = "devices"
type = "device"
source = "{source}"
sync_interval_ms = {sync_ms}
roles = ["devices"]
[devices]
server = "127.0.0.1:{devices}"
""")

    def start(self):
        self.starts += 1
        self.proc = Proc([f"{self.bin_dir}/devices_node", "--config", self.config],
                         f"{self.work}/{self.name}.{self.starts}.log")
        self.proc.wait_line(r"devices_node \S+: dashboard on", 60)

    def running(self):
        """Units whose worker this node runs, from its own /workers."""
        try:
            s, r = call(self.admin, "GET", "/workers/devices", timeout=5)
        except OSError:
            return None
        return r.get("running_here") if s == 200 else None


def fleet(port):
    return call(port, "GET", "/stats")[1]


def converged(port, want):
    """Every device of the fleet has exactly one worker, and no worker is
    left on a device that left."""
    s = fleet(port)
    return s["devices"] == want and s["running"] == want and s["connections"] == want


def wait_converged(port, want, what, bound):
    t0 = time.time()
    ok = wait_until(lambda: converged(port, want), bound, interval=0.05)
    took = time.time() - t0
    s = fleet(port)
    check(ok, f"{what}: every one of {want} devices has one worker ({took:.1f} s; "
              f"running {s['running']}, connections {s['connections']}, workerless {s['workerless']})")
    return took


def even(nodes):
    counts = [n.running() or 0 for n in nodes]
    return max(counts) - min(counts) <= 1


def spread(nodes):
    """Units per node, checked even (max - min <= 1); as text."""
    per_node = {n.name: n.running() or 0 for n in nodes}
    check(max(per_node.values()) - min(per_node.values()) <= 1, f"the devices are spread evenly ({per_node})")
    return ", ".join(f"{k} {v}" for k, v in per_node.items())


def fewest_moves(counts):
    total, k = sum(counts), len(counts)
    base, extra = divmod(total, k)
    shares = sorted(counts, reverse=True)
    return sum(max(0, c - (base + (1 if i < extra else 0))) for i, c in enumerate(shares))


def rebalance(node):
    """POST /rebalance on `node`; the worker units it moved."""
    s, r = call(node.admin, "POST", "/rebalance", timeout=60)
    check(s == 200 and r.get("outcome") == "rebalanced", f"rebalance answered 200 ({s} {r if s != 200 else ''})")
    return [m for m in (r.get("moved") or []) if m.get("type") == "workers/devices"] if s == 200 else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--devices", type=int, default=2000)
    ap.add_argument("--add", type=int, default=200)
    ap.add_argument("--remove", type=int, default=100)
    ap.add_argument("--interval-ms", type=int, default=500, help="between a device's readings")
    ap.add_argument("--sync-interval-ms", type=int, default=2000, help="the worker group's sync interval")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    if shutil.which("redis-server") is None:
        print("devices demo: redis-server is not installed (scripts/setup-deps --tests)")
        return 77
    work = tempfile.mkdtemp(prefix="troupe-devices-")
    redis, server, nodes = None, None, []
    summary = {}
    try:
        redis = Redis(work)
        server = Proc([f"{a.bin_dir}/device_server", "--devices", str(a.devices), "--interval-ms", str(a.interval_ms)],
                      f"{work}/device_server.log")
        m = server.wait_line(r"devices on tcp://[\d.]+:(\d+), control on http://[\d.]+:(\d+)", 30)
        dev_port, ctl = int(m.group(1)), int(m.group(2))
        source = f"http://127.0.0.1:{ctl}/devices"
        for i, roles in ((1, '["manager", "devices"]'), (2, '["manager", "devices"]'), (3, '["devices"]')):
            nodes.append(Node(a.bin_dir, work, f"dev-{i}", roles, redis, source, dev_port, a.sync_interval_ms))
        t0 = time.time()
        for n in nodes:
            n.start()
        check(wait_until(lambda: all(len(call(n.admin, "GET", "/cluster")[1]["members"]) == 3 for n in nodes), 30),
              "the three nodes are members of one cluster")
        want = a.devices
        wait_converged(ctl, want, f"start: {want} devices", 120)
        # The first node up took every device: the others get their share.
        rebalance(nodes[0])
        check(wait_until(lambda: even(nodes) and converged(ctl, want), 60),
              f"start: {want} devices spread over 3 nodes, one worker each")
        summary["start_s"] = time.time() - t0
        print(f"{want} devices running on 3 nodes {summary['start_s']:.1f} s after the first node started; "
              f"per node: {spread(nodes)}")

        call(ctl, "POST", "/stats/mark")
        call(ctl, "POST", f"/devices/add?count={a.add}")
        call(ctl, "POST", f"/devices/remove?count={a.remove}")
        want += a.add - a.remove
        summary["source_s"] = wait_converged(ctl, want, f"source: +{a.add} / -{a.remove} devices", 60)
        print(f"+{a.add} / -{a.remove} devices through the source: converged in {summary['source_s']:.1f} s "
              f"(sync interval {a.sync_interval_ms / 1000:.1f} s); longest wait of a new device "
              f"{fleet(ctl)['longest_wait_ms']} ms")

        victim = nodes[2]
        held = victim.running() or 0
        call(ctl, "POST", "/stats/mark")
        killed = time.time()
        victim.proc.stop(signal.SIGKILL)
        # The device server sees the killed node's connections close first.
        check(wait_until(lambda: fleet(ctl)["running"] <= want - held, 10),
              f"the device server saw {victim.name}'s {held} workers go")
        wait_converged(ctl, want, f"failover: {victim.name}'s {held} devices run elsewhere", 60)
        summary["failover_s"] = time.time() - killed
        gap = fleet(ctl)["longest_gap_ms"]
        print(f"{victim.name} killed (SIGKILL) holding {held} devices: all running again in "
              f"{summary['failover_s']:.1f} s; longest time a device had no worker {gap} ms")
        summary["failover_gap_ms"] = gap

        victim.start()
        check(wait_until(lambda: victim.running() is not None, 30), f"{victim.name} is back")
        before = {n.name: n.running() or 0 for n in nodes}
        t1 = time.time()
        moves = rebalance(nodes[0])
        # Done when the moved units have stopped and started again: the
        # nodes hold even shares and every device has its one worker.
        check(wait_until(lambda: even(nodes) and converged(ctl, want), 60),
              f"after the rebalance the nodes run even shares and every device has one worker ({fleet(ctl)})")
        summary["rebalance_s"] = time.time() - t1
        # The fewest moves that leave max - min <= 1: what is above each
        # node's share (the larger shares going to the nodes holding most).
        fewest = fewest_moves(list(before.values()))
        check(len(moves) == fewest, f"the rebalance made the fewest moves ({len(moves)}, fewest {fewest}, from {before})")
        print(f"{victim.name} restarted; rebalance moved {len(moves)} devices (the fewest: {fewest}) in "
              f"{summary['rebalance_s']:.1f} s; per node: {spread(nodes)}")

        s = fleet(ctl)
        summary.update(devices=s["devices"], running=s["running"], doubles=s["doubles"], attaches=s["attaches"],
                       readings=s["readings"])
        check(s["doubles"] == 0, f"no device ever had two workers (doubles {s['doubles']}: {s['double_samples']})")
        print()
        print("devices demo summary")
        print(f"  devices running        {s['running']} of {s['devices']}")
        print(f"  moves                  failover {held}, rebalance {len(moves)}")
        print(f"  took                   start {summary['start_s']:.1f} s, source {summary['source_s']:.1f} s, "
              f"failover {summary['failover_s']:.1f} s, rebalance {summary['rebalance_s']:.1f} s")
        print(f"  longest without worker {summary['failover_gap_ms']} ms (failover)")
        print(f"  double workers         {s['doubles']}")
        print(f"  readings               {s['readings']}")
    except Exception:
        traceback.print_exc()
        failures.append("unexpected exception")
    finally:
        for n in nodes:
            if n.proc and n.proc.p.poll() is None:
                n.proc.stop()
        if server:
            server.stop()
        if redis:
            redis.stop()
        if failures or a.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
