"""tei-manager's own API (tei_multiplexer.v1.TeiMultiplexer) from a real tei-manager client stack:
grpcio with stubs generated at test time from the pinned proto, pyarrow for the Arrow batches, as
tei-manager's users write them. The client changes its address and nothing else."""

import importlib
import os
import sys
import tempfile

import grpc
import pyarrow as pa
import pytest
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO = os.path.join(ROOT, "proto")
MODEL = "teifleet/sim-embedding"


@pytest.fixture(scope="module")
def stubs():
    """tei.v1 and tei_multiplexer.v1 modules, generated from proto/ into a temporary directory."""
    out = tempfile.mkdtemp(prefix="tei-manager-stubs-")
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    for proto in ("tei/v1/tei.proto", "tei_multiplexer/v1/multiplexer.proto"):
        code = protoc.main(
            ["protoc", f"-I{PROTO}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}", proto]
        )
        assert code == 0, f"protoc failed on {proto}"
    sys.path.insert(0, out)
    tei = importlib.import_module("tei.v1.tei_pb2")
    mux = importlib.import_module("tei_multiplexer.v1.multiplexer_pb2")
    mux_grpc = importlib.import_module("tei_multiplexer.v1.multiplexer_pb2_grpc")
    return tei, mux, mux_grpc


@pytest.fixture(scope="module")
def client(stubs):
    _, _, mux_grpc = stubs
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    channel = grpc.insecure_channel(os.environ["TEIFLEET_GRPC"], options=options)
    yield mux_grpc.TeiMultiplexerStub(channel)
    channel.close()


def target(mux):
    return mux.Target(model_id=MODEL)


def ipc(texts, compression=None):
    batch = pa.record_batch([pa.array(texts, type=pa.string())], names=["text"])
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def read(payload):
    return pa.ipc.open_stream(payload).read_all()


def test_wrapped_rpcs_answer_as_tei(stubs, client):
    tei, mux, _ = stubs
    info = client.Info(mux.InfoRequest(target=target(mux)))
    assert info.model_id == MODEL
    answer = client.Embed(mux.EmbedRequest(target=target(mux), request=tei.EmbedRequest(inputs="hello")))
    assert len(answer.embeddings) > 0
    messages = [mux.EmbedRequest(target=target(mux), request=tei.EmbedRequest(inputs=t)) for t in ("a", "b", "c")]
    answers = list(client.EmbedStream(iter(messages)))
    assert len(answers) == 3
    with pytest.raises(grpc.RpcError) as refused:
        client.Embed(mux.EmbedRequest(request=tei.EmbedRequest(inputs="x")))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_embed_arrow_from_pyarrow(stubs, client):
    tei, mux, _ = stubs
    texts = ["first", None, "", "last"]
    request = mux.EmbedArrowRequest(
        target=target(mux), arrow_ipc=ipc(texts, "lz4"), normalize=True, compression=mux.ARROW_COMPRESSION_LZ4
    )
    table = read(client.EmbedArrow(request).arrow_ipc)
    assert table.num_rows == 4
    assert table.column_names == ["embeddings", "error"]
    embeddings, errors = table.column("embeddings").to_pylist(), table.column("error").to_pylist()
    single = client.Embed(
        mux.EmbedRequest(target=target(mux), request=tei.EmbedRequest(inputs="last", normalize=True))
    )
    assert embeddings[3] == pytest.approx(list(single.embeddings), rel=1e-6)
    assert embeddings[1] is None and errors[1] == "input text is null"
    assert embeddings[2] is None and "empty" in errors[2]
    assert errors[0] is None and errors[3] is None

    half = mux.EmbedArrowRequest(target=target(mux), arrow_ipc=ipc(["x"]), output_dtype=mux.OUTPUT_DTYPE_F16)
    table = read(client.EmbedArrow(half).arrow_ipc)
    assert table.schema.field("embeddings").type.value_type == pa.float16()


def test_embed_arrow_stream_and_refusals(stubs, client):
    _, mux, _ = stubs
    batches = [
        mux.EmbedArrowRequest(target=target(mux), arrow_ipc=ipc(["a", "b"])),
        mux.EmbedArrowRequest(arrow_ipc=ipc(["c"])),
    ]
    answers = [read(answer.arrow_ipc).num_rows for answer in client.EmbedArrowStream(iter(batches))]
    assert answers == [2, 1]
    with pytest.raises(grpc.RpcError) as refused:
        client.EmbedArrow(mux.EmbedArrowRequest(target=target(mux), arrow_ipc=b"not arrow"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Invalid Arrow IPC" in refused.value.details()


def test_embed_arrow_of_a_hundred_thousand_rows_is_read_whole(stubs):
    """100,000 texts in one EmbedArrow: at 384 dimensions the answer is 154 MB, past the 40 MiB a
    held answer may be, so it is streamed as its one gRPC message; pyarrow reads every row, each
    the vector a single Embed gives (LZ4 asked: buffers marked uncompressed, read the same)."""
    tei, mux, mux_grpc = stubs
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", 64 << 20)]
    with grpc.insecure_channel(os.environ["TEIFLEET_GRPC"], options=options) as channel:
        client = mux_grpc.TeiMultiplexerStub(channel)
        texts = [f"row {i}" for i in range(100_000)]
        for compression in (mux.ARROW_COMPRESSION_NONE, mux.ARROW_COMPRESSION_LZ4):
            request = mux.EmbedArrowRequest(target=target(mux), arrow_ipc=ipc(texts), compression=compression)
            table = read(client.EmbedArrow(request, timeout=600).arrow_ipc)
            assert table.num_rows == 100_000
            assert table.column_names == ["embeddings", "error"]
            embeddings = table.column("embeddings")
            assert embeddings.null_count == 0 and table.column("error").null_count == 100_000
            for row in (0, 54_321, 99_999):
                single = client.Embed(
                    mux.EmbedRequest(target=target(mux), request=tei.EmbedRequest(inputs=texts[row], normalize=False))
                )
                assert embeddings[row].as_py() == pytest.approx(list(single.embeddings), rel=1e-6)
