"""The bulk calls docs/clients.md shows from a shell, run as written there: grpcurl streaming JSON
messages from standard input on one EmbedStream in the ingest lane, grpcurl listing the services
by reflection and calling tei-manager's Embed, and curl sending an HTTP batch in the ingest lane.
grpcurl is the real one, built from the Go module proxy by tools/go-tool.sh (TEIFLEET_GRPCURL)."""

import json
import os
import re
import subprocess
import urllib.request

GRPCURL = os.environ["TEIFLEET_GRPCURL"]
SIDECAR = os.environ["TEIFLEET_GRPC"]
TEI = os.environ["TEIFLEET_SIM_GRPC"]
HTTP = os.environ["TEIFLEET_HTTP"]
ADMIN = os.environ["TEIFLEET_ADMIN"]
# The static multiplexer's pool.
POOL = "default"


def grpcurl(*args: str, stdin: str | None = None) -> list[dict]:
    """Runs grpcurl; the JSON messages it printed, one after another."""
    done = subprocess.run([GRPCURL, *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"grpcurl {' '.join(args)} failed: {done.stderr}"
    decoder, text, messages = json.JSONDecoder(), done.stdout.strip(), []
    while text:
        message, end = decoder.raw_decode(text)
        messages.append(message)
        text = text[end:].lstrip()
    return messages


def ingest_admitted() -> float:
    """The multiplexer's count of ingest admissions."""
    metrics = urllib.request.urlopen(f"{ADMIN}/metrics", timeout=10).read().decode()
    found = re.findall(r'^teifleet_lane_admissions_total\{[^}]*lane="ingest"[^}]*outcome="admitted"[^}]*\} (\S+)$',
                       metrics, re.MULTILINE)
    found += re.findall(r'^teifleet_lane_admissions_total\{[^}]*outcome="admitted"[^}]*lane="ingest"[^}]*\} (\S+)$',
                        metrics, re.MULTILINE)
    assert found, "the multiplexer exports ingest admissions"
    return sum(float(value) for value in found)


def test_grpcurl_streams_json_messages_from_stdin_on_one_embed_stream_in_the_ingest_lane():
    texts = [f"chunk {i} of the corpus" for i in range(300)]
    before = ingest_admitted()
    answers = grpcurl("-plaintext", "-H", "x-teifleet-lane: ingest", "-d", "@", SIDECAR,
                      "tei.v1.Embed/EmbedStream", stdin="".join(json.dumps({"inputs": t}) + "\n" for t in texts))
    assert len(answers) == len(texts), "one answer per message"
    direct = grpcurl("-plaintext", "-d", json.dumps({"inputs": texts[42]}), TEI, "tei.v1.Embed/Embed")
    assert answers[42]["embeddings"] == direct[0]["embeddings"], "answers in order, as TEI gives them"
    assert ingest_admitted() - before >= len(texts), "every message was admitted in the ingest lane"


def test_grpcurl_lists_the_services_and_calls_tei_managers_embed_by_reflection():
    listed = subprocess.run([GRPCURL, "-plaintext", SIDECAR, "list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    services = listed.stdout.split()
    assert {"tei.v1.Embed", "tei_multiplexer.v1.TeiMultiplexer"} <= set(services), services
    wrapped = grpcurl("-plaintext", "-d", json.dumps({"target": {"instance_name": POOL}, "request": {"inputs": "hello"}}),
                      SIDECAR, "tei_multiplexer.v1.TeiMultiplexer/Embed")
    direct = grpcurl("-plaintext", "-d", json.dumps({"inputs": "hello"}), TEI, "tei.v1.Embed/Embed")
    assert wrapped[0]["embeddings"] == direct[0]["embeddings"]


def test_curl_sends_an_http_batch_in_the_ingest_lane():
    before = ingest_admitted()
    done = subprocess.run(
        ["curl", "-s", "--fail-with-body", f"{HTTP}/embed", "-H", "content-type: application/json",
         "-H", "x-teifleet-lane: ingest", "-d", json.dumps({"inputs": ["first chunk", "second chunk", "third chunk"]})],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    vectors = json.loads(done.stdout)
    assert len(vectors) == 3 and all(len(v) == len(vectors[0]) > 0 for v in vectors)
    assert ingest_admitted() > before, "admitted in the ingest lane"
