"""TLS on the multiplexer's fronts, with real clients (tests/clients/run.sh makes a CA and
certificates with the openssl CLI every run, and starts three multiplexers beside the plain
ones: TLS on the gRPC and HTTP fronts; mutual TLS, whose client certificate names the tenant;
and one whose certificate files these tests replace while it serves). Clients that trust the CA
get the same answers as in plain text, over HTTP/1.1, HTTP/2 and gRPC; clients that do not, and
mutual-TLS clients without a certificate from the client CA, fail at the handshake at once,
never hang. The admin port stays plain HTTP: it is how the tests read metrics and /admission.

gRPC goes through grpcio without generated stubs: the few protobuf messages are encoded and
read here by hand (field numbers from proto/tei/v1/tei.proto)."""

import http.client
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import threading
import time

import grpc
import httpx
import openai
import pytest
import requests
from openai import OpenAI

from test_clients import assert_close, embedding_for

TLS_DIR = os.environ["TEIFLEET_TLS_DIR"]
TLS_HTTP = os.environ["TEIFLEET_TLS_HTTP"]
TLS_GRPC = os.environ["TEIFLEET_TLS_GRPC"]
TLS_ADMIN = os.environ["TEIFLEET_TLS_ADMIN"]
MTLS_HTTP = os.environ["TEIFLEET_MTLS_HTTP"]
MTLS_GRPC = os.environ["TEIFLEET_MTLS_GRPC"]
MTLS_ADMIN = os.environ["TEIFLEET_MTLS_ADMIN"]
ROTATING_HTTP = os.environ["TEIFLEET_ROTATING_HTTP"]
ROTATING_ADMIN = os.environ["TEIFLEET_ROTATING_ADMIN"]
ROTATING_DIR = os.environ["TEIFLEET_ROTATING_DIR"]


def pem(name: str) -> str:
    return os.path.join(TLS_DIR, name)


CA = pem("ca.crt")
CLIENT = (pem("client.crt"), pem("client.key"))  # CN=search, from the client CA
STRANGER = (pem("stranger.crt"), pem("stranger.key"))  # CN=search too, from a CA nobody trusts
ROTATING_CERT = os.path.join(ROTATING_DIR, "tls.crt")
ROTATING_KEY = os.path.join(ROTATING_DIR, "tls.key")
# Long enough for the one-second re-read of the files, a mismatched pair seen mid-replacement,
# and a loaded machine; the tests never wait this long unless something is wrong.
SETTLE_SECONDS = 10


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def verifying(cafile: str = CA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile)


def wait_for(check, what: str, timeout: float = SETTLE_SECONDS):
    """Polls `check` until it returns something true, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(0.1)


# --- protobuf by hand --------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def protobuf_fields(message: bytes) -> dict[int, list]:
    """Field number -> values: ints for varints and fixed-width fields, bytes for the rest."""
    fields: dict[int, list] = {}
    at = 0
    while at < len(message):
        key, at = _read_varint(message, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, at = _read_varint(message, at)
        elif wire_type == 1:
            value, at = int.from_bytes(message[at : at + 8], "little"), at + 8
        elif wire_type == 2:
            length, at = _read_varint(message, at)
            value, at = message[at : at + length], at + length
        elif wire_type == 5:
            value, at = int.from_bytes(message[at : at + 4], "little"), at + 4
        else:
            raise ValueError(f"wire type {wire_type} in field {number}")
        fields.setdefault(number, []).append(value)
    return fields


def embed_request(text: str) -> bytes:
    """EmbedRequest{inputs = text} (field 1, a string)."""
    encoded = text.encode()
    return b"\x0a" + _varint(len(encoded)) + encoded


def _raw(channel: grpc.Channel, method: str):
    return channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)


def grpc_model_id(channel: grpc.Channel) -> str:
    """Info's InfoResponse.model_id (field 4); InfoRequest is empty."""
    return protobuf_fields(_raw(channel, "/tei.v1.Info/Info")(b"", timeout=5))[4][0].decode()


def grpc_embedding(channel: grpc.Channel, text: str) -> list[float]:
    """Embed's EmbedResponse.embeddings (field 1, packed floats)."""
    packed = b"".join(protobuf_fields(_raw(channel, "/tei.v1.Embed/Embed")(embed_request(text), timeout=5))[1])
    return list(struct.unpack(f"<{len(packed) // 4}f", packed))


def grpc_failure(channel: grpc.Channel) -> grpc.StatusCode:
    """The status an Info call ends with; its deadline is only there so a hang fails, not stalls."""
    with pytest.raises(grpc.RpcError) as failed:
        _raw(channel, "/tei.v1.Info/Info")(b"", timeout=5)
    return failed.value.code()


