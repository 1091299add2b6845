"""Real client libraries against the multiplexer's HTTP front (tests/clients/run.sh starts it, in
front of the TEI simulator). Every answer is compared with the simulator's deterministic
embedding, reproduced here, so all paths (requests, openai, huggingface_hub, gRPC in the Rust
tests) are held to the same vectors."""

import base64
import math
import os
import struct

import numpy as np
import pytest
import requests
from huggingface_hub import InferenceClient
from openai import OpenAI

BASE = os.environ["TEIFLEET_HTTP"]
DIMENSIONS = 384
MASK = (1 << 64) - 1


def _fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def embedding_for(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """tei-sim's `embedding_for`: FNV-1a seed, SplitMix64 components in [-1, 1), L2-normalized."""
    state = _fnv1a(text.encode())
    values = []
    for _ in range(dimensions):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        values.append((z >> 40) / 16777216.0 * 2.0 - 1.0)
    norm = math.sqrt(sum(v * v for v in values))
    return [v / norm for v in values]


def assert_close(got, want):
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5


def test_requests_embed_batch_in_order():
    texts = [f"sentence {i}" for i in range(100)]
    answer = requests.post(f"{BASE}/embed", json={"inputs": texts}, timeout=30)
    assert answer.status_code == 200, answer.text
    vectors = answer.json()
    assert len(vectors) == 100
    for text, vector in zip(texts, vectors):
        assert_close(vector, embedding_for(text))


def test_requests_every_route_answers():
    post = lambda path, body: requests.post(f"{BASE}{path}", json=body, timeout=30)  # noqa: E731
    assert post("/embed_sparse", {"inputs": "a b"}).status_code == 200
    assert post("/embed_all", {"inputs": "a b"}).status_code == 200
    assert post("/predict", {"inputs": "a"}).json()[0]["label"]
    ranks = post("/rerank", {"query": "cats", "texts": ["dogs", "cats"], "return_text": True}).json()
    assert sorted(r["index"] for r in ranks) == [0, 1] and ranks[0]["text"] in ("dogs", "cats")
    assert post("/tokenize", {"inputs": "hello world"}).json()[0][0]["id"] >= 0
    assert requests.get(f"{BASE}/info", timeout=10).json()["model_id"] == "teifleet/sim-embedding"
    assert requests.get(f"{BASE}/health", timeout=10).status_code == 200


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def test_requests_similarity_is_the_cosine_of_the_embeddings():
    # 40 sentences: more than one TEI call takes, split and put back in order.
    sentences = [f"sentence {i}" for i in range(40)] + ["the source"]
    body = {"inputs": {"source_sentence": "the source", "sentences": sentences}}
    answer = requests.post(f"{BASE}/similarity", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    scores = answer.json()
    assert len(scores) == len(sentences)
    source = embedding_for("the source")
    for sentence, score in zip(sentences, scores):
        assert abs(score - dot(source, embedding_for(sentence))) < 1e-5
    assert abs(scores[-1] - 1.0) < 1e-5
    with_parameters = dict(body, parameters={"truncate": True, "truncation_direction": "Right"})
    assert requests.post(f"{BASE}/similarity", json=with_parameters, timeout=30).json() == scores
    empty = requests.post(
        f"{BASE}/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}}, timeout=10
    )
    assert empty.status_code == 400 and empty.json()["error_type"] == "Empty"


def test_huggingface_hub_sentence_similarity():
    # The client posts {"inputs": {"source_sentence", "sentences"}} to the endpoint's root.
    scores = InferenceClient(model=BASE).sentence_similarity("the source", other_sentences=["a cat", "the source"])
    assert len(scores) == 2
    assert abs(scores[0] - dot(embedding_for("the source"), embedding_for("a cat"))) < 1e-5
    assert abs(scores[1] - 1.0) < 1e-5


# More words than the simulator's 512-token limit (tests/clients/run.sh), as a RAG chunk can be.
LONG_DOCUMENT = " ".join(f"word{i}" for i in range(700))


def test_long_documents_are_truncated_as_teis_http_server_does():
    # No `truncate`: TEI's --auto-truncate (true by default); asked not to: TEI's 422.
    embedded = requests.post(f"{BASE}/embed", json={"inputs": LONG_DOCUMENT}, timeout=10)
    assert embedded.status_code == 200, embedded.text
    refused = requests.post(f"{BASE}/embed", json={"inputs": LONG_DOCUMENT, "truncate": False}, timeout=10)
    assert refused.status_code == 422 and refused.json()["error_type"] == "Validation", refused.text


def test_langchain_ingests_long_chunks():
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        base_url=f"{BASE}/v1", api_key="not-checked", model="sim", check_embedding_ctx_length=False, max_retries=0
    )
    vectors = embeddings.embed_documents([LONG_DOCUMENT, "a short chunk", LONG_DOCUMENT])
    assert len(vectors) == 3 and vectors[0] == vectors[2]
    assert abs(sum(x * x for x in vectors[1]) - 1.0) < 1e-3


def test_requests_errors_are_teis():
    empty = requests.post(f"{BASE}/embed", json={"inputs": []}, timeout=10)
    assert empty.status_code == 400 and empty.json()["error_type"] == "Empty"
    wrong = requests.post(f"{BASE}/embed", json={"inputs": 5}, timeout=10)
    assert wrong.status_code == 422 and wrong.json()["error_type"] == "Validation"
    not_json = requests.post(f"{BASE}/embed", data=b"{not json", timeout=10)
    assert not_json.status_code == 400, not_json.text
    too_many = requests.post(f"{BASE}/embed", json={"inputs": ["a"] * 60_000}, timeout=30)
    assert too_many.status_code == 413 and too_many.json()["error_type"] == "Validation", too_many.text
    big = requests.post(f"{BASE}/embed", json={"inputs": "x" * 3_000_000}, timeout=30)
    assert big.status_code == 413


@pytest.fixture
def openai_client():
    return OpenAI(base_url=f"{BASE}/v1", api_key="not-checked", max_retries=0)


def test_openai_float(openai_client):
    texts = ["first", "second", "third"]
    result = openai_client.embeddings.create(input=texts, model="sim", encoding_format="float")
    assert [d.index for d in result.data] == [0, 1, 2]
    for text, item in zip(texts, result.data):
        assert_close(item.embedding, embedding_for(text))
    assert result.usage.prompt_tokens > 0
    assert result.usage.total_tokens == result.usage.prompt_tokens


def test_openai_base64(openai_client):
    # Asked for explicitly, the SDK hands back OpenAI's base64 of little-endian float32.
    result = openai_client.embeddings.create(input="first", model="sim", encoding_format="base64")
    raw = base64.b64decode(result.data[0].embedding)
    assert_close(struct.unpack(f"<{len(raw) // 4}f", raw), embedding_for("first"))
    # Left to the SDK's default, it asks for base64 and decodes it itself.
    default = openai_client.embeddings.create(input="first", model="sim")
    assert_close(default.data[0].embedding, embedding_for("first"))


def test_openai_dimensions(openai_client):
    result = openai_client.embeddings.create(input="first", model="sim", dimensions=16, encoding_format="float")
    assert_close(result.data[0].embedding, embedding_for("first", 16))


def test_huggingface_hub_feature_extraction():
    client = InferenceClient(model=BASE)
    vectors = client.feature_extraction("hello from huggingface_hub")
    assert isinstance(vectors, np.ndarray)
    assert_close(np.asarray(vectors).reshape(-1).tolist(), embedding_for("hello from huggingface_hub"))


def test_all_clients_agree():
    text = "the same text everywhere"
    via_requests = requests.post(f"{BASE}/embed", json={"inputs": text}, timeout=10).json()[0]
    via_openai = OpenAI(base_url=f"{BASE}/v1", api_key="x").embeddings.create(input=text, model="m").data[0].embedding
    via_hub = InferenceClient(model=BASE).feature_extraction(text).reshape(-1).tolist()
    assert_close(via_requests, via_openai)
    assert_close(via_requests, via_hub)
