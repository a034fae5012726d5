#!/usr/bin/env python3
"""End-to-end test of the node dashboard in a real browser.

Drives Debian's chromium through chromedriver over the W3C WebDriver HTTP
protocol, with nothing but the Python standard library (no selenium), so the
test runs wherever the node's build runs. It opens the dashboard of a live
node, waits for the panels to fill in, checks what they show (the health
banner included: shown exactly when the node reports a failing service),
presses Rebalance, looks up an entity and saves a screenshot. With
--token-file (a node with [admin] token_file) it first checks that the page
asks for the token, asks again after a wrong one, and keeps the right one.

    dashboard_e2e.py --url http://127.0.0.1:8081/ --screenshot out.png \\
        --expect-node n1 [--expect-type payment] \\
        [--lookup-type payment --lookup-id p-1] [--expect-members 1] [--expect-projections 0] \\
        [--timeout-s 60] \\
        [--token-file admin.token]

Exit status: 0 when every check passed; 1 when one failed (what was expected
and what was seen go to stderr, and the screenshot is saved as
<screenshot>.failure.png beside the page source, <screenshot>.failure.html);
77 (ctest's SKIP_RETURN_CODE convention) when chromium or chromedriver is not
installed. doc/dashboard.md describes the page and this test.
"""

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SKIP = 77

# Headless, and nothing that talks to the network on its own: the test must
# pass on a machine without internet access and must not wait on one.
CHROME_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--window-size=1280,1000",
]

# Taller pages are cut here, to keep the image a sensible size.
MAX_SCREENSHOT_HEIGHT = 4000

# The W3C name of the key that carries an element reference.
ELEMENT_KEY = "element-6066-11e4-a52e-4f735466cecf"


class CheckFailed(Exception):
    """A check did not pass before the deadline: what was expected, what was seen."""

    def __init__(self, expected, seen):
        super().__init__(f"expected: {expected}\n  seen:     {seen}")
        self.expected = expected
        self.seen = seen


class WebDriverError(Exception):
    """An error answer from chromedriver (e.g. 'stale element reference')."""

    def __init__(self, status, error, message):
        super().__init__(f"{error}: {message} (HTTP {status})")
        self.error = error


def log(msg):
    print(f"[dashboard_e2e] {msg}", flush=True)


# ---------------------------------------------------------------------------- WebDriver client

class WebDriver:
    """The few W3C WebDriver commands the test needs, over plain HTTP."""

    def __init__(self, base_url):
        self.base = base_url.rstrip("/")
        self.session = None

    def _call(self, method, path, body=None, timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json; charset=utf-8"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                payload = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                value = json.loads(e.read()).get("value", {})
            except ValueError:
                value = {}
            message = (str(value.get("message", "")).splitlines() or [""])[0]
            raise WebDriverError(e.code, value.get("error", "unknown error"), message) from None
        return payload.get("value")

    def status_ready(self):
        try:
            return bool((self._call("GET", "/status", timeout=2) or {}).get("ready"))
        except (OSError, WebDriverError, ValueError):
            return False

    def new_session(self, user_data_dir):
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": CHROME_ARGS + [f"--user-data-dir={user_data_dir}"],
            },
        }}}
        value = self._call("POST", "/session", caps, timeout=120)
        self.session = value["sessionId"]

    def quit(self):
        if self.session is not None:
            session, self.session = self.session, None
            self._call("DELETE", f"/session/{session}", timeout=30)

    def _s(self, path):
        return f"/session/{self.session}{path}"

    def get(self, url):
        self._call("POST", self._s("/url"), {"url": url})

    def find_all(self, css):
        found = self._call("POST", self._s("/elements"), {"using": "css selector", "value": css})
        return [e[ELEMENT_KEY] for e in found]

    def find(self, css):
        """The first element matching css, or None."""
        found = self.find_all(css)
        return found[0] if found else None

    def text(self, element):
        return self._call("GET", self._s(f"/element/{element}/text"))

    def attribute(self, element, name):
        return self._call("GET", self._s(f"/element/{element}/attribute/{name}"))

    def click(self, element):
        self._call("POST", self._s(f"/element/{element}/click"), {})

    def clear(self, element):
        self._call("POST", self._s(f"/element/{element}/clear"), {})

    def send_keys(self, element, text):
        self._call("POST", self._s(f"/element/{element}/value"), {"text": text})

    def execute(self, script, *args):
        return self._call("POST", self._s("/execute/sync"), {"script": script, "args": list(args)})

    def set_window_size(self, width, height):
        self._call("POST", self._s("/window/rect"), {"width": width, "height": height})

    def screenshot(self, path):
        png = base64.b64decode(self._call("GET", self._s("/screenshot")))
        with open(path, "wb") as f:
            f.write(png)

    def source(self):
        return self._call("GET", self._s("/source"))


