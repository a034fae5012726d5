"""Helpers of the payment example's process tests (service_test.py,
refunds_cluster_test.py): checks, HTTP calls, child processes, and the
servers a test starts for itself (Redis, PostgreSQL) on free ports with
data directories of their own. Standard library only.

Every child is started with PR_SET_PDEATHSIG (SIGKILL) where the platform
has it, so a test killed outright leaves no payment process behind; the
tests still stop everything themselves in a `finally`.
"""

import ctypes
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request

failures = []


def run_test(test, work, *servers):
    """Runs test(work, procs, *servers); whatever it started (the Procs it
    put in procs) is killed when it ends, pass or fail. A test that raises
    is a failure, and the next one still runs."""
    procs = []
    try:
        test(work, procs, *servers)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        check(False, f"{test.__name__} raised {type(e).__name__}: {e}")
    finally:
        for p in procs:
            p.stop(signal.SIGKILL)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def finish():
    """Prints the outcome and exits 1 if any check failed."""
    if failures:
        print(f"{len(failures)} check(s) failed", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


def call(port, method, path, body=None, raw=None, timeout=20):
    """(status, JSON body) of an HTTP request to 127.0.0.1:port; an error
    status is returned, not raised (its body as text when not JSON)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode(errors="replace")


def get_text(port, path, timeout=20):
    """(status, text) of a GET, e.g. /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_until(probe, timeout, interval=0.1):
    """Calls probe() until it returns something true or `timeout` seconds
    passed; returns its last value. A probe that raises (a server not up
    yet) counts as false."""
    end = time.time() + timeout
    while True:
        try:
            got = probe()
        except (OSError, ValueError):
            got = None
        if got or time.time() >= end:
            return got
        time.sleep(interval)


def free_port():
    """A TCP port free on 127.0.0.1 right now (for servers that cannot take 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Proc:
    """A child process whose output goes to a file; `wait_line` waits for a pattern."""

    def __init__(self, argv, log):
        self.log = log
        self.out = open(log, "w")
        self.p = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def wait_line(self, pattern, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            with open(self.log) as f:
                m = re.search(pattern, f.read())
            if m:
                return m
            if self.p.poll() is not None:
                break
            time.sleep(0.05)
        with open(self.log) as f:
            raise RuntimeError(f"'{pattern}' not seen; log:\n{f.read()}")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()
        finally:
            self.out.close()


def gateway(bin_dir, work, name, *flags):
    """payment_gateway on a free port: (Proc, port)."""
    g = Proc([f"{bin_dir}/payment_gateway", "--port", "0", *flags], f"{work}/{name}.log")
    return g, int(g.wait_line(r"listening on http://[^:]+:(\d+)").group(1))


def payment_node(bin_dir, work, name, config, timeout=60):
    """payment_service with `config` (TOML text) written to work/name.toml:
    (Proc, payment API port, admin port)."""
    path = f"{work}/{name}.toml"
    with open(path, "w") as f:
        f.write(config)
    n = Proc([f"{bin_dir}/payment_service", "--config", path], f"{work}/{name}.log")
    m = n.wait_line(r"payments on http://[^:]+:(\d+), dashboard on http://[^:]+:(\d+)/", timeout)
    return n, int(m.group(1)), int(m.group(2))


def make_certs(directory, *node_ids):
    """A CA and a certificate per node id in `directory` (scripts/make-certs);
    returns `directory` for cluster_tls()."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make-certs")
    subprocess.run([script, directory, *node_ids], check=True, stdout=subprocess.DEVNULL)
    return directory


def cluster_tls(name, tls_dir):
    """The [cluster] lines choosing how node `name` talks to the others:
    mutual TLS with the files make_certs() wrote into `tls_dir`, or plain
    TCP (insecure = true) when `tls_dir` is None."""
    if tls_dir is None:
        return "insecure = true\n"
    return f"""[cluster.tls]
cert = "{tls_dir}/{name}.crt"
key = "{tls_dir}/{name}.key"
ca = "{tls_dir}/ca.crt"
"""


