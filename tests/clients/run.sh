#!/usr/bin/env bash
# Real client libraries from PyPI (the openai SDK, huggingface_hub, requests) against the
# multiplexer's HTTP front in front of the TEI simulator, both the debug binaries, on loopback.
# The venv lives in target/py-venv and is rebuilt only when requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
venv=$root/target/py-venv
requirements=$root/tests/clients/requirements.txt

if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "python3-venv is missing; installing it from Debian" >&2
    sudo=$(command -v sudo || true)
    $sudo apt-get update -qq && $sudo apt-get install -y -qq python3-venv
fi
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [[ ! -x $venv/bin/python || "$(cat "$venv/.requirements-sha256" 2>/dev/null)" != "$want" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    echo "$want" >"$venv/.requirements-sha256"
fi

cargo build --quiet -p teifleet-multiplexer -p teifleet-tei-sim --bins
bin=$root/target/debug
logs=$(mktemp -d)
free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
sim_port=$(free_port) sim_admin=$(free_port) grpc=$(free_port) admin=$(free_port) http=$(free_port)
keyed_grpc=$(free_port) keyed_admin=$(free_port) keyed_http=$(free_port)

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$logs"
}
trap cleanup EXIT
"$bin/tei-sim" --listen "127.0.0.1:$sim_port" --admin-listen "127.0.0.1:$sim_admin" \
    --fixed-latency 1ms --per-token-latency 0s --max-batch-tokens 512 >"$logs/sim.log" 2>&1 &
pids+=($!)
"$bin/teifleet-multiplexer" static --max-in-flight 32 --max-queued 256 --queue-timeout 10s \
    --upstream "http://127.0.0.1:$sim_port" --listen "127.0.0.1:$grpc" --admin-listen "127.0.0.1:$admin" \
    --http-listen "127.0.0.1:$http" --drain-delay 0s >"$logs/mux.log" 2>&1 &
pids+=($!)

# A second multiplexer whose pool has API keys (test_auth.py), from a keys file beside its
# configuration; the key is new every run.
api_key=$("$venv/bin/python" -c 'import secrets; print("tf-" + secrets.token_urlsafe(24))')
printf 'search: %s\n' "$api_key" >"$logs/keys.yaml"
printf '%s\n' "auth: {keysFile: keys.yaml}" "pools:" \
    "- {name: keyed, upstream: 'http://127.0.0.1:$sim_port', maxInFlight: 32, maxQueued: 256, queueTimeout: 10s}" \
    >"$logs/pools.yaml"
"$bin/teifleet-multiplexer" file --config "$logs/pools.yaml" \
    --listen "127.0.0.1:$keyed_grpc" --admin-listen "127.0.0.1:$keyed_admin" \
    --http-listen "127.0.0.1:$keyed_http" --drain-delay 0s >"$logs/mux-keyed.log" 2>&1 &
pids+=($!)

export TEIFLEET_HTTP="http://127.0.0.1:$http" TEIFLEET_HTTP_KEYED="http://127.0.0.1:$keyed_http"
export TEIFLEET_API_KEY="$api_key"
for base in "$TEIFLEET_HTTP" "$TEIFLEET_HTTP_KEYED"; do
    for _ in $(seq 100); do
        curl -sf "$base/health" >/dev/null 2>&1 && break
        sleep 0.1
    done
done
if ! "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/clients" "$@"; then
    echo "--- multiplexer log" >&2; tail -50 "$logs/mux.log" >&2
    echo "--- multiplexer with API keys, log" >&2; tail -20 "$logs/mux-keyed.log" >&2
    echo "--- simulator log" >&2; tail -20 "$logs/sim.log" >&2
    exit 1
fi
