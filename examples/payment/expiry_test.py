#!/usr/bin/env python3
"""Payments created and never settled expire, black box: a real
payment_service (SQLite journal) with [payment] expire_after = "2s" and
payment_gateway. A payment created with settle=false becomes Cancelled with
detail "expired"; one settled or cancelled in time does not; one created
just before a kill -9 expires after the restart on the same files;
/metrics counts the expiries; a bad expire_after stops the service at
start with an error naming it. With PostgreSQL installed, the same
expiry with the journal (and so the reminders) in a PostgreSQL schema.

Usage: expiry_test.py BIN_DIR
"""

import os
import signal
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import (Postgres, Proc, call, check, finish, gateway, get_text, payment_node,  # noqa: E402
                          postgres_bin_dir, wait_until)

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"


def config(work, gw_port, expire_after, journal=""):
    return f"""[node]
id = "n1"
data_dir = "{work}/n1-data"
{journal}
[admin]
port = 0
[entities]
stop_timeout_ms = 2000
[payment]
port = 0
gateway = "127.0.0.1:{gw_port}"
expire_after = "{expire_after}"
expire_rate = 50
"""


def create(api, pid, settle=False):
    body = {"id": pid, "customer": "c1", "order_id": f"ord-{pid}", "amount": 700, "settle": settle}
    return call(api, "POST", "/payments", body)


def status(api, pid):
    return call(api, "GET", f"/payments/{pid}")[1]


def main():
    work = tempfile.mkdtemp(prefix="payment-expiry-")
    procs = []
    try:
        gw, gw_port = gateway(BIN, work, "gw", "--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0", "--hang-rate", "0")
        procs.append(gw)

        # A bad expire_after: the service refuses to start and says why.
        path = f"{work}/bad.toml"
        with open(path, "w") as f:
            f.write(config(work, gw_port, "5 minutes"))
        bad = Proc([f"{BIN}/payment_service", "--config", path], f"{work}/bad.log")
        rc = bad.p.wait(timeout=60)
        bad.out.close()
        with open(f"{work}/bad.log") as f:
            text = f.read()
        check(rc != 0 and "payment.expire_after" in text, f"a bad expire_after stops the start (rc {rc}): {text[-200:]!r}")

        n1, api, admin = payment_node(BIN, work, "n1", config(work, gw_port, "2s"))
        procs.append(n1)
        s, r = create(api, "e-1")
        check(s == 201 and r["status"] == "WaitingForRequest", f"created without settling ({s} {r})")
        create(api, "e-2")
        s, r = call(api, "POST", "/payments/e-2/settle", {})
        check(s == 200 and r["status"] == "Completed", f"a created payment settles in time ({s} {r})")
        create(api, "e-3")
        s, r = call(api, "POST", "/payments/e-3/cancel")
        check(s == 200 and r["status"] == "Cancelled", f"a created payment is cancelled in time ({s} {r})")

        got = wait_until(lambda: status(api, "e-1")["detail"] == "expired" and status(api, "e-1"), 15)
        check(bool(got) and got["status"] == "Cancelled" and got["refunded"] == 0,
              f"the unsettled payment expired: {status(api, 'e-1')}")
        time.sleep(1.5)
        check(status(api, "e-2")["status"] == "Completed", "the settled one did not expire")
        e3 = status(api, "e-3")
        check(e3["status"] == "Cancelled" and e3["detail"] == "" and e3["events"] == 2,
              f"the cancelled one did not expire: {e3}")
        _, metrics = get_text(admin, "/metrics")
        check("payment_expiry_delivered_total 1" in metrics,
              "/metrics: payment_expiry_delivered_total 1 (" +
              " ".join(l for l in metrics.splitlines() if l.startswith("payment_expiry_delivered")) + ")")

        # Created, then a kill -9 before it is due: it expires after the restart.
        create(api, "e-4")
        n1.stop(signal.SIGKILL)
        procs.remove(n1)
        time.sleep(2.5)
        n1, api, admin = payment_node(BIN, work, "n1", config(work, gw_port, "2s"))
        procs.append(n1)
        got = wait_until(lambda: status(api, "e-4")["detail"] == "expired", 15)
        check(bool(got), f"a payment created before a kill -9 expires after the restart: {status(api, 'e-4')}")
        n1.stop(signal.SIGKILL)
        procs.remove(n1)

        if postgres_bin_dir() is not None:
            expires_in_postgres(work, gw_port, procs)
        else:
            print("skip the PostgreSQL journal: no PostgreSQL installed", flush=True)
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)
        os.system(f"rm -rf {work}")
    finish()


def expires_in_postgres(work, gw_port, procs):
    pg = Postgres()
    try:
        journal = f'[journal]\nbackend = "postgres"\npostgres = "{pg.conninfo}"\nschema = "pay"'
        n2, api, _ = payment_node(BIN, work, "n2", config(work, gw_port, "2s", journal))
        procs.append(n2)
        create(api, "pg-1")
        got = wait_until(lambda: status(api, "pg-1")["detail"] == "expired", 15)
        check(bool(got), f"with the journal in PostgreSQL it expires too: {status(api, 'pg-1')}")
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)
        procs.clear()
        pg.stop()


if __name__ == "__main__":
    main()