# --- the admin port (plain HTTP) ---------------------------------------------------------------

_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric(admin: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there are none)."""
    text = requests.get(f"{admin}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if sample and sample[1] == name and labels.items() <= dict(_LABEL.findall(sample[2] or "")).items():
            total += float(sample[3])
    return total


def admission_tls(admin: str) -> dict:
    return requests.get(f"{admin}/admission", timeout=5).json()["tls"]


def handshakes_refused(admin: str, port: str) -> float:
    return metric(admin, "teifleet_refused_input_total", port=port, reason="tls_handshake")


def openssl_serial(certificate: str) -> str:
    printed = subprocess.run(
        ["openssl", "x509", "-in", certificate, "-noout", "-serial"], capture_output=True, text=True, check=True
    ).stdout
    return printed.strip().removeprefix("serial=")


# --- TLS -----------------------------------------------------------------------------------------


def test_grpcio_calls_info_and_embed_over_tls():
    credentials = grpc.ssl_channel_credentials(root_certificates=read(CA))
    with grpc.secure_channel(TLS_GRPC, credentials) as channel:
        assert grpc_model_id(channel) == "teifleet/sim-embedding"
        assert_close(grpc_embedding(channel, "over TLS"), embedding_for("over TLS"))


def test_grpcio_without_the_ca_fails_unavailable_at_once():
    refused = handshakes_refused(TLS_ADMIN, "grpc")
    # The system's roots only: the handshake fails, and the call with it.
    with grpc.secure_channel(TLS_GRPC, grpc.ssl_channel_credentials()) as channel:
        assert grpc_failure(channel) == grpc.StatusCode.UNAVAILABLE
    wait_for(lambda: handshakes_refused(TLS_ADMIN, "grpc") > refused, "the refused handshake is counted")


def test_openai_sdk_embeddings_over_tls():
    client = OpenAI(
        base_url=f"{TLS_HTTP}/v1", api_key="unused", max_retries=0, http_client=httpx.Client(verify=verifying())
    )
    result = client.embeddings.create(input=["first", "second"], model="sim", encoding_format="float")
    for text, item in zip(["first", "second"], result.data):
        assert_close(item.embedding, embedding_for(text))


def test_openai_sdk_without_the_ca_raises_api_connection_error():
    client = OpenAI(base_url=f"{TLS_HTTP}/v1", api_key="unused", max_retries=0, http_client=httpx.Client(timeout=10))
    with pytest.raises(openai.APIConnectionError):
        client.embeddings.create(input="hello", model="sim")


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "10", *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("version,flag", [("1.1", "--http1.1"), ("2", "--http2")])
def test_curl_embeds_over_tls(version, flag):
    answer = curl(
        "--cacert", CA, flag, "-w", "\n%{http_code} %{http_version}",
        "-H", "content-type: application/json", "-d", '{"inputs":"hi"}', f"{TLS_HTTP}/embed",
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    body, status = answer.stdout.rsplit("\n", 1)
    assert status == f"200 {version}"
    assert_close(json.loads(body)[0], embedding_for("hi"))


def test_curl_without_the_ca_exits_60_and_the_handshake_is_counted():
    refused = handshakes_refused(TLS_ADMIN, "http")
    answer = curl("-H", "content-type: application/json", "-d", '{"inputs":"hi"}', f"{TLS_HTTP}/embed")
    assert answer.returncode == 60, answer.stderr  # peer certificate cannot be authenticated
    wait_for(lambda: handshakes_refused(TLS_ADMIN, "http") > refused, "the refused handshake is counted")


def test_requests_embed_and_info_with_the_ca():
    embedded = requests.post(f"{TLS_HTTP}/embed", json={"inputs": ["a", "b"]}, verify=CA, timeout=10)
    assert embedded.status_code == 200, embedded.text
    for text, vector in zip(["a", "b"], embedded.json()):
        assert_close(vector, embedding_for(text))
    info = requests.get(f"{TLS_HTTP}/info", verify=CA, timeout=10)
    assert info.json()["model_id"] == "teifleet/sim-embedding"


def test_plain_text_on_the_tls_port_is_refused():
    refused = handshakes_refused(TLS_ADMIN, "http")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(TLS_HTTP.replace("https://", "http://") + "/health", timeout=10)
    wait_for(lambda: handshakes_refused(TLS_ADMIN, "http") > refused, "the plain-text client is counted")


def test_admission_reports_the_certificate_served():
    tls = admission_tls(TLS_ADMIN)
    assert tls["error"] is None and tls["clientAuth"] is False
    assert tls["serving"]["serial"] == openssl_serial(pem("server.crt"))
    assert tls["serving"]["subject"] == "CN=localhost"


# --- mutual TLS ---------------------------------------------------------------------------------


def tenant_calls(tenant: str) -> float:
    return metric(MTLS_ADMIN, "teifleet_tenant_requests_total", tenant=tenant)


def test_mtls_client_certificate_gets_in_and_names_the_tenant():
    before = tenant_calls("search")
    answer = requests.post(f"{MTLS_HTTP}/embed", json={"inputs": "mine"}, verify=CA, cert=CLIENT, timeout=10)
    assert answer.status_code == 200, answer.text
    assert_close(answer.json()[0], embedding_for("mine"))
    wait_for(lambda: tenant_calls("search") > before, "the call is counted for the tenant search")
    assert admission_tls(MTLS_ADMIN)["clientAuth"] is True


def test_mtls_certificate_outranks_the_tenant_the_call_names():
    search, other = tenant_calls("search"), tenant_calls("other")
    answer = requests.post(
        f"{MTLS_HTTP}/embed",
        json={"inputs": "who am I"},
        headers={"x-teifleet-tenant": "someone-else"},
        verify=CA,
        cert=CLIENT,
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    wait_for(lambda: tenant_calls("search") > search, "the call is counted for the certificate's tenant")
    assert tenant_calls("other") == other


def test_mtls_curl_with_the_client_certificate():
    certificate, key = CLIENT
    answer = curl(
        "--cacert", CA, "--cert", certificate, "--key", key, "-o", "/dev/null", "-w", "%{http_code}",
        "-H", "content-type: application/json", "-d", '{"inputs":"hi"}', f"{MTLS_HTTP}/embed",
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout == "200"


def test_mtls_without_a_client_certificate_fails_at_the_handshake():
    refused = handshakes_refused(MTLS_ADMIN, "http")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(f"{MTLS_HTTP}/embed", json={"inputs": "a"}, verify=CA, timeout=10)
    answer = curl("--cacert", CA, "-H", "content-type: application/json", "-d", '{"inputs":"a"}', f"{MTLS_HTTP}/embed")
    assert answer.returncode != 0, answer.stdout
    wait_for(lambda: handshakes_refused(MTLS_ADMIN, "http") >= refused + 2, "both refused handshakes are counted")


def test_mtls_client_certificate_from_another_ca_is_refused():
    # The same name, search, from a CA the multiplexer does not trust.
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.post(f"{MTLS_HTTP}/embed", json={"inputs": "a"}, verify=CA, cert=STRANGER, timeout=10)


def test_mtls_grpcio_with_the_client_certificate_names_the_tenant():
    certificate, key = CLIENT
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(CA), private_key=read(key), certificate_chain=read(certificate)
    )
    before = tenant_calls("search")
    with grpc.secure_channel(MTLS_GRPC, credentials) as channel:
        assert_close(grpc_embedding(channel, "over mTLS"), embedding_for("over mTLS"))
    wait_for(lambda: tenant_calls("search") > before, "the gRPC call is counted for the tenant search")


def test_mtls_grpcio_without_a_client_certificate_fails_unavailable():
    refused = handshakes_refused(MTLS_ADMIN, "grpc")
    with grpc.secure_channel(MTLS_GRPC, grpc.ssl_channel_credentials(root_certificates=read(CA))) as channel:
        assert grpc_failure(channel) == grpc.StatusCode.UNAVAILABLE
    wait_for(lambda: handshakes_refused(MTLS_ADMIN, "grpc") > refused, "the refused handshake is counted")


# --- certificate files replaced while serving ----------------------------------------------------


def served_certificate() -> bytes:
    """The DER certificate a new connection to the rotating multiplexer's HTTP port gets."""
    host, port = ROTATING_HTTP.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with verifying().wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