# ---------------------------------------------------------------------------- helpers

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def css_string(value):
    """value as a quoted CSS string, for attribute selectors."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def testid(name, **attrs):
    sel = f"[data-testid={css_string(name)}]"
    for k, v in attrs.items():
        sel += f"[data-{k.replace('_', '-')}={css_string(v)}]"
    return sel


class Waiter:
    """Polls a check until it passes or the run's deadline passes.

    A check returns (passed, seen). WebDriver errors inside a check (an
    element replaced between finding and reading it) count as "not yet".
    """

    def __init__(self, deadline):
        self.deadline = deadline

    def until(self, expected, check, interval=0.25):
        seen = "nothing yet"
        while True:
            try:
                passed, seen = check()
                if passed:
                    return seen
            except WebDriverError as e:
                seen = f"webdriver error: {e}"
            if time.monotonic() >= self.deadline:
                raise CheckFailed(expected, seen)
            time.sleep(interval)


# The node's admin token (--token-file), for the test's own direct reads.
TOKEN = None


def fetch_overview(page_url):
    """The node's overview, read directly, to know what the page should show."""
    url = urllib.parse.urljoin(page_url, "api/overview")
    req = urllib.request.Request(url)
    if TOKEN:
        req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError) as e:
        log(f"could not read {url} directly ({e}); shard check falls back to 'any cell'")
        return None


# ---------------------------------------------------------------------------- the checks

