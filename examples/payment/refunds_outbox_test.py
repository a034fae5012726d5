#!/usr/bin/env python3
"""Refunds from the stored cancel, exactly once at the gateway, black box:
the real payment_service (SQLite journal in its data directory) and
payment_gateway processes on ports of 127.0.0.1, driven through the payment
API; every refund counted at the gateway by payment id (GET /refunds).

1. Ten repeated cancels, one refund: five cancels of a completed payment at
   once, then five one by one. Each is answered 200 Cancelled with the
   refunded amount, the payment's log holds one PaymentCancelled, and the
   gateway has refunded the payment once.
2. kill -9 between the stored cancel and the refund at the gateway: the
   gateway holds every request unanswered, so the cancel is stored and
   answered but its refund never gets through; the service is SIGKILLed
   with the refund held, the gateway replaced by one that answers, the
   service started again on its data directory: the refund reaches the
   gateway, once.
3. kill -9 while the gateway is paying the refund: the gateway takes 3 s to
   answer a refund; the service is SIGKILLed right after the cancel's reply,
   its refund on its way. Started again, it sends the refund again with the
   same idempotency key; the gateway answers the repeat from the first
   request (409 while that is on its way, then its 200) and pays once.

Usage: refunds_outbox_test.py BIN_DIR
proves: A1 (a refund derived from the stored PaymentCancelled runs after it
is stored, survives a kill -9 on either side of the gateway call, is retried
until it succeeds, and carries an idempotency key the gateway uses to drop
duplicates: 0 lost, 0 doubled)
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import Proc, call, check, failures, finish, free_port, payment_node, wait_until  # noqa: E402
from e2e_support import run_test as run  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
ANSWERING = ("--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0", "--hang-rate", "0")


def gateway(work, name, port, *flags):
    """payment_gateway on `port` (fixed: a replacement takes the same one)."""
    g = Proc([f"{BIN}/payment_gateway", "--port", str(port), *flags], f"{work}/{name}.log")
    g.wait_line(r"listening on http://")
    return g


def node_config(work, name, gw_port):
    return f"""[node]