def der(certificate: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(read(certificate).decode())


def replace(path: str, data: bytes):
    """As a mounted Secret is updated: the whole new file at once, under the old name."""
    with open(path + ".new", "wb") as f:
        f.write(data)
    os.replace(path + ".new", path)


def install(name: str):
    """Puts `name`.crt and `name`.key in the rotating multiplexer's files (one at a time: it may
    read a mismatched pair in between, and keeps what it serves until the pair matches)."""
    replace(ROTATING_CERT, read(pem(f"{name}.crt")))
    replace(ROTATING_KEY, read(pem(f"{name}.key")))


def in_force(certificate: str) -> bool:
    return served_certificate() == der(certificate) and admission_tls(ROTATING_ADMIN)["error"] is None


@pytest.fixture
def rotating():
    """The rotating multiplexer serving what its files hold; afterwards, its files as they were."""
    cert, key = read(ROTATING_CERT), read(ROTATING_KEY)
    wait_for(lambda: in_force(ROTATING_CERT), "the rotating multiplexer serves its files' certificate")
    try:
        yield
    finally:
        replace(ROTATING_CERT, cert)
        replace(ROTATING_KEY, key)
        wait_for(lambda: in_force(ROTATING_CERT), "the certificate from before is back")


class Load(threading.Thread):
    """Embeds steadily, alternating a kept-alive connection and new ones, and keeps every failure."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.calls = 0
        self.failures: list[str] = []

    def run(self):
        with requests.Session() as session:
            while not self.stop.is_set():
                post = session.post if self.calls % 2 else requests.post
                try:
                    answer = post(f"{ROTATING_HTTP}/embed", json={"inputs": "steady"}, verify=CA, timeout=10)
                    if answer.status_code != 200:
                        self.failures.append(f"{answer.status_code} {answer.text}")
                except requests.RequestException as error:
                    self.failures.append(repr(error))
                self.calls += 1
                time.sleep(0.02)


def test_rotation_under_load_fails_no_call_and_reaches_new_connections(rotating):
    # To whichever of the two server certificates it does not serve now, so the order of tests
    # does not matter.
    name = "server2" if served_certificate() != der(pem("server2.crt")) else "server"
    new = pem(f"{name}.crt")
    old_der = served_certificate()
    # A connection opened before the rotation keeps its certificate, and keeps working.
    host, port = ROTATING_HTTP.removeprefix("https://").rsplit(":", 1)
    before = http.client.HTTPSConnection(host, int(port), timeout=10, context=verifying())
    before.request("GET", "/info")
    assert before.getresponse().read()
    assert before.sock.getpeercert(binary_form=True) == old_der != der(new)

    load = Load()
    load.start()
    try:
        wait_for(lambda: load.calls >= 30, "the load is under way")
        install(name)
        wait_for(lambda: served_certificate() == der(new), "a new connection gets the new certificate")
        at_rotation = load.calls
        wait_for(lambda: load.calls >= at_rotation + 30, "the load goes on after the rotation")
    finally:
        load.stop.set()
        load.join(timeout=30)
    assert not load.is_alive()
    assert load.failures == [], load.failures[:5]

    assert admission_tls(ROTATING_ADMIN)["serving"]["serial"] == openssl_serial(new)
    before.request("GET", "/info")
    assert before.getresponse().status == 200
    assert before.sock.getpeercert(binary_form=True) == old_der
    before.close()


def test_broken_certificate_file_keeps_the_old_certificate_and_is_reported(rotating):
    old_der = served_certificate()
    old_serial = admission_tls(ROTATING_ADMIN)["serving"]["serial"]
    rejected = metric(ROTATING_ADMIN, "teifleet_tls_reloads_total", result="rejected")
    good = read(ROTATING_CERT)

    replace(ROTATING_CERT, b"-----BEGIN CERTIFICATE-----\nnot a certificate!\n-----END CERTIFICATE-----\n")
    error = wait_for(lambda: admission_tls(ROTATING_ADMIN)["error"], "/admission reports the broken file")
    assert "certificate" in error
    assert metric(ROTATING_ADMIN, "teifleet_tls_reloads_total", result="rejected") > rejected
    # Still serving, new connections included, with the certificate from before.
    assert served_certificate() == old_der
    assert admission_tls(ROTATING_ADMIN)["serving"]["serial"] == old_serial
    answer = requests.post(f"{ROTATING_HTTP}/embed", json={"inputs": "still here"}, verify=CA, timeout=10)
    assert answer.status_code == 200, answer.text

    replace(ROTATING_CERT, good)
    wait_for(lambda: admission_tls(ROTATING_ADMIN)["error"] is None, "the error clears once the file is good")
    assert served_certificate() == old_der


def test_missing_certificate_file_keeps_the_old_certificate(rotating):
    old_der = served_certificate()
    good = read(ROTATING_CERT)
    os.remove(ROTATING_CERT)
    try:
        # Re-read each second and not found (as mid-update): what is in force stays.
        time.sleep(2.5)
        assert served_certificate() == old_der
        answer = requests.get(f"{ROTATING_HTTP}/info", verify=CA, timeout=10)
        assert answer.status_code == 200, answer.text
    finally:
        replace(ROTATING_CERT, good)


def test_admission_serial_is_openssls_for_a_serial_with_the_top_bit_set(rotating):
    install("server-high-serial")
    wait_for(lambda: in_force(pem("server-high-serial.crt")), "the certificate with serial C0FFEE is served")
    assert openssl_serial(pem("server-high-serial.crt")) == "C0FFEE"
    assert admission_tls(ROTATING_ADMIN)["serving"]["serial"] == "C0FFEE"