def run_checks(wd, args):
    wait = Waiter(time.monotonic() + args.timeout_s)
    node = args.expect_node

    log(f"open {args.url}")
    wd.get(args.url)

    def token_form():
        shown = wd.execute("const f = document.querySelector('[data-testid=\"token-form\"]');"
                           " return f ? !f.hidden : null;")
        detail = wd.find(testid("token-detail"))
        return shown, wd.text(detail).strip() if detail else ""

    def enter_token(token):
        field, submit = wd.find(testid("token-input")), wd.find(testid("token-submit"))
        if not (field and submit):
            raise CheckFailed("the token form's input and button", "some are missing")
        wd.clear(field)
        wd.send_keys(field, token)
        wd.click(submit)

    if TOKEN:
        # The node wants its token: the page asks, a wrong one is refused and
        # asked for again, the right one is kept for the tab and sent along.
        log("token: " + wait.until("the page asks for the admin token",
                                   lambda: (token_form()[0] is True, f"token form {token_form()}")))
        enter_token("wrong-" + TOKEN)
        log("wrong token: " + wait.until(
            "the page asks again, saying the token was refused",
            lambda: (token_form()[0] is True and "refused" in token_form()[1], f"token form {token_form()}")))
        enter_token(TOKEN)
        kept = wd.execute("return sessionStorage.getItem('troupe.adminToken');")
        if kept != TOKEN:
            raise CheckFailed("the token kept in sessionStorage", repr(kept))

    # Header: the node's id, once the first overview has arrived.
    def header():
        e = wd.find(testid("node-id"))
        text = wd.text(e).strip() if e else "(no node-id element)"
        return text == node, f"node-id {text!r}"
    log("header: " + wait.until(f"header shows node id {node!r}", header))
    shown, _ = token_form()
    if shown:
        raise CheckFailed("no token form once the page has its data", "the token form is shown")

    # Health: the red banner and the state badge say what the overview's
    # health says (read directly), no more and no less.
    def health():
        h = (fetch_overview(args.url) or {}).get("health")
        if not isinstance(h, dict):
            return False, f"the overview has no health object: {h!r}"
        services = h.get("services") if isinstance(h.get("services"), dict) else {}
        failing = sorted(n for n, v in services.items() if isinstance(v, dict) and v.get("up") is False)
        unhealthy = h.get("status") == "unhealthy" or bool(failing)
        shown = wd.execute("const b = document.querySelector('[data-testid=\"banner-unhealthy\"]');"
                           " return b ? !b.hidden : null;")
        listed = sorted(wd.attribute(e, "data-service") for e in wd.find_all(testid("unhealthy-service")))
        badge = wd.find(testid("state-badge"))
        state = wd.attribute(badge, "data-state") if badge else None
        ok = shown == unhealthy and listed == failing and (state == "unhealthy") == unhealthy
        return ok, (f"overview status={h.get('status')!r} failing={failing}; page banner shown={shown}, "
                    f"lists {listed}, state-badge={state!r}")
    log("health: " + wait.until("the health banner and state badge matching the overview's health", health))

    # Members: enough rows, ours among them and alive.
    def members():
        rows = wd.find_all(testid("member-row"))
        ours = wd.find(testid("member-row", node_id=node))
        alive = wd.attribute(ours, "data-alive") if ours else None
        ids = [wd.attribute(r, "data-node-id") for r in rows]
        ok = len(rows) >= args.expect_members and alive == "true"
        return ok, f"{len(rows)} member rows {ids}, {node!r} alive={alive}"
    log("members: " + wait.until(
        f">= {args.expect_members} member rows, {node!r} present with data-alive=true", members))

    # Shard map: a cell owned by this node when the node owns shards; any
    # cell when there are shards but all are elsewhere; nothing otherwise.
    overview = fetch_overview(args.url)
    shards = (overview or {}).get("shards") or []
    owned = [s for s in shards if s.get("owner") == node]
    if owned or overview is None:
        def shard_cells():
            n = len(wd.find_all(testid("shard-cell", owner=node)))
            total = len(wd.find_all(testid("shard-cell")))
            return n >= 1, f"{n} shard cells owned by {node!r} of {total}"
        log("shards: " + wait.until(f"a shard cell with data-owner={node!r}", shard_cells))
    elif shards:
        def any_cells():
            total = len(wd.find_all(testid("shard-cell")))
            return total >= 1, f"{total} shard cells"
        log("shards: " + wait.until("shard cells (the node owns none)", any_cells))
    else:
        log("shards: the overview lists none; nothing to check")

    if args.expect_type:
        def type_row():
            row = wd.find(testid("entity-type-row", type=args.expect_type))
            rows = wd.find_all(testid("entity-type-row"))
            types = [wd.attribute(r, "data-type") for r in rows]
            return row is not None, f"entity type rows {types}"
        log("entity types: " + wait.until(f"an entity-type-row for {args.expect_type!r}", type_row))

    # Charts: every canvas has drawn at least two samples.
    def charts():
        canvases = wd.find_all(testid("chart"))
        points = {wd.attribute(c, "data-chart"): int(wd.attribute(c, "data-points") or 0) for c in canvases}
        ok = len(points) >= 1 and all(p >= 2 for p in points.values())
        return ok, f"chart data-points {points}"
    log("charts: " + wait.until("every chart with data-points >= 2", charts))

    def processing():
        table = wd.find(testid("processing-table"))
        rows = len(wd.find_all(testid("processing-row")))
        return table is not None, f"processing table {'present' if table else 'missing'}, {rows} rows"
    log("processing: " + wait.until("the processing table", processing))

    # Projections: one row per projection the overview (read directly)
    # lists, with its state; at least --expect-projections of them, all
    # running and caught up (lag 0) once the traffic has been applied.
    def projections():
        listed = (fetch_overview(args.url) or {}).get("projections")
        if not isinstance(listed, list):
            return False, f"the overview has no projections list: {listed!r}"
        want = sorted((p.get("key"), p.get("state")) for p in listed)
        rows = wd.find_all(testid("projection-row"))
        shown = sorted((wd.attribute(r, "data-key"), wd.attribute(r, "data-state")) for r in rows)
        lags = [wd.attribute(c, "data-value") for c in wd.find_all(testid("projection-row") + " td.lag")]
        settled = all(p.get("state") == "running" and p.get("lag_ms") == 0 and p.get("caught_up") for p in listed)
        ok = shown == want and len(want) >= args.expect_projections and (args.expect_projections == 0 or settled)
        empty = wd.execute("const e = document.getElementById('projections-empty'); return e ? !e.hidden : null;")
        ok = ok and empty == (len(want) == 0) and all(v not in (None, "") for v in lags)
        return ok, f"overview {want}; page rows {shown}, lag cells {lags}, empty note shown={empty}"
    log("projections: " + wait.until(
        f"projection rows matching the overview's projections (>= {args.expect_projections}, all running "
        "and caught up when any are expected)", projections))

    # Rebalance: the status line must report the outcome, whichever it is.
    button = wd.find(testid("rebalance-button"))
    if button is None:
        raise CheckFailed("a rebalance-button", "none")
    wd.click(button)

    def rebalance():
        status = wd.find(testid("rebalance-status"))
        state = wd.attribute(status, "data-state") if status else None
        text = wd.text(status).strip() if status else ""
        return state in ("ok", "error") and text != "", f"status data-state={state!r} text={text!r}"
    log("rebalance: " + wait.until("a Rebalance result (JSON or error message) in the status line", rebalance))

    if args.lookup_type and args.lookup_id:
        type_input = wd.find(testid("lookup-type"))
        id_input = wd.find(testid("lookup-id"))
        submit = wd.find(testid("lookup-submit"))
        if not (type_input and id_input and submit):
            raise CheckFailed("the lookup form's type, id and submit", "some are missing")
        wd.clear(type_input)
        wd.send_keys(type_input, args.lookup_type)
        wd.clear(id_input)
        wd.send_keys(id_input, args.lookup_id)
        wd.click(submit)

        def lookup():
            result = wd.find(testid("lookup-result"))
            state = wd.attribute(result, "data-state") if result else None
            text = wd.text(result) if result else ""
            shown = text if len(text) < 300 else text[:300] + "…"
            return state in ("ok", "error") and args.lookup_id in text, f"data-state={state!r} text={shown!r}"
        log("lookup: " + wait.until(f"a lookup result containing {args.lookup_id!r}", lookup))

    # Errors the page's own code ran into (app.js collects them).
    errors = wd.execute("return (window.troupeDashboard || {}).errors || null;")
    if errors is None:
        raise CheckFailed("app.js running (window.troupeDashboard)", "not defined")
    if errors:
        raise CheckFailed("no script errors on the page", errors)

    # For the screenshot: the window made as tall as the page (a WebDriver
    # screenshot shows only the viewport, and the lower panels matter too),
    # then one more refresh so the charts include the samples taken while
    # the checks ran.
    wd.execute("window.scrollTo(0, 0);")
    size = wd.execute("return [window.outerWidth, window.outerHeight - window.innerHeight,"
                      " document.documentElement.scrollHeight];")
    width, chrome, page = size
    wd.set_window_size(width, min(MAX_SCREENSHOT_HEIGHT, page + chrome))
    time.sleep(1.2)