def fixed_port_node_config(work, name, *, api, admin, peer, gw_port, pg, schema, redis, prefix,
                           drain_grace_ms, entity_shards, jobs_shards=6, tls_dir=None):
    """The TOML of a clustered payment node on fixed ports (so it comes back
    where a balancer or troupectl looks for it after a restart); TLS between
    the nodes with the certificates in `tls_dir` (make_certs), else plain TCP."""
    return f"""[node]
id = "{name}"
data_dir = "{work}/{name}-data"
drain_grace_ms = {drain_grace_ms}
[admin]
port = {admin}
[journal]
backend = "postgres"
postgres = "{pg.conninfo}"
schema = "{schema}"
[cluster]
redis = "127.0.0.1:{redis.port}"
key_prefix = "{prefix}"
listen_port = {peer}
heartbeat_ms = 500
liveness_threshold_ms = 3000
takeover_margin_ms = 500
{cluster_tls(name, tls_dir)}[jobs]
shard_count = {jobs_shards}
[entities]
shard_count = {entity_shards}
stop_timeout_ms = 5000
[payment]
port = {api}
gateway = "127.0.0.1:{gw_port}"
processing_timeout_ms = 5000
"""


def clean_up(work, procs, *servers):
    """Kills `procs`, stops `servers` (a Redis or Postgres; None is skipped)
    and removes `work`, unless a check failed: then it says where the logs
    are kept."""
    for p in procs:
        p.stop(signal.SIGKILL)
    for s in servers:
        if s:
            s.stop()
    if failures:
        print(f"logs kept in {work}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)


def postgres_bin_dir():
    """The newest /usr/lib/postgresql/*/bin with initdb and pg_ctl, or None."""
    dirs = [d for d in glob.glob("/usr/lib/postgresql/*/bin")
            if os.access(f"{d}/initdb", os.X_OK) and os.access(f"{d}/pg_ctl", os.X_OK)]
    return sorted(dirs, key=lambda d: [int(x) for x in re.findall(r"\d+", d)])[-1] if dirs else None


class Redis:
    """redis-server on a free port of 127.0.0.1, no persistence."""

    def __init__(self, work):
        self.port = free_port()
        os.makedirs(f"{work}/redis", exist_ok=True)
        self.proc = Proc(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", f"{work}/redis",
                          "--save", "", "--appendonly", "no"], f"{work}/redis.log")
        try:
            self.proc.wait_line("Ready to accept connections")
        except BaseException:
            self.stop()
            raise

    def stop(self):
        self.proc.stop()


class Postgres:
    """A PostgreSQL server of its own (initdb into a temp dir, pg_ctl on a
    free port of 127.0.0.1) with a database `db`. As root the server runs
    as the `postgres` user: initdb refuses root."""

    def __init__(self, db="troupe"):
        self.bin = postgres_bin_dir()
        self.dir = tempfile.mkdtemp(prefix="troupe-e2e-pg-")
        self.as_ = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_ = ["runuser", "-u", "postgres", "--"]
        self.data = f"{self.dir}/data"
        self.started = False
        self.port = free_port()
        self.conninfo = f"host=127.0.0.1 port={self.port} user=postgres dbname={db} connect_timeout=5"
        try:
            self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
            # fsync=off: the tests never crash the server, only the nodes.
            self.started = True
            self._run("pg_ctl", "-D", self.data, "-l", f"{self.dir}/server.log", "-w", "-t", "60", "-o",
                      f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.dir} "
                      "-c fsync=off", "start")
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", db)
        except BaseException:
            self.stop()
            raise

    def _run(self, tool, *args):
        p = subprocess.run([*self.as_, f"{self.bin}/{tool}", *args], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"{tool} failed ({p.returncode}): {p.stdout}{p.stderr}")

    def stop(self):
        if self.started:
            self.started = False
            subprocess.run([*self.as_, f"{self.bin}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"],
                           capture_output=True, timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)


def run_cluster_tests(prefix, *tests):
    """Runs each test(work, procs, pg, redis) (run_test) against one
    PostgreSQL and one Redis started here, in a work directory named
    `prefix`..., stops them, and ends as finish() does. Exit 77 (skipped)
    without redis-server or the PostgreSQL server binaries."""
    if not shutil.which("redis-server") or not postgres_bin_dir():
        print("skipped: needs redis-server and the PostgreSQL server binaries (scripts/setup-deps)")
        sys.exit(77)
    # ctest's timeout and Ctrl-C: stop everything before going.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.time()
    work = tempfile.mkdtemp(prefix=prefix)
    pg = redis = None
    try:
        pg = Postgres()
        redis = Redis(work)
        for test in tests:
            print(f"== {test.__name__} ==", flush=True)
            run_test(test, work, pg, redis)
    finally:
        clean_up(work, [], redis, pg)
    print(f"took {time.time() - t0:.1f} s", flush=True)
    finish()
