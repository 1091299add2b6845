#!/usr/bin/env bash
# Real client libraries from PyPI (the openai SDK, huggingface_hub, requests, grpcio), grpcurl and
# ghz (tools/go-tool.sh builds them once) against the multiplexer's fronts in front of the TEI simulator,
# both the debug binaries, on loopback: in
# plain text, with API keys, and over TLS and mutual TLS with certificates made here every run.
# An embedding job (the debug teifleet-job) also runs here, Parquet in and out of a real SeaweedFS
# S3 server (tools/seaweedfs.sh builds `weed` once), for pyarrow to read back (test_job_output.py).
# The venv lives in target/py-venv (tests/clients/venv.sh) and is rebuilt only when requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
venv=$root/target/py-venv

tests/clients/venv.sh >/dev/null

# The binaries of make unit's build (nothing to compile after it; tools/build-debug.sh says why).
tools/build-debug.sh --quiet
weed=$(tools/seaweedfs.sh)
# grpcurl (test_grpcurl.py) and ghz (test_ghz.py), built once per version like weed.
TEIFLEET_GRPCURL=$(tools/go-tool.sh grpcurl)
TEIFLEET_GHZ=$(tools/go-tool.sh ghz)
export TEIFLEET_GRPCURL TEIFLEET_GHZ
bin=$root/target/debug
logs=$(mktemp -d)

pids=()
weed_pid=
weed_ports=()
cleanup() {
    # weed's data is thrown away: it need not take its 15 to 30 s to stop.
    if [[ -n $weed_pid ]]; then
        kill -KILL "$weed_pid" 2>/dev/null || true
        wait "$weed_pid" 2>/dev/null || true
    fi
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$logs"
    # weed's gRPC servers listen on Unix sockets in /tmp too, named by port; it leaves them.
    for port in "${weed_ports[@]}"; do
        rm -f "/tmp/seaweedfs-"{master,volume,filer,s3}"-grpc-$((port + 10000)).sock" "/tmp/seaweedfs-"{filer,s3}"-$port.sock"
    done
}
trap cleanup EXIT

# Our own servers listen on port 0 and log, as JSON, the addresses they got: a port picked here
# and bound later can be taken in between (CI: "cannot listen on 127.0.0.1:24095: Address
# already in use"). ports LOG MESSAGE KEY...: the ports on LOG's line MESSAGE (tools/bound-ports.py).
ports() { tools/bound-ports.py "$logs/$1" "${@:2}"; }
sim() { # LOG [flags]
    local log=$1
    shift
    "$bin/tei-sim" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --log-format json "$@" >"$logs/$log" 2>&1 &
    pids+=($!)
}
mux() { # LOG [flags]: a multiplexer on port 0 (gRPC, admin) and, with --http-listen 127.0.0.1:0, HTTP
    local log=$1
    shift
    "$bin/teifleet-multiplexer" "$@" --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --drain-delay 0s \
        --log-format json >"$logs/$log" 2>&1 &
    pids+=($!)
}

# SeaweedFS (master, volume, filer and S3 gateway in one `weed server`), configured as the Rust
# S3 tests start it (tools/testkit/src/seaweedfs.rs): one identity with every action, whose keys
# the job and test_job_output.py sign with. Not as there: its Iceberg and Lance servers, which
# would take the fixed ports 8181 and 9101, are off. Started first: it takes seconds to be up.
s3_access=teifleet-test-access
s3_secret=teifleet-test-secret-key
mkdir -p "$logs/weed"
printf '{"identities":[{"name":"teifleet","credentials":[{"accessKey":"%s","secretKey":"%s"}],"actions":["Admin","Read","Write","List","Tagging"]}]}\n' \
    "$s3_access" "$s3_secret" >"$logs/weed/s3.json"