# ---------------------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description="Browser test of the troupe node dashboard.")
    p.add_argument("--url", required=True, help="the dashboard, e.g. http://127.0.0.1:8081/")
    p.add_argument("--screenshot", required=True, help="where to save the PNG")
    p.add_argument("--expect-node", required=True, help="the node id the header must show")
    p.add_argument("--expect-type", help="an entity type that must have a row")
    p.add_argument("--lookup-type", help="entity type for the lookup form")
    p.add_argument("--lookup-id", help="entity id for the lookup form")
    p.add_argument("--expect-members", type=int, default=1, help="minimum member rows (default 1)")
    p.add_argument("--expect-projections", type=int, default=0,
                   help="minimum projection rows, all running with lag 0 (default 0: only that the rows match)")
    p.add_argument("--timeout-s", type=float, default=60, help="time for all checks together (default 60)")
    p.add_argument("--token-file", help="the node's admin token file: the page must ask for the token")
    return p.parse_args(argv)


def failure_path(screenshot, ext):
    root, _ = os.path.splitext(screenshot)
    return f"{root}.failure{ext}"


def main(argv):
    args = parse_args(argv)
    global TOKEN
    if args.token_file:
        with open(args.token_file) as f:
            TOKEN = f.read().strip()
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            log(f"SKIP: {binary} is not installed")
            return SKIP

    # SIGTERM (ctest's timeout, a CI cancel) unwinds like an exception, so
    # the finally below still closes the browser and chromedriver.
    def on_term(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_term)

    profile = tempfile.mkdtemp(prefix="troupe-dashboard-e2e-")
    port = free_port()
    driver_log = open(os.path.join(profile, "chromedriver.log"), "w+")
    driver = None
    wd = WebDriver(f"http://127.0.0.1:{port}")
    status = 1
    try:
        # Its own process group, so that stopping it also stops any browser
        # it leaves behind.
        driver = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=driver_log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        start = time.monotonic()
        while not wd.status_ready():
            if driver.poll() is not None or time.monotonic() - start > 20:
                driver_log.seek(0)
                log("chromedriver did not start:\n" + driver_log.read()[-2000:])
                return 1
            time.sleep(0.1)
        try:
            wd.new_session(os.path.join(profile, "user-data"))
        except (WebDriverError, OSError) as e:
            log(f"could not start chromium through chromedriver: {e}")
            return 1
        try:
            run_checks(wd, args)
            wd.screenshot(args.screenshot)
            log(f"PASS; screenshot saved to {args.screenshot}")
            status = 0
        except (CheckFailed, WebDriverError, OSError) as e:
            print(f"[dashboard_e2e] FAIL\n  {e}", file=sys.stderr, flush=True)
            try:
                wd.screenshot(failure_path(args.screenshot, ".png"))
                with open(failure_path(args.screenshot, ".html"), "w", encoding="utf-8") as f:
                    f.write(wd.source())
                log(f"screenshot and page source saved to {failure_path(args.screenshot, '.png')} and .html")
            except (WebDriverError, OSError) as e2:
                log(f"could not save the failure screenshot: {e2}")
    finally:
        try:
            wd.quit()
        except (WebDriverError, OSError) as e:
            log(f"closing the session failed: {e}")
        if driver is not None and driver.poll() is None:
            try:
                os.killpg(driver.pid, signal.SIGTERM)
                driver.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(driver.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            driver.wait()
        driver_log.close()
        shutil.rmtree(profile, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