id = "{name}"
data_dir = "{work}/{name}-data"
[admin]
port = 0
[payment]
port = 0
gateway = "127.0.0.1:{gw_port}"
refund_timeout_ms = 1000
"""


def start_node(work, name, life, gw_port):
    """The node `name` (same id and data directory every life); its log is
    name-life.log. (Proc, api port, admin port)."""
    return payment_node(BIN, work, f"{name}-{life}", node_config(work, name, gw_port))


def refunds(gw_port):
    s, r = call(gw_port, "GET", "/refunds")
    return r["refunds"] if s == 200 else {}


def stats(gw_port):
    return call(gw_port, "GET", "/stats")[1]


def settle(api, tag):
    s, r = call(api, "POST", "/payments", {"customer": tag, "order_id": tag, "amount": 4200})
    check(s == 200 and r["status"] == "Completed", f"{tag}: the payment settles: {s} {r}")
    return r["id"]


def summary(tag, asked, at_gateway):
    missing = [p for p in asked if at_gateway.get(p, 0) == 0]
    twice = [p for p in asked if at_gateway.get(p, 0) > 1]
    print(f"  {tag}: refunds asked {len(asked)}, at the gateway {sum(at_gateway.values())} "
          f"({len(at_gateway)} payments), missing {len(missing)}, twice {len(twice)}", flush=True)
    return missing, twice


def test_ten_cancels_one_refund(work, procs):
    port = free_port()
    gw = gateway(work, "t1-gateway", port, *ANSWERING)
    procs.append(gw)
    n, api, _ = start_node(work, "t1", 1, port)
    procs.append(n)
    pid = settle(api, "t1-o1")
    answers = []
    clicks = [threading.Thread(target=lambda: answers.append(call(api, "POST", f"/payments/{pid}/cancel")))
              for _ in range(5)]
    for t in clicks:
        t.start()
    for t in clicks:
        t.join()
    for _ in range(5):
        answers.append(call(api, "POST", f"/payments/{pid}/cancel"))
    ok = [r for s, r in answers if s == 200 and r["status"] == "Cancelled" and r["refunded"] == 4200]
    check(len(ok) == 10, f"t1: ten cancels, each answered 200 Cancelled with the refund ({len(ok)}) {answers[:2]}")
    check(len({r["events"] for r in ok}) == 1 and ok[0]["events"] == 3,
          f"t1: the log holds one PaymentCancelled after the settlement's two: {[r['events'] for r in ok]}")
    wait_until(lambda: refunds(port).get(pid), 15)
    time.sleep(1)  # anything more would arrive now
    missing, twice = summary("test 1 (ten cancels)", [pid], refunds(port))
    check(not missing and not twice, f"t1: the gateway refunded the payment once: {refunds(port)}")
    st = stats(port)
    check(st["refunds"] == 1, f"t1: the gateway sent one refund answer in all: {st}")


def settled_then(work, procs, tag, *flags):
    """Node `tag` settles a payment through an answering gateway, which is
    then replaced, on its port, by one started with `flags`. (port, the
    node's Proc, its api port, the payment id, the new gateway)."""
    port = free_port()
    gw = gateway(work, f"{tag}-gateway-a", port, *ANSWERING)
    n, api, _ = start_node(work, tag, 1, port)
    procs += [gw, n]
    pid = settle(api, f"{tag}-o1")
    gw.stop()
    g2 = gateway(work, f"{tag}-gateway-b", port, *flags)
    procs.append(g2)
    return port, n, api, pid, g2


def test_kill_before_the_refund_gets_through(work, procs):
    # Every request held, never answered: the refund cannot get through.
    port, n, api, pid, hang = settled_then(work, procs, "t2", "--hang-rate", "1", "--decline-rate", "0",
                                           "--error-rate", "0")
    s, r = call(api, "POST", f"/payments/{pid}/cancel")
    check(s == 200 and r["status"] == "Cancelled" and r["refunded"] == 4200, f"t2: the cancel is stored: {s} {r}")
    held = wait_until(lambda: stats(port)["hung"] >= 1, 15)
    check(held, "t2: the service sent the refund and the gateway holds it unanswered")
    n.p.send_signal(signal.SIGKILL)
    n.p.wait()
    print(f"  killed the service (kill -9) with its refund held at the gateway ({stats(port)['hung']} held)",
          flush=True)
    hang.stop(signal.SIGKILL)
    gw2 = gateway(work, "t2-gateway-c", port, *ANSWERING)
    procs.append(gw2)
    t0 = time.time()
    n2, _, _ = start_node(work, "t2", 2, port)
    procs.append(n2)
    paid = wait_until(lambda: refunds(port).get(pid), 20)
    check(paid, f"t2: after the restart the refund reached the gateway ({time.time() - t0:.1f} s)")
    time.sleep(1.5)
    missing, twice = summary("test 2 (kill -9, refund held)", [pid], refunds(port))
    check(not missing and not twice, f"t2: once: {refunds(port)}")


def test_kill_while_the_gateway_pays(work, procs):
    port, n, api, pid, _ = settled_then(work, procs, "t3", "--latency-ms", "3000", "--decline-rate", "0",
                                        "--error-rate", "0", "--hang-rate", "0")
    s, r = call(api, "POST", f"/payments/{pid}/cancel")
    check(s == 200 and r["status"] == "Cancelled", f"t3: the cancel is stored: {s} {r}")
    on_its_way = wait_until(lambda: stats(port)["in_flight"] >= 1, 10, 0.02)
    n.p.send_signal(signal.SIGKILL)
    n.p.wait()
    check(on_its_way and not refunds(port), "t3: killed (kill -9) with the refund on its way at the gateway, unpaid")
    n2, _, _ = start_node(work, "t3", 2, port)
    procs.append(n2)
    paid = wait_until(lambda: refunds(port).get(pid), 20)
    check(paid, "t3: the refund was paid")
    # The restarted service's try is answered from the first request's once
    # that is paid: wait for the repeat to have been answered.
    repeated = wait_until(lambda: stats(port)["refunds_repeated"] >= 1, 20)
    time.sleep(1.5)
    st = stats(port)
    check(repeated, f"t3: the restarted service sent the refund again with its key, answered as a repeat: {st}")
    missing, twice = summary("test 3 (kill -9, refund being paid)", [pid], refunds(port))
    check(not missing and not twice and st["refunds"] == 1, f"t3: paid once: {refunds(port)} {st}")


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="troupe-refunds-outbox-")
    try:
        print("== 1: ten repeated cancels, one refund ==", flush=True)
        run(test_ten_cancels_one_refund, work)
        print("== 2: kill -9 with the stored refund held at the gateway ==", flush=True)
        run(test_kill_before_the_refund_gets_through, work)
        print("== 3: kill -9 while the gateway pays the refund ==", flush=True)
        run(test_kill_while_the_gateway_pays, work)
    finally:
        if failures:
            print(f"logs kept in {work}", flush=True)
        else:
            subprocess.run(["rm", "-rf", work])
    print(f"took {time.time() - t0:.1f} s", flush=True)
    finish()


if __name__ == "__main__":
    main()
