#!/usr/bin/env python3
"""A rolling restart under load, black box: three payment_service nodes on
a PostgreSQL journal they share and Redis placement, the payment_gateway,
and payment_loadgen in front of them acting as a load balancer (it sends
only to nodes whose /ready answers 200), all started here on ports of
127.0.0.1 with data directories of their own, and stopped at the end.

While the load runs, every node in turn gets SIGTERM (as systemd or a
container runtime stops it), must exit 0 by itself after its drain, and is
started again at once with the same configuration; the next node goes only
once this one answers /ready 200 and owns shards again (after a POST
/rebalance, as `troupectl rolling-update` does).

Asserted: every payment and every cancel was answered with its real
outcome: HTTP 200, no 5xx, no connection error, no client timeout; no
payment lost (each one answered Completed was approved at the gateway, and
the gateway approved no more than were completed) and none settled twice;
every refund asked was made exactly once. Printed: the load generator's
summary (answers by status, p99 per 10 s window against the run's, the
slowest request) and each node's drain lines.

Usage: rolling_restart_test.py BIN_DIR [--rounds N] [--seconds-between S] [--control]
       (exit 77: no redis-server or PostgreSQL; --control: the same load
       and timing without the restarts, a steady run to compare with)
proves: C2 (a drained node hands its shards off without refusing anyone;
a client that follows /ready sees no error through a rolling restart)
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import (Postgres, Proc, Redis, call, check, failures, finish,  # noqa: E402
                         fixed_port_node_config, free_port, gateway, postgres_bin_dir, wait_until)

# Fast and faultless: every settlement is approved, none hangs, so every
# answer is the service's own.
GATEWAY = ("--latency-ms", "2", "--decline-rate", "0", "--error-rate", "0", "--hang-rate", "0")
DRAIN_GRACE_MS = 1000  # the balancer polls /ready every 100 ms


class Node:
    """One payment node on fixed ports, so that it comes back where the
    balancer looks for it."""

    def __init__(self, bin_dir, work, name, gw_port, pg, redis):
        self.bin_dir, self.work, self.name = bin_dir, work, name
        self.api, self.admin, self.peer = free_port(), free_port(), free_port()
        self.starts = 0
        self.proc = None
        self.config = f"{work}/{name}.toml"
        with open(self.config, "w") as f:
            f.write(fixed_port_node_config(work, name, api=self.api, admin=self.admin, peer=self.peer,
                                           gw_port=gw_port, pg=pg, schema="roll", redis=redis, prefix="roll",
                                           drain_grace_ms=DRAIN_GRACE_MS, entity_shards=32))

    @property
    def log(self):
        return f"{self.work}/{self.name}.{self.starts}.log"

    def start(self):
        self.starts += 1
        self.proc = Proc([f"{self.bin_dir}/payment_service", "--config", self.config], self.log)
        self.proc.wait_line(r"payments on http://[^:]+:\d+, dashboard on http://[^:]+:\d+/", 60)

    def ready(self):
        try:
            s, _ = call(self.admin, "GET", "/ready", timeout=2)
            return s == 200
        except OSError:
            return False

    def shards(self):
        """The shards and job queues this node runs, from its own /cluster."""
        try:
            s, r = call(self.admin, "GET", "/cluster", timeout=5)
        except OSError:
            return 0
        if s != 200:
            return 0
        return sum(1 for sh in r.get("shards") or [] if sh.get("owner") == self.name)

    def drain_lines(self):
        with open(self.log) as f:
            return [line.rstrip() for line in f if re.search(r"drain|handed off", line)]


def start_cluster(bin_dir, work, gw_port, pg, redis):
    nodes = [Node(bin_dir, work, f"pay-{i}", gw_port, pg, redis) for i in range(1, 4)]
    for n in nodes:
        n.start()
    members = wait_until(lambda: all(len(call(n.admin, "GET", "/cluster")[1]["members"]) == 3 for n in nodes), 30)
    check(members, "the three nodes are members of one cluster, each knowing the others")
    return nodes


def rebalance(nodes):
    s, r = call(nodes[0].admin, "POST", "/rebalance", timeout=60)
    return s == 200, r


def start_load(bin_dir, work, nodes, gw_port, seconds, tag):
    argv = [f"{bin_dir}/payment_loadgen", "--duration-s", str(seconds), "--concurrency", "24",
            "--refund-rate", "0.05", "--timeout-s", "10", "--gateway", f"http://127.0.0.1:{gw_port}",
            "--id-prefix", tag, "--json", "--quiet"]
    for n in nodes:
        argv += ["--node", f"http://127.0.0.1:{n.api},http://127.0.0.1:{n.admin}"]
    out = open(f"{work}/loadgen-{tag}.json", "w")
    return subprocess.Popen(argv, stdout=out, stderr=open(f"{work}/loadgen-{tag}.log", "w")), out.name


def restart(node, balanced_with):
    """SIGTERM, wait for the exit, start again, wait until ready and owning
    shards (after a rebalance). Returns the seconds each step took."""
    t0 = time.time()
    node.proc.p.send_signal(signal.SIGTERM)
    try:
        code = node.proc.p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        node.proc.stop(signal.SIGKILL)
        check(False, f"{node.name} exits by itself within 60 s of SIGTERM")
        return None
    node.proc.out.close()
    check(code == 0, f"{node.name} exits 0 after its drain (exit {code})")
    lines = node.drain_lines()
    t1 = time.time()
    node.start()
    check(wait_until(node.ready, 60), f"{node.name} answers /ready 200 after its restart")
    t2 = time.time()
    ok, r = rebalance(balanced_with)
    check(ok, f"the shards are balanced again after {node.name} came back ({r})")
    check(wait_until(lambda: node.shards() > 0, 30), f"{node.name} owns shards again")
    t3 = time.time()
    print(f"  {node.name}: drained and exited in {t1 - t0:.1f} s, ready {t2 - t1:.1f} s after start, "
          f"owns {node.shards()} shards {t3 - t2:.1f} s later")
    for line in lines:
        print(f"    {line}")
    return t3 - t0


def one_round(bin_dir, work, nodes, gw_port, round_no, between, control=False):
    """Load for the whole rolling restart plus `between` s before and after;
    the load generator is interrupted then (it stops sending and reports)."""
    tag = f"r{round_no}"
    seconds = 600  # an upper bound: SIGINT ends it
    load, report_path = start_load(bin_dir, work, nodes, gw_port, seconds, tag)
    time.sleep(between)
    if load.poll() is not None:
        with open(f"{work}/loadgen-{tag}.log") as f:
            check(False, f"round {round_no}: the load runs (payment_loadgen exited {load.returncode}: {f.read()})")
        return None
    began = time.time()
    for n in nodes:
        if control:
            time.sleep(2.5)  # about a restart's length, without the restart
        elif restart(n, nodes) is None:
            break
        time.sleep(between)
    print(f"  the rolling restart took {time.time() - began:.1f} s")
    load.send_signal(signal.SIGINT)
    load.wait(timeout=120)
    with open(report_path) as f:
        rep = json.load(f)
    return rep


def check_report(rep, gw_before, gw_after, round_no):
    pay = rep.get("payment_statuses", {})
    can = rep.get("cancel_statuses", {})
    print(f"round {round_no}: payments {pay}, cancels {can}, connection errors {rep.get('connection_errors')}, "
          f"client timeouts {rep.get('payment_client_timeouts')}/{rep.get('cancel_client_timeouts')}")
    windows = rep.get("windows", [])
    print("  p99 per window (ms): " + ", ".join(f"{w['index']}:{w['p99_ms']}" for w in windows) +
          f"; run p99 {rep.get('steady_p99_ms')} ms; worst window / run {rep.get('window_p99_ratio')}")
    if windows and windows[0]["p99_ms"]:
        # The first window ends before the first restart when
        # --seconds-between is at least the window (10 s).
        worst = max(w["p99_ms"] or 0 for w in windows)
        print(f"  worst window / first window: {worst / windows[0]['p99_ms']:.2f}")
    print(f"  slowest: {rep.get('slowest')}")
    if rep.get("first_error"):
        print(f"  first error: {rep['first_error']}")
    check(set(pay) == {"200"}, f"round {round_no}: every payment answered 200 ({pay})")
    check(set(can) <= {"200"}, f"round {round_no}: every cancel answered 200 ({can})")
    for k in ("connection_errors", "payment_client_timeouts", "cancel_client_timeouts", "payment_other_errors",
              "cancel_other_errors", "no_ready_gave_up"):
        check(rep.get(k) == 0, f"round {round_no}: {k} = 0 ({rep.get(k)})")
    completed = rep.get("completed", 0)
    check(completed > 0, f"round {round_no}: payments completed ({completed})")
    approved = gw_after["settled_distinct"] - gw_before["settled_distinct"]
    check(approved == completed,
          f"round {round_no}: every payment answered Completed was approved at the gateway, no other "
          f"({approved} approved, {completed} completed)")
    check(gw_after["settled_twice"] == 0, f"round {round_no}: no payment settled twice ({gw_after['settled_twice']})")
    check(rep.get("refunds_missing") == 0 and rep.get("refunded_twice") == 0,
          f"round {round_no}: every refund asked made exactly once (missing {rep.get('refunds_missing')}, "
          f"twice {rep.get('refunded_twice')})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seconds-between", type=float, default=3)
    ap.add_argument("--control", action="store_true",
                    help="the same load and timing without restarts (a steady run to compare with)")
    a = ap.parse_args()
    if shutil.which("redis-server") is None or postgres_bin_dir() is None:
        print("SKIP: redis-server or PostgreSQL is not installed (scripts/setup-deps --tests)")
        return 77
    work = tempfile.mkdtemp(prefix="troupe-roll-")
    procs, pg, redis, nodes = [], None, None, []
    try:
        pg = Postgres()
        redis = Redis(work)
        gw, gw_port = gateway(a.bin_dir, work, "gateway", *GATEWAY)
        procs.append(gw)
        nodes = start_cluster(a.bin_dir, work, gw_port, pg, redis)
        ok, r = rebalance(nodes)
        check(ok, f"the shards are balanced over the three nodes ({r})")
        for k in range(1, a.rounds + 1):
            before = call(gw_port, "GET", "/stats")[1]
            rep = one_round(a.bin_dir, work, nodes, gw_port, k, a.seconds_between, a.control)
            if rep is None:
                break
            after = call(gw_port, "GET", "/stats")[1]
            check_report(rep, before, after, k)
            if failures:
                break
    except Exception:
        traceback.print_exc()
        failures.append("unexpected exception")
    finally:
        for n in nodes:
            if n.proc and n.proc.p.poll() is None:
                n.proc.stop(signal.SIGKILL)
        for p in procs:
            p.stop()
        if redis:
            redis.stop()
        if pg:
            pg.stop()
        if failures or os.environ.get("TROUPE_KEEP_WORK"):
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