# weed cannot listen on port 0 and say which it got: its ports are picked here, all different and
# below the kernel's ephemeral range (where our servers' port 0 and every outgoing connection
# land). Its four servers (master, volume, filer, S3) each listen for gRPC on their port + 10000
# too: the ports come from the 2000 whose + 10000 is still below that range. A port taken between
# the pick and weed's bind (by another suite picking alike) makes weed exit: weed_lost_a_port
# (below) says so, and start_weed starts it again on other ports.
start_weed() {
    local picked
    picked=$("$venv/bin/python" - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
held, ports = [], []
def hold(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return False
    held.append(s)
    return True
start = max(1024, low - 12000)
for port in random.sample(range(start, start + 2000), 2000):
    if len(ports) == 4:
        break
    if hold(port) and hold(port + 10000):
        ports.append(port)
assert len(ports) == 4, "no free ports for SeaweedFS"
print(*ports)
PY
)
    read -r weed_master weed_volume weed_filer weed_s3 <<<"$picked"
    weed_ports+=("$weed_master" "$weed_volume" "$weed_filer" "$weed_s3")
    rm -rf "$logs/weed/data"
    mkdir -p "$logs/weed/data"
    (cd "$logs/weed" && exec "$weed" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -volume.max=8 -filer -s3 \
        -dir="$logs/weed/data" -master.port="$weed_master" -volume.port="$weed_volume" -filer.port="$weed_filer" \
        -s3.port="$weed_s3" -s3.config="$logs/weed/s3.json" -s3.port.iceberg=0 -s3.port.lance=0) \
        >"$logs/weed.log" 2>&1 &
    weed_pid=$!
}
start_weed

# The simulator, and issue 32's slower one (20 ms a batch) for test_ghz.py's reproduction of a
# queue that did not keep its word.
sim sim.log --fixed-latency 1ms --per-token-latency 0s --max-batch-tokens 512
sim slow-sim.log --fixed-latency 20ms
served=$(ports sim.log "TEI simulator serving" addr admin)
read -r sim_port sim_admin <<<"$served"
served=$(ports slow-sim.log "TEI simulator serving" addr)
read -r slow_sim <<<"$served"

# It serves the simulator's model by name too: tei-manager clients (test_tei_manager.py) route by it.
mux mux.log static --max-in-flight 32 --max-queued 256 --queue-timeout 10s --model teifleet/sim-embedding \
    --upstream "http://127.0.0.1:$sim_port" --http-listen 127.0.0.1:0
# Behind the slower simulator, with room in its queue for every one of ghz's 64 callers.
mux mux-patient.log static --max-in-flight 4 --max-queued 64 --queue-timeout 3s \
    --upstream "http://127.0.0.1:$slow_sim"

# A second multiplexer whose pool has API keys (test_auth.py), from a keys file beside its
# configuration; the key is new every run.
api_key=$("$venv/bin/python" -c 'import secrets; print("tf-" + secrets.token_urlsafe(24))')
printf 'search: %s\n' "$api_key" >"$logs/keys.yaml"
printf '%s\n' "auth: {keysFile: keys.yaml}" "pools:" \
    "- {name: keyed, upstream: 'http://127.0.0.1:$sim_port', maxInFlight: 32, maxQueued: 256, queueTimeout: 10s}" \
    >"$logs/pools.yaml"
mux mux-keyed.log file --config "$logs/pools.yaml" --http-listen 127.0.0.1:0

# A multiplexer whose pool caches embeddings (test_cache.py): local tier only.
printf '%s\n' "pools:" \
    "- {name: cached, upstream: 'http://127.0.0.1:$sim_port', maxInFlight: 32, maxQueued: 256, queueTimeout: 10s, cache: {size: 16Mi}}" \
    >"$logs/pools-cached.yaml"
mux mux-cached.log file --config "$logs/pools-cached.yaml" --http-listen 127.0.0.1:0

# Certificates for test_tls.py, new every run: a CA and two server certificates from it (for
# localhost and 127.0.0.1), a third with a serial whose first byte has its top bit set (DER pads
# it with a zero byte that `openssl x509 -serial` does not print), a client CA with a client
# certificate for the tenant `search`, and a client certificate of the same name from a CA
# nobody trusts.
tls=$logs/tls
mkdir -p "$tls/rotating"
ossl() { openssl "$@" 2>>"$logs/openssl.log" || { cat "$logs/openssl.log" >&2; return 1; }; }
new_ca() { # NAME CN
    ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=$2" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        -keyout "$tls/$1.key" -out "$tls/$1.crt"
}
new_leaf() { # NAME CA CN EXTENDED-KEY-USAGE SUBJECT-ALT-NAMES [openssl x509 options]
    local name=$1 ca=$2 cn=$3 usage=$4 names=$5
    shift 5
    ossl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn" \
        -keyout "$tls/$name.key" -out "$tls/$name.csr"
    printf '%s\n' basicConstraints=critical,CA:FALSE keyUsage=critical,digitalSignature \
        "extendedKeyUsage=$usage" "subjectAltName=$names" >"$tls/$name.ext"
    ossl x509 -req -in "$tls/$name.csr" -CA "$tls/$ca.crt" -CAkey "$tls/$ca.key" -days 2 \
        -extfile "$tls/$name.ext" -out "$tls/$name.crt" "$@"
}
server_names=DNS:localhost,IP:127.0.0.1
new_ca ca "teifleet test CA"
new_leaf server ca localhost serverAuth "$server_names" -CAcreateserial
new_leaf server2 ca localhost serverAuth "$server_names" -CAcreateserial
new_leaf server-high-serial ca localhost serverAuth "$server_names" -set_serial 0xC0FFEE
new_ca client-ca "teifleet test client CA"
new_leaf client client-ca search clientAuth DNS:search -CAcreateserial
new_ca stranger-ca "a CA the multiplexer does not trust"
new_leaf stranger stranger-ca search clientAuth DNS:search -CAcreateserial
cp "$tls/server.crt" "$tls/rotating/tls.crt"
cp "$tls/server.key" "$tls/rotating/tls.key"

# A multiplexer serving TLS on both fronts; one with mutual TLS, whose client certificate names
# the tenant (listed by name, so its metric says `search`, not `other`); and one whose
# certificate files the tests replace (rotation, broken files).
serve() { # LOG [flags]
    local log=$1
    shift
    mux "$log" static --max-in-flight 32 --max-queued 256 --queue-timeout 10s \
        --upstream "http://127.0.0.1:$sim_port" --http-listen 127.0.0.1:0 "$@"
}
serve mux-tls.log --tls-cert "$tls/server.crt" --tls-key "$tls/server.key"
serve mux-mtls.log --tls-cert "$tls/server.crt" \
    --tls-key "$tls/server.key" --tls-client-ca "$tls/client-ca.crt" --tenant search=2
serve mux-rotating.log --tls-cert "$tls/rotating/tls.crt" --tls-key "$tls/rotating/tls.key"

# Every multiplexer's ports, from the line it logs once all its listeners are bound.
served() { ports "$1" "multiplexer serving" grpc_addr admin_addr "${@:2}"; }
served=$(served mux.log http_addr)
read -r grpc admin http <<<"$served"
served=$(served mux-patient.log)
read -r patient_grpc patient_admin <<<"$served"
served=$(served mux-keyed.log http_addr)
read -r _ _ keyed_http <<<"$served"
served=$(served mux-cached.log http_addr)
read -r _ _ cached_http <<<"$served"
served=$(served mux-tls.log http_addr)
read -r tls_grpc tls_admin tls_http <<<"$served"
served=$(served mux-mtls.log http_addr)
read -r mtls_grpc mtls_admin mtls_http <<<"$served"
served=$(served mux-rotating.log http_addr)
read -r _ rot_admin rot_http <<<"$served"

export TEIFLEET_HTTP="http://127.0.0.1:$http" TEIFLEET_HTTP_KEYED="http://127.0.0.1:$keyed_http"
export TEIFLEET_GRPC="127.0.0.1:$grpc" TEIFLEET_SIM_GRPC="127.0.0.1:$sim_port" TEIFLEET_ADMIN="http://127.0.0.1:$admin"
export TEIFLEET_API_KEY="$api_key"
export TEIFLEET_HTTP_CACHED="http://127.0.0.1:$cached_http" TEIFLEET_SIM_ADMIN="http://127.0.0.1:$sim_admin"
export TEIFLEET_SLOW_SIM_GRPC="127.0.0.1:$slow_sim" TEIFLEET_PATIENT_GRPC="127.0.0.1:$patient_grpc"
export TEIFLEET_TLS_DIR="$tls"
export TEIFLEET_TLS_HTTP="https://127.0.0.1:$tls_http" TEIFLEET_TLS_GRPC="127.0.0.1:$tls_grpc"
export TEIFLEET_TLS_ADMIN="http://127.0.0.1:$tls_admin"
export TEIFLEET_MTLS_HTTP="https://127.0.0.1:$mtls_http" TEIFLEET_MTLS_GRPC="127.0.0.1:$mtls_grpc"
export TEIFLEET_MTLS_ADMIN="http://127.0.0.1:$mtls_admin"
export TEIFLEET_ROTATING_HTTP="https://127.0.0.1:$rot_http" TEIFLEET_ROTATING_ADMIN="http://127.0.0.1:$rot_admin"
export TEIFLEET_ROTATING_DIR="$tls/rotating"
# Plain-text fronts answer /health; the TLS ones are ready when their (plain-text) admin port says so.
ready() { # URL: true once it answers, within 20 s
    for _ in $(seq 200); do
        curl -sf "$1" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}
for check in "$TEIFLEET_HTTP/health mux.log" "$TEIFLEET_HTTP_KEYED/health mux-keyed.log" \
    "$TEIFLEET_HTTP_CACHED/health mux-cached.log" \
    "$TEIFLEET_TLS_ADMIN/readyz mux-tls.log" "$TEIFLEET_MTLS_ADMIN/readyz mux-mtls.log" \
    "$TEIFLEET_ROTATING_ADMIN/readyz mux-rotating.log" "http://127.0.0.1:$patient_admin/readyz mux-patient.log"; do
    read -r url log <<<"$check"
    if ! ready "$url"; then
        echo "the multiplexer logging to $log is not ready at $url after 20 s; its log, and the simulator's:" >&2
        cat "$logs/$log" "$logs/sim.log" >&2
        exit 1
    fi
done

# The embedding job: a Parquet corpus written with pyarrow into a bucket, two workers of the debug
# teifleet-job through the first multiplexer (pool `default`), Parquet parts out to another prefix.
# Weed is up once its S3 gateway answers at all (unsigned: 403) and its filer answers too.
s3=http://127.0.0.1:$weed_s3
up() { [[ $(curl -s -o /dev/null -w '%{http_code}' "$1" 2>/dev/null) != 000 ]]; }
# A volume server must have joined the master too: the gateway and the filer answer seconds before
# it does, and a write in between waits for a volume until the client gives up.
volume_joined() { curl -s "http://127.0.0.1:$weed_master/dir/status" 2>/dev/null | grep -q '"DataNodes":\[{'; }
weed_up() { up "$s3/" && up "http://127.0.0.1:$weed_filer/" && volume_joined; }
# weed exits (glog's Fatal) when a port it was given is taken: then it starts again on others,
# three times at most.
weed_lost_a_port() { ! kill -0 "$weed_pid" 2>/dev/null && grep -q 'address already in use' "$logs/weed.log"; }
for attempt in 1 2 3; do
    for _ in $(seq 600); do
        weed_up || weed_lost_a_port && break
        sleep 0.1
    done
    weed_lost_a_port && ((attempt < 3)) || break
    echo "SeaweedFS found a port taken since it was picked; starting it on others:" >&2
    grep 'address already in use' "$logs/weed.log" >&2
    wait "$weed_pid" || true
    start_weed
    s3=http://127.0.0.1:$weed_s3
done
if ! weed_up; then
    echo "SeaweedFS is not up at $s3 after 60 s; its log:" >&2
    tail -50 "$logs/weed.log" >&2
    exit 1
fi
export TEIFLEET_S3_ENDPOINT=$s3 TEIFLEET_S3_ACCESS_KEY=$s3_access TEIFLEET_S3_SECRET_KEY=$s3_secret
export TEIFLEET_JOB_INPUT=corpus/in/ TEIFLEET_JOB_OUTPUT=corpus/out/
# pyarrow's AWS SDK is given the endpoint, region and keys: no instance metadata to look for.
export AWS_EC2_METADATA_DISABLED=true
curl -sf -X POST "http://127.0.0.1:$weed_filer/buckets/corpus/?op=mkdir" >/dev/null
# 3,000 rows in row groups of 500 (six shards), string ids; three rows are planted bad: an empty
# text, a null text and one longer than the simulator takes (--max-batch-tokens 512).
"$venv/bin/python" - <<'PY'
import os, random
import pyarrow as pa, pyarrow.fs, pyarrow.parquet as pq
rng = random.Random(7)
words = "vector index shard replica query corpus token batch model lane budget queue".split()
ids = [f"doc-{i:05}" for i in range(3000)]
texts = [f"{i} " + " ".join(rng.choices(words, k=rng.randint(3, 40))) for i in range(3000)]
texts[17], texts[1234], texts[2500] = "", None, "overlong " * 4000
s3 = pa.fs.S3FileSystem(access_key=os.environ["TEIFLEET_S3_ACCESS_KEY"], secret_key=os.environ["TEIFLEET_S3_SECRET_KEY"],
                        endpoint_override=os.environ["TEIFLEET_S3_ENDPOINT"], scheme="http", region="us-east-1",
                        connect_timeout=10, request_timeout=60)
table = pa.table({"id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.string())})
pq.write_table(table, os.environ["TEIFLEET_JOB_INPUT"] + "corpus.parquet", filesystem=s3, row_group_size=500)
PY
job() { # WORKER
    TEIFLEET_INPUT_S3_ACCESS_KEY_ID=$s3_access TEIFLEET_INPUT_S3_SECRET_ACCESS_KEY=$s3_secret \
        TEIFLEET_OUTPUT_S3_ACCESS_KEY_ID=$s3_access TEIFLEET_OUTPUT_S3_SECRET_ACCESS_KEY=$s3_secret \
        "$bin/teifleet-job" run --pool-url "http://127.0.0.1:$grpc" --pool default --lane ingest \
        --input "s3://$TEIFLEET_JOB_INPUT" --input-format parquet --output "s3://$TEIFLEET_JOB_OUTPUT" \
        --input-s3-endpoint "$s3" --input-s3-allow-http --output-s3-endpoint "$s3" --output-s3-allow-http \
        --workers 2 --worker "$1" --rows-per-call 128 --log-format pretty >"$logs/job-$1.log" 2>&1
}
job 0 &
job_zero=$!
job 1 &
job_one=$!
pids+=("$job_zero" "$job_one")
failed=0
wait "$job_zero" || failed=1
wait "$job_one" || failed=1
if ((failed)); then
    echo "the embedding job failed; its workers' logs, the multiplexer's and SeaweedFS's:" >&2
    tail -n 20 "$logs/job-0.log" "$logs/job-1.log" "$logs/mux.log" >&2
    tail -30 "$logs/weed.log" >&2
    exit 1
fi

if ! "$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/tests/clients" "$@"; then
    echo "--- embedding job, workers' logs" >&2; tail -n 10 "$logs/job-0.log" "$logs/job-1.log" >&2
    echo "--- SeaweedFS log" >&2; tail -20 "$logs/weed.log" >&2
    echo "--- multiplexer log" >&2; tail -50 "$logs/mux.log" >&2
    echo "--- multiplexer with API keys, log" >&2; tail -20 "$logs/mux-keyed.log" >&2
    echo "--- multiplexer with a cache, log" >&2; tail -20 "$logs/mux-cached.log" >&2
    echo "--- multiplexer with TLS, log" >&2; tail -20 "$logs/mux-tls.log" >&2
    echo "--- multiplexer with mutual TLS, log" >&2; tail -20 "$logs/mux-mtls.log" >&2
    echo "--- multiplexer with rotating certificates, log" >&2; tail -30 "$logs/mux-rotating.log" >&2
    echo "--- simulator log" >&2; tail -20 "$logs/sim.log" >&2
    exit 1
fi
