#!/usr/bin/env python3
"""The admin API's bearer token, black box: a real payment_service process
with [admin] token_file, its admin port called over HTTP.

Without the token, or with a wrong one, POST /drain, POST /rebalance and
POST /workers/{group}/sync answer 401 with WWW-Authenticate and change
nothing (the node stays ready and serving payments, its shard view is the
same); reads answer 401 too unless read_open; /health stays open. With the
token they work. A rotated token file is read again without a restart, and
a config naming an empty token file does not start.

Usage: admin_security_test.py BIN_DIR
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import call, check, clean_up, finish, gateway, payment_node, wait_until  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "build/debug"
TOKEN = "tok-7f3a9c1e5b2d48c0a6e1"


def admin(port, method, path, token=None, body=None):
    """(status, headers, body text) of an admin call; errors are returned."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, dict(r.headers), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode(errors="replace")


def write_token(path, text):
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def config(work, name, gw_port, admin_extra):
    return f"""[node]
id = "{name}"
data_dir = "{work}/{name}-data"
drain_grace_ms = 200
[admin]
port = 0
{admin_extra}
[entities]
stop_timeout_ms = 5000
[payment]
port = 0
gateway = "127.0.0.1:{gw_port}"
"""


# proves: S2
def main():
    work = tempfile.mkdtemp(prefix="troupe-admin-security-")
    procs = []
    try:
        gw, gw_port = gateway(BIN, work, "gw", "--latency-ms", "1", "--decline-rate", "0", "--error-rate", "0",
                              "--hang-rate", "0")
        procs.append(gw)
        token_file = f"{work}/admin.token"
        write_token(token_file, TOKEN + "\n")
        n1, api, port = payment_node(BIN, work, "n1", config(work, "n1", gw_port, f'token_file = "{token_file}"'))
        procs.append(n1)
        check(wait_until(lambda: admin(port, "GET", "/ready", TOKEN)[0] == 200, 30), "the node is ready")

        s, _, before = admin(port, "GET", "/cluster", TOKEN)
        check(s == 200, f"GET /cluster with the token: {s}")
        before = json.loads(before)

        mutations = [("POST", "/drain"), ("POST", "/rebalance"), ("POST", "/workers/devices/sync")]
        reads = [("GET", "/api/overview"), ("GET", "/cluster"), ("GET", "/metrics"), ("GET", "/ready"),
                 ("GET", "/workers"), ("GET", "/entities/payment/pay-o1")]
        for method, path in mutations + reads:
            for who, token in (("no token", None), ("a wrong token", "tok-wrong"), ("a prefix", TOKEN[:-1]),
                               ("a longer token", TOKEN + "0")):
                s, h, text = admin(port, method, path, token)
                check(s == 401 and h.get("WWW-Authenticate") == 'Bearer realm="troupe"',
                      f"{method} {path} with {who}: 401 with WWW-Authenticate ({s}, {h.get('WWW-Authenticate')})")
                check(TOKEN[:6] not in text, f"{method} {path}: the refusal gives no hint of the token")

        s, _, _ = admin(port, "GET", "/health")
        check(s == 200, f"/health stays open without a token: {s}")
        s, _, page = admin(port, "GET", "/")
        check(s == 200 and "<html" in page and "tok-" not in page,
              f"the dashboard's page (no data in it) loads without a token, to ask for one: {s}")
        check(n1.p.poll() is None, "the node still runs after the refused drain")
        s, _, _ = admin(port, "GET", "/ready", TOKEN)
        check(s == 200, f"the refused drain changed nothing: /ready {s}")
        s, r = call(api, "POST", "/payments", {"customer": "c1", "order_id": "o1", "amount": 100})
        check(s == 200 and r["status"] == "Completed", f"the node keeps serving payments: {s}")
        s, _, after = admin(port, "GET", "/cluster", TOKEN)
        after = json.loads(after)
        check(s == 200 and after["shards"] == before["shards"] and after["members"] == before["members"],
              "the refused rebalance moved nothing (the shard view is the same)")

        for method, path in reads:
            s, _, _ = admin(port, method, path, TOKEN)
            check(s in (200, 404), f"{method} {path} with the token is served: {s}")
        s, _, text = admin(port, "POST", "/rebalance", TOKEN)
        check(s == 409 and "not_clustered" in text, f"POST /rebalance with the token runs (a lone node: 409): {s}")
        s, _, text = admin(port, "POST", "/workers/devices/sync", TOKEN)
        check(s == 404 and "no worker groups" in text, f"POST /workers/.../sync with the token runs: {s}")

        # Rotation: the file is replaced while the node runs.
        write_token(token_file, "tok-rotated-2\n")
        s, _, _ = admin(port, "GET", "/api/overview", TOKEN)
        check(s == 401, f"after rotation the old token is refused: {s}")
        s, _, _ = admin(port, "GET", "/api/overview", "tok-rotated-2")
        check(s == 200, f"after rotation the new token works without a restart: {s}")

        s, _, text = admin(port, "POST", "/drain", "tok-rotated-2")
        check(s == 202 and json.loads(text)["draining"] is True, f"POST /drain with the token drains: {s}")
        check(wait_until(lambda: n1.p.poll() is not None, 30), "the drained node stops")

        # read_open: reads need no token, writes still do.
        write_token(token_file, TOKEN + "\n")
        n2, _, port2 = payment_node(BIN, work, "n2", config(work, "n2", gw_port,
                                                            f'token_file = "{token_file}"\nread_open = true'))
        procs.append(n2)
        for method, path in (("GET", "/api/overview"), ("GET", "/metrics"), ("GET", "/cluster")):
            s, _, _ = admin(port2, method, path)
            check(s == 200, f"read_open: {method} {path} without a token: {s}")
        for method, path in mutations:
            s, _, _ = admin(port2, method, path)
            check(s == 401, f"read_open: {method} {path} without a token is still refused: {s}")
        s, _, _ = admin(port2, "GET", "/ready")
        check(s == 200 and n2.p.poll() is None, "read_open: the refused drain changed nothing")

        # A token file that is empty: the node does not start, naming the setting.
        empty = f"{work}/empty.token"
        write_token(empty, "\n")
        path = f"{work}/bad.toml"
        with open(path, "w") as f:
            f.write(config(work, "bad", gw_port, f'token_file = "{empty}"'))
        p = subprocess.run([f"{BIN}/payment_service", "--config", path], capture_output=True, text=True, timeout=60)
        check(p.returncode == 1 and "admin.token_file" in p.stderr + p.stdout and "holds no token" in p.stderr + p.stdout,
              f"an empty token file stops the start naming admin.token_file: {p.returncode} {p.stderr.strip()[-200:]}")
    finally:
        clean_up(work, procs)
    finish()


if __name__ == "__main__":
    main()
