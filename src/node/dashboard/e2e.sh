#!/usr/bin/env bash
# The dashboard's end-to-end test against a real node: starts the simulated
# gateway and one payment node (SQLite, free ports), settles some payments
# through the payment API, then lets dashboard_e2e.py drive the dashboard
# in headless Chromium. The node has an admin token, which the page asks for. The screenshot is kept at $ARTIFACTS/dashboard.png.
#
# Usage: e2e.sh BIN_DIR ARTIFACTS_DIR
# Exit: 0 pass, 1 fail, 77 skip (no chromium / chromedriver).
set -euo pipefail
bin=$1
artifacts=$2
here="$(cd "$(dirname "$0")" && pwd)"
if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
  echo "dashboard e2e: chromium or chromedriver missing (Debian: chromium chromium-driver); skipped"
  exit 77
fi
mkdir -p "$artifacts"
work=$(mktemp -d /tmp/troupe-dashboard-e2e-XXXXXX)
pids=()
cleanup() {
  local code=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((code != 0)); then
    echo "--- gateway log"; cat "$work/gateway.log" 2>/dev/null || true
    echo "--- node log"; cat "$work/node.log" 2>/dev/null || true
  fi
  rm -rf "$work"
  exit "$code"
}
trap cleanup EXIT

wait_for() {  # file pattern pid
  for _ in $(seq 1 300); do
    if grep -q "$2" "$1" 2>/dev/null; then return 0; fi
    kill -0 "$3" 2>/dev/null || { echo "dashboard e2e: a process exited early"; return 1; }
    sleep 0.1
  done
  echo "dashboard e2e: '$2' did not appear in $1"
  return 1
}

"$bin/payment_gateway" --port 0 --latency-ms 2 --decline-rate 0.1 --error-rate 0 --hang-rate 0 >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_for "$work/gateway.log" "listening on" "${pids[-1]}"
gw_port=$(sed -n 's#.*listening on http://[^:]*:\([0-9]*\).*#\1#p' "$work/gateway.log" | head -1)

# The node wants an admin token: the page must ask for it.
(umask 077 && echo "e2e-token-$RANDOM$RANDOM" >"$work/admin.token")
cat >"$work/node.toml" <<EOF
[node]
id = "e2e-1"
data_dir = "$work/data"
[admin]
port = 0
token_file = "$work/admin.token"
[journal]
backend = "sqlite"
[entities]
stop_timeout_ms = 2000
[payment]
port = 0
gateway = "127.0.0.1:$gw_port"
processing_timeout_ms = 60000
EOF
"$bin/payment_service" --config "$work/node.toml" >"$work/node.log" 2>&1 &
pids+=($!)
wait_for "$work/node.log" "payments on" "${pids[-1]}"
api_port=$(sed -n 's#.*payments on http://[^:]*:\([0-9]*\),.*#\1#p' "$work/node.log" | head -1)
admin_port=$(sed -n 's#.*dashboard on http://[^:]*:\([0-9]*\)/.*#\1#p' "$work/node.log" | head -1)

# Some payments to show, spread over a few seconds so the charts have points.
python3 - "$api_port" <<'EOF'
import json, sys, time, urllib.request
port = sys.argv[1]
for i in range(60):
    body = json.dumps({"customer": "c%d" % (i % 7), "order_id": "o%d" % i, "amount": 100 + i}).encode()
    req = urllib.request.Request("http://127.0.0.1:%s/payments" % port, data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        json.load(r)
    time.sleep(0.05)
EOF

python3 "$here/dashboard_e2e.py" --url "http://127.0.0.1:$admin_port/" --screenshot "$artifacts/dashboard.png" \
  --expect-node e2e-1 --expect-type payment --lookup-type payment --lookup-id pay-o1 --expect-projections 8 --timeout-s 90 \
  --token-file "$work/admin.token"
