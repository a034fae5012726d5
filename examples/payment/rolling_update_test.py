#!/usr/bin/env python3
"""troupectl rolling-update on the payment cluster, black box: three real
payment_service nodes on a PostgreSQL journal they share and Redis
placement, the payment_gateway, all on free ports of 127.0.0.1 (fixed per
node, as a service's are, so a restarted node comes back at the same
addresses). Each node is started detached by a small shell script, and
restarted by another the way a service manager does it (SIGTERM, wait for
the process to exit, start it again, write the new pid): that script is
troupectl's --restart command.

1. A rolling update of all three: the order is the members the node at
   --node lists, that node last; every node runs a new process (new pid,
   the old one gone), and troupectl saw each one ready and hosting shards
   before it went on (its progress lines, in order); afterwards every node
   is ready and hosts shards, and the payments settled before are intact.
2. A node restarted with a broken config does not come back: troupectl
   stops at it, exit 1, naming the node and why, and does not touch the
   next one (its restart script never ran, its pid is unchanged).

The restart loop is `roll()`; a test under load wraps it (the `load`
argument of test_rolling_update).

Usage: rolling_update_test.py BIN_DIR TROUPECTL   (exit 77: no redis-server or PostgreSQL)
"""

import concurrent.futures
import contextlib
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
from e2e_support import (Postgres, Redis, call, check, failures, finish, fixed_port_node_config,  # noqa: E402
                         free_port, gateway, postgres_bin_dir, wait_until)

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
TROUPECTL = sys.argv[2] if len(sys.argv) > 2 else f"{BIN}/troupectl"
FAST_GATEWAY = ("--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0", "--hang-rate", "0")


class Node:
    """One payment node run as a service would be: its config, fixed ports,
    a pid file, and the scripts that start and restart it (detached: the
    node is no child of this test)."""

    def __init__(self, work, name, gw_port, pg, redis, tag):
        self.work, self.name = work, name
        self.api, self.admin, self.cluster = free_port(), free_port(), free_port()
        self.pidfile = f"{work}/{name}.pid"
        self.log = f"{work}/{name}.log"
        self.config = f"{work}/{name}.toml"
        with open(self.config, "w") as f:
            f.write(fixed_port_node_config(work, name, api=self.api, admin=self.admin, peer=self.cluster,
                                           gw_port=gw_port, pg=pg, schema=tag, redis=redis, prefix=tag,
                                           drain_grace_ms=500, entity_shards=16))
        self.write_restart_script(self.config)
        with open(f"{work}/start-{name}.sh", "w") as f:
            f.write(f"""#!/bin/sh
# Starts {name} detached with the config given, and records its pid.
setsid {BIN}/payment_service --config "$1" >> {self.log} 2>&1 < /dev/null &
echo $! > {self.pidfile}
echo "{name} started $!" >> {work}/restarts.log
""")

    def write_restart_script(self, config):
        """restart-NAME.sh: SIGTERM, wait for the exit, start with `config`."""
        with open(f"{self.work}/restart-{self.name}.sh", "w") as f:
            f.write(f"""#!/bin/sh
# Restarts {self.name} as a service manager does: SIGTERM, wait until the
# process has exited (a zombie no one reaps counts), start it again.
set -eu
pid=$(cat {self.pidfile})
echo "{self.name} stopping $pid" >> {self.work}/restarts.log
kill -TERM "$pid"
while [ -e /proc/$pid ] && ! grep -q ') Z' /proc/$pid/stat 2>/dev/null; do sleep 0.05; done
sh {self.work}/start-{self.name}.sh {config}
""")

    def start(self):
        subprocess.run(["sh", f"{self.work}/start-{self.name}.sh", self.config], check=True, timeout=10)

    def pid(self):
        with open(self.pidfile) as f:
            return int(f.read())

    def kill(self):
        with contextlib.suppress(OSError, ValueError):
            os.kill(self.pid(), signal.SIGKILL)

    def ready(self):
        return call(self.admin, "GET", "/ready", timeout=2)[0] == 200

    def shards_hosted(self):
        s, o = call(self.admin, "GET", "/api/overview", timeout=5)
        return sum(t.get("shards_hosted", 0) for t in o["entity_types"]) if s == 200 else None


