"""An embedding job's output as its users read it: run.sh wrote a Parquet corpus into a SeaweedFS
bucket with pyarrow and ran the debug teifleet-job (two workers) through the multiplexer in front of
the simulator, Parquet parts out to another prefix. Here pyarrow reads those parts back over S3
(`pyarrow.fs.S3FileSystem` and `pyarrow.dataset`, as docs/jobs.md shows) and a sample of vectors is
checked against what `tei.v1.Embed` answers for the same texts through the same multiplexer."""

import importlib
import os
import random
import sys
import tempfile

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs
import pyarrow.parquet as pq
import pytest
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO = os.path.join(ROOT, "proto")
SAMPLE = 50

# No instance metadata lookups from the AWS SDK inside pyarrow: the endpoint and region are given.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def s3(secret_key=None):
    return pyarrow.fs.S3FileSystem(
        access_key=os.environ["TEIFLEET_S3_ACCESS_KEY"],
        secret_key=secret_key or os.environ["TEIFLEET_S3_SECRET_KEY"],
        endpoint_override=os.environ["TEIFLEET_S3_ENDPOINT"],
        scheme="http",
        region="us-east-1",
        # The SDK's defaults give up after 3 s without a byte: a busy CI machine is slower.
        connect_timeout=10,
        request_timeout=60,
    )


@pytest.fixture(scope="module")
def corpus():
    """The input as run.sh wrote it: id -> text (None for the null text)."""
    table = pq.read_table(os.environ["TEIFLEET_JOB_INPUT"], filesystem=s3())
    return dict(zip(table.column("id").to_pylist(), table.column("text").to_pylist()))


@pytest.fixture(scope="module")
def output():
    """The job's output directory, one dataset, read back over S3."""
    return ds.dataset(os.environ["TEIFLEET_JOB_OUTPUT"], format="parquet", filesystem=s3()).to_table()


@pytest.fixture(scope="module")
def embed():
    """tei.v1.Embed/Embed over grpcio, with stubs generated from proto/ at test time."""
    out = tempfile.mkdtemp(prefix="tei-stubs-")
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    code = protoc.main(
        ["protoc", f"-I{PROTO}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}", "tei/v1/tei.proto"]
    )
    assert code == 0, "protoc failed on tei/v1/tei.proto"
    sys.path.insert(0, out)
    tei = importlib.import_module("tei.v1.tei_pb2")
    tei_grpc = importlib.import_module("tei.v1.tei_pb2_grpc")
    channel = grpc.insecure_channel(os.environ["TEIFLEET_GRPC"])
    stub = tei_grpc.EmbedStub(channel)
    # As the job sends its rows: normalized (its default), not truncated.
    yield lambda text: list(stub.Embed(tei.EmbedRequest(inputs=text, normalize=True, truncate=False)).embeddings)
    channel.close()


def bad(corpus):
    """The planted bad rows: empty, null, and too long for the simulator (512 tokens)."""
    return {id: text for id, text in corpus.items() if not text or len(text) > 10_000}


def test_every_input_id_once_in_the_documented_schema(corpus, output, embed):
    assert len(corpus) == 3000
    assert output.num_rows == len(corpus)
    ids = output.column("id").to_pylist()
    assert sorted(ids) == sorted(corpus), "every input id exactly once"
    dimension = len(embed("what dimension does the model answer in"))
    # docs/jobs.md: the id in the input's own type, FixedSizeList<float32> of the model's
    # dimension, a Utf8 error.
    schema = output.schema
    assert schema.field("id").type == pa.string()
    embedding = schema.field("embedding").type
    assert pa.types.is_fixed_size_list(embedding), embedding
    assert (embedding.value_type, embedding.list_size) == (pa.float32(), dimension), embedding
    assert schema.field("error").type == pa.string()
    parts = pyarrow.fs.FileSelector(os.environ["TEIFLEET_JOB_OUTPUT"])
    names = sorted(info.base_name for info in s3().get_file_info(parts))
    assert names == [f"part-{n:06}.parquet" for n in range(6)], "one part per row group of the input"


def test_planted_bad_rows_carry_an_error_and_no_vector(corpus, output, embed):
    planted = bad(corpus)
    assert len(planted) == 3, planted
    rows = {row["id"]: row for row in output.to_pylist()}
    for id, text in planted.items():
        assert rows[id]["embedding"] is None, id
        assert rows[id]["error"], id
    empty, long, null = (id for id, _ in sorted(planted.items(), key=lambda item: (item[1] is None, len(item[1] or ""))))
    assert rows[empty]["error"] == "`text` is empty"
    assert rows[null]["error"] == "`text` is null"
    # The too-long text's error is TEI's own refusal, as tei.v1.Embed gives it for that text.
    with pytest.raises(grpc.RpcError) as refused:
        embed(corpus[long])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() in rows[long]["error"], (refused.value.details(), rows[long]["error"])
    good = output.filter(pc.invert(pc.is_in(output.column("id"), pa.array(list(planted)))))
    assert good.column("error").null_count == good.num_rows, "no other row failed"
    assert good.column("embedding").null_count == 0


def test_sampled_vectors_equal_tei_v1_embed(corpus, output, embed):
    # Exactly equal: the job's vectors are the float32s TEI answered for the row (normalized by
    # TEI, not by the job), carried through Arrow and Parquet without arithmetic.
    seed = random.randrange(1 << 32)
    planted = bad(corpus)
    ids = random.Random(seed).sample(sorted(set(corpus) - set(planted)), SAMPLE)
    vectors = dict(zip(output.column("id").to_pylist(), output.column("embedding").to_pylist()))
    worst = 0.0
    for id in ids:
        got = np.asarray(vectors[id], dtype=np.float32)
        want = np.asarray(embed(corpus[id]), dtype=np.float32)
        assert got.shape == want.shape, f"{id} (seed {seed})"
        worst = max(worst, float(np.max(np.abs(got - want))))
        assert np.array_equal(got, want), f"{id}: the job's vector is not tei.v1.Embed's (seed {seed})"
    print(f"{SAMPLE} sampled ids (seed {seed}), max |difference| {worst}: {ids[:5]}...")


def test_wrong_credentials_are_refused():
    # SeaweedFS answers 403. pyarrow's AWS SDK names it ACCESS_DENIED on a HEAD (a 403 has no body
    # there), and by the S3 error code the body carries on a listing.
    wrong = s3("not-the-secret-key")
    with pytest.raises(OSError) as refused:
        ds.dataset(os.environ["TEIFLEET_JOB_OUTPUT"], format="parquet", filesystem=wrong).to_table()
    assert "ACCESS_DENIED during HeadObject" in str(refused.value), str(refused.value)
    with pytest.raises(OSError) as listed:
        wrong.get_file_info(pyarrow.fs.FileSelector(os.environ["TEIFLEET_JOB_OUTPUT"]))
    assert "SIGNATURE_DOES_NOT_MATCH during ListObjectsV2" in str(listed.value), str(listed.value)
