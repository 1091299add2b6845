"""A stock gRPC client streaming a batch, as TEI's maintainers tell gRPC users to embed batches:
grpcio sends 100,000 small messages on one EmbedStream as fast as it can, and every one is
answered, in order, with no GOAWAY, through the sidecar as by TEI (here the simulator) alone.
Without generated stubs: an EmbedRequest is one string field, an EmbedResponse's vector field 1."""

import os

import grpc

from test_tls import embed_request, protobuf_fields

SIDECAR = os.environ["TEIFLEET_GRPC"]
TEI = os.environ["TEIFLEET_SIM_GRPC"]
MESSAGES = 100_000


def stream_all(target: str) -> int:
    """Streams MESSAGES texts on one EmbedStream; the number of answers, each checked."""
    with grpc.insecure_channel(target) as channel:
        call = channel.stream_stream(
            "/tei.v1.Embed/EmbedStream", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        answered = 0
        for answer in call(embed_request(f"text {i}") for i in range(MESSAGES)):
            assert protobuf_fields(answer)[1], "an answer carries a vector"
            answered += 1
        return answered


def test_grpcio_streams_100000_small_messages_on_one_embed_stream_as_tei_serves_them():
    assert stream_all(TEI) == MESSAGES, "TEI (the simulator) alone answers every message"
    assert stream_all(SIDECAR) == MESSAGES, "so does the sidecar, without closing the connection"
