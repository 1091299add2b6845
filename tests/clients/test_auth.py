"""API keys on the HTTP front, with real clients (tests/clients/run.sh starts a second
multiplexer whose pool has a keys file, and passes its one key): a wrong or missing key is
refused with 401 before anything is queued; the pool's key works as each SDK's own api_key or
token, and answers the same vectors as the pool without keys."""

import os

import openai
import pytest
import requests
from huggingface_hub import InferenceClient
from huggingface_hub.utils import HfHubHTTPError
from openai import OpenAI

from test_clients import assert_close, embedding_for

BASE = os.environ["TEIFLEET_HTTP_KEYED"]
KEY = os.environ["TEIFLEET_API_KEY"]


def test_openai_sdk_with_a_wrong_key_gets_authentication_error():
    client = OpenAI(base_url=f"{BASE}/v1", api_key=KEY + "-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.embeddings.create(input="hello", model="sim")
    assert refused.value.status_code == 401
    assert "invalid API key" in str(refused.value)


def test_openai_sdk_with_the_pools_key_gets_embeddings():
    client = OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0)
    result = client.embeddings.create(input=["first", "second"], model="sim", encoding_format="float")
    for text, item in zip(["first", "second"], result.data):
        assert_close(item.embedding, embedding_for(text))


def test_huggingface_hub_token_is_the_key():
    vectors = InferenceClient(model=BASE, token=KEY).feature_extraction("with a token")
    assert_close(vectors.reshape(-1).tolist(), embedding_for("with a token"))
    with pytest.raises(HfHubHTTPError) as refused:
        InferenceClient(model=BASE, token="hf_not_this_pools_key_at_all").feature_extraction("no")
    assert refused.value.response.status_code == 401


def test_teis_routes_answer_401_in_teis_shape_and_health_needs_no_key():
    missing = requests.post(f"{BASE}/embed", json={"inputs": "a"}, timeout=10)
    assert missing.status_code == 401
    assert missing.json()["error_type"] == "Unauthorized"
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    keyed = requests.post(f"{BASE}/embed", json={"inputs": "a"}, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert keyed.status_code == 200, keyed.text
    assert_close(keyed.json()[0], embedding_for("a"))
    assert requests.get(f"{BASE}/health", timeout=10).status_code == 200