def runs(pid):
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def is_payment_service(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"payment_service" in f.read()
    except OSError:
        return False


def start_cluster(work, nodes_out, tag, gw_port, pg, redis):
    """Three clustered nodes, each started detached, ready and knowing the
    others, shards placed by a few payments and balanced: [Node]."""
    for i in range(1, 4):
        n = Node(work, f"{tag}-{i}", gw_port, pg, redis, tag)
        nodes_out.append(n)
        n.start()
        check(wait_until(n.ready, 60, 0.1), f"{n.name} started (pid {n.pid()}) and ready")
    members = wait_until(lambda: all(len(call(n.admin, "GET", "/cluster")[1]["members"]) == 3 for n in nodes_out), 30)
    check(members, f"{tag}: the three nodes are members of one cluster, each knowing the others")
    # troupectl learns the others' admin URLs from their load reports.
    known = wait_until(lambda: all(m.get("admin") for m in call(nodes_out[0].admin, "GET", "/api/overview")[1]
                                   ["members"]), 15)
    check(known, f"{tag}: {nodes_out[0].name} knows every member's admin URL")
    return nodes_out


def settle(nodes, tag, count, threads=16):
    """Settles `count` payments round robin through the nodes: their ids."""
    def one(i):
        return call(nodes[i % len(nodes)].api, "POST", "/payments",
                    {"customer": f"{tag}-c{i}", "order_id": f"{tag}-{i}", "amount": 100 + i})
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        answers = list(ex.map(one, range(count)))
    done = [r["id"] for s, r in answers if s == 200 and r.get("status") == "Completed"]
    check(len(done) == count, f"{tag}: {len(done)} of {count} payments settled " +
          str([a for a in answers if not (a[0] == 200 and a[1].get("status") == "Completed")][:2]))
    return done


def roll(at, *args, timeout=240):
    """troupectl rolling-update through the node `at`: (exit code, stdout
    lines, stderr, seconds). Its output is printed as it was."""
    t0 = time.time()
    p = subprocess.run([TROUPECTL, "--node", f"http://127.0.0.1:{at.admin}", "rolling-update", *args],
                       capture_output=True, text=True, timeout=timeout)
    took = time.time() - t0
    print("  $ troupectl rolling-update " + " ".join(args), flush=True)
    for line in (p.stdout + p.stderr).splitlines():
        print("  | " + line, flush=True)
    return p.returncode, p.stdout.splitlines(), p.stderr, took


def restart_log(work):
    with open(f"{work}/restarts.log") as f:
        return [line.split() for line in f.read().splitlines()]


def progress_of(lines, name):
    """The progress lines of one node, without the "NAME (i/n): " step."""
    return [re.sub(r"^\S+ \(\d+/\d+\): ", "", ln) for ln in lines if ln.startswith(name + " (")]


def in_order(got, prefixes):
    """Whether each prefix starts a line of `got`, in this order."""
    at = 0
    for p in prefixes:
        while at < len(got) and not got[at].startswith(p):
            at += 1
        if at == len(got):
            return False
        at += 1
    return True


RESTART = "sh {work}/restart-{{node}}.sh"
TIMEOUTS = ("--exit-timeout", "60", "--ready-timeout", "30", "--shards-timeout", "30")


# --- 1: every node restarted in turn --------------------------------------------------------


def no_load(nodes):
    return contextlib.nullcontext()


def test_rolling_update(work, nodes, pg, redis, load=no_load):
    """`load(nodes)`: a context manager that keeps clients busy on the
    nodes while troupectl restarts them (none by default)."""
    t0 = time.time()
    gw, gw_port = gateway(BIN, work, "t1-gateway", *FAST_GATEWAY)
    try:
        start_cluster(work, nodes, "t1", gw_port, pg, redis)
        paid = settle(nodes, "t1", 48)  # places most of the 16 shards
        s, r = call(nodes[0].admin, "POST", "/rebalance", timeout=60)
        check(s == 200, f"t1: shards balanced before the update ({s})")
        hosted = {n.name: n.shards_hosted() for n in nodes}
        check(all(hosted.values()), f"t1: every node hosts shards before the update {hosted}")
        before = {n.name: n.pid() for n in nodes}

        plan = roll(nodes[0], "--restart", RESTART.format(work=work), "--dry-run")
        want = [nodes[1].name, nodes[2].name, nodes[0].name]  # the node at --node last
        rows = [ln.split()[1] for ln in plan[1] if re.match(r"^\d+\s", ln)]
        check(plan[0] == 0 and rows == want, f"t1: the dry run plans {want}: {rows}")
        check(not os.path.exists(f"{work}/restarts.log") or all(r[1] != "stopping" for r in restart_log(work)),
              "t1: the dry run restarted nothing")

        with load(nodes):
            code, out, err, took = roll(nodes[0], "--restart", RESTART.format(work=work), *TIMEOUTS)
        check(code == 0, f"t1: troupectl rolling-update exits 0 ({code}) after {took:.1f} s: {err.strip()}")
        check(out[:1] == [f"rolling update of 3 nodes: {', '.join(want)}"], f"t1: the order is {want}: {out[:1]}")
        check(out[-1:] and out[-1].startswith("rolling update done: 3 nodes restarted in"), f"t1: done: {out[-1:]}")
        stops = [r[0] for r in restart_log(work) if r[1] == "stopping"]
        check(stops == want, f"t1: the restart scripts ran in that order, once each: {stops}")
        steps = [ln.split()[0] for ln in out if re.match(r"^\S+ \(\d/3\): restarting: ", ln)]
        check(steps == want, f"t1: troupectl restarted {steps}")
        for n in nodes:
            got = progress_of(out, n.name)
            check(in_order(got, ["restarting: sh ", "restart command done after", "ready after", "rebalanced: ",
                                 "owns "]), f"t1: {n.name}: restarting, done, ready, rebalanced, owns, in order")
            owns = [int(m.group(1)) for m in (re.match(r"owns (\d+) shards? after", g) for g in got) if m]
            check(owns and owns[0] > 0, f"t1: {n.name} hosted shards before troupectl went on: {owns}")
            new = n.pid()
            check(new != before[n.name] and not runs(before[n.name]) and runs(new) and is_payment_service(new),
                  f"t1: {n.name} runs a new process (pid {before[n.name]} -> {new}), the old one gone")
            check(n.ready(), f"t1: {n.name} is ready after the update")
            check((n.shards_hosted() or 0) > 0, f"t1: {n.name} hosts shards after the update ({n.shards_hosted()})")
        # Nothing settled before is lost: every payment reads Completed through any node.
        states = [call(nodes[i % 3].api, "GET", f"/payments/{pid}")[1].get("status") for i, pid in enumerate(paid)]
        check(states.count("Completed") == len(paid), f"t1: the {len(paid)} payments settled before are Completed "
              f"after it ({states.count('Completed')})")
        print(f"  rolling update of 3 nodes: {took:.1f} s; test 1 took {time.time() - t0:.1f} s", flush=True)
    finally:
        gw.stop(signal.SIGKILL)


# --- 2: a node that does not come back stops the update --------------------------------------


def test_broken_node_stops_the_update(work, nodes, pg, redis):
    t0 = time.time()
    gw, gw_port = gateway(BIN, work, "t2-gateway", *FAST_GATEWAY)
    try:
        start_cluster(work, nodes, "t2", gw_port, pg, redis)
        first, broken, last = nodes[0], nodes[1], nodes[2]
        with open(f"{work}/{broken.name}-broken.toml", "w") as f:
            f.write(open(broken.config).read().replace("shard_count = 16", 'shard_count = "sixteen"'))
        broken.write_restart_script(f"{work}/{broken.name}-broken.toml")
        before = {n.name: n.pid() for n in nodes}
        code, out, err, took = roll(last, "--restart", RESTART.format(work=work), "--nodes",
                                    f"{first.name},{broken.name},{last.name}", "--exit-timeout", "60",
                                    "--ready-timeout", "6", "--shards-timeout", "30")
        check(code == 1, f"t2: troupectl exits 1 ({code}) after {took:.1f} s")
        why = (f"troupectl: rolling update stopped at {broken.name} (2/3): not back within 6s after the restart "
               f"command (--ready-timeout): cannot reach the node at http://127.0.0.1:{broken.admin}")
        check(err.startswith(why) and err.rstrip().endswith(f"; not restarted: {last.name}"),
              f"t2: it says which node and why, and what it left: {err.strip()}")
        check(progress_of(out, last.name) == [], f"t2: no progress line for {last.name}")
        stops = [r[0] for r in restart_log(work) if r[1] == "stopping" and r[0].startswith("t2-")]
        check(stops == [first.name, broken.name], f"t2: the restart scripts of {first.name}, {broken.name} ran, "
              f"not {last.name}'s: {stops}")
        check(first.pid() != before[first.name] and first.ready(), f"t2: {first.name} was restarted and is ready")
        check(last.pid() == before[last.name] and runs(last.pid()) and last.ready(),
              f"t2: {last.name} was not touched: same pid {last.pid()}, ready")
        with open(broken.log) as f:
            log = f.read()
        check("sixteen" in log or "shard_count" in log, f"t2: {broken.name}'s log names the bad setting: "
              + (log.strip().splitlines() or [""])[-1])
        print(f"  test 2 took {time.time() - t0:.1f} s", flush=True)
    finally:
        gw.stop(signal.SIGKILL)


def run(test, work, *servers):
    """Runs one test; the nodes it started are killed when it ends, pass or fail."""
    nodes = []
    try:
        test(work, nodes, *servers)
    except Exception as e:  # noqa: BLE001 - a test that raises is a failure, and the next one still runs
        traceback.print_exc()
        check(False, f"{test.__name__} raised {type(e).__name__}: {e}")
    finally:
        for n in nodes:
            n.kill()


def main():
    if not shutil.which("redis-server") or not postgres_bin_dir():
        print("skipped: needs redis-server and the PostgreSQL server binaries (scripts/setup-deps)")
        sys.exit(77)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ctest's timeout: clean up first
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="troupe-rolling-test-")
    pg = redis = None
    try:
        pg = Postgres()
        redis = Redis(work)
        print("== 1: a rolling update of the three nodes ==", flush=True)
        run(test_rolling_update, work, pg, redis)
        print("== 2: a node restarted with a broken config stops the update ==", flush=True)
        run(test_broken_node_stops_the_update, work, pg, redis)
    finally:
        if redis:
            redis.stop()
        if pg:
            pg.stop()
        if failures:
            print(f"logs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"took {time.time() - t0:.1f} s", flush=True)
    finish()


if __name__ == "__main__":
    main()
