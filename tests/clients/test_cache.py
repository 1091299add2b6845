"""The embedding cache with real clients (tests/clients/run.sh starts a multiplexer whose pool
caches, in front of the shared simulator, whose /stats says what TEI did): the openai SDK, requests
and huggingface_hub get the same vectors from a hit as from TEI, TEI is not asked again, and the
`x-teifleet-cache` header says so, per input."""

import os
import time
import uuid

import requests
from huggingface_hub import InferenceClient
from openai import OpenAI

from test_clients import assert_close, embedding_for

BASE = os.environ["TEIFLEET_HTTP_CACHED"]
SIM_ADMIN = os.environ["TEIFLEET_SIM_ADMIN"]


def tei_work():
    """Inference calls the simulator admitted (the other multiplexers send it nothing meanwhile)."""
    return requests.get(f"{SIM_ADMIN}/stats", timeout=10).json()["requests_admitted"]


def embed(inputs):
    answer = requests.post(f"{BASE}/embed", json={"inputs": inputs}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.headers.get("x-teifleet-cache"), answer.json()


def setup_module():
    # The cache is passed by until the sidecar has read TEI's Info: wait for a probe's hit.
    probe = f"probe {uuid.uuid4()}"
    for _ in range(200):
        if embed([probe])[0] == "hit":
            return
        time.sleep(0.1)
    raise AssertionError("the cache never came into use")


def test_openai_sdk_hits_are_teis_vectors_and_cost_tei_nothing():
    client = OpenAI(base_url=f"{BASE}/v1", api_key="unused", max_retries=0)
    texts = [f"openai cached {uuid.uuid4()}" for _ in range(3)]
    before = tei_work()
    first = client.embeddings.with_raw_response.create(input=texts, model="sim", encoding_format="float")
    assert first.headers.get("x-teifleet-cache") == "miss"
    assert tei_work() - before == 3
    again = client.embeddings.with_raw_response.create(input=texts, model="sim", encoding_format="float")
    assert again.headers.get("x-teifleet-cache") == "hit"
    assert tei_work() - before == 3, "TEI was not asked again"
    for text, a, b in zip(texts, first.parse().data, again.parse().data):
        assert a.embedding == b.embedding
        assert_close(b.embedding, embedding_for(text))


def test_requests_batches_are_cached_per_input():
    a, b, new1, new2 = (f"requests {name} {uuid.uuid4()}" for name in ("a", "b", "new1", "new2"))
    assert embed([a, b])[0] == "miss"
    before = tei_work()
    cache, vectors = embed([a, new1, b, new2])
    assert cache == "partial"
    assert tei_work() - before == 2, "TEI embedded the new inputs only"
    for text, vector in zip([a, new1, b, new2], vectors):
        assert_close(vector, embedding_for(text))


def test_huggingface_hub_gets_the_same_vector_from_a_hit():
    client = InferenceClient(model=BASE)
    text = f"huggingface {uuid.uuid4()}"
    first = client.feature_extraction(text).reshape(-1).tolist()
    before = tei_work()
    again = client.feature_extraction(text).reshape(-1).tolist()
    assert tei_work() == before
    assert again == first
    assert_close(again, embedding_for(text))
