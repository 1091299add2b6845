#!/usr/bin/env python3
"""OpenAI's Batch API on a teifleet pool, driven by the OpenAI Python SDK unchanged (`base_url`).

tests/e2e/tests/real_batch.rs runs this against `teifleet-batch` on the local cluster's real node,
in steps, so the Rust test can delete pods between them:

  batch_sdk.py create  --base-url U --api-key K --lines N --model M [--bad]   -> {"batch_id","file_id"}
  batch_sdk.py wait    --base-url U --api-key K --batch-id B --until STATUS [--timeout S]
  batch_sdk.py cancel  --base-url U --api-key K --batch-id B
  batch_sdk.py check   --base-url U --api-key K --batch-id B --lines N --pool-url P [--bad] [--partial]
  batch_sdk.py isolation --base-url U --api-key K --file-id F --batch-id B

Each step prints one JSON line on success and exits non-zero with the reason otherwise.
"""

import argparse
from array import array
import io
import json
import random
import sys
import time

import openai

# The bad lines `create --bad` plants, by custom_id, with the error code each must come back with.
# The line that is not JSON has no custom_id anyone could read: its error line has null.
BAD = {
    None: "invalid_request",
    "bad-url": "invalid_request",
    "bad-no-input": "invalid_request",
    "bad-model": "model_not_found",
}
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def client(args):
    return openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=5, timeout=60)


def text(i):
    """A text of real length: a sentence or three, different for every line."""
    words = ["kubernetes", "embedding", "vector", "search", "latency", "budget", "replica", "queue"]
    rng = random.Random(i)
    return f"document {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(12, 60)))


def request_body(i, model):
    # Every fourth request sends an array of inputs; the rest one string.
    body = {"model": model, "input": [text(i), text(i + 1_000_000)] if i % 4 == 0 else text(i)}
    if i % 10 == 3:
        body["encoding_format"] = "float"
    return body


def batch_file(lines, model, bad):
    out = io.StringIO()
    for i in range(lines):
        line = {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/embeddings", "body": request_body(i, model)}
        out.write(json.dumps(line) + "\n")
    if bad:
        out.write('{"custom_id": "bad-not-json", "method": "POST", \n')
        out.write(json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/chat/completions",
                              "body": {"model": model, "input": "x"}}) + "\n")
        out.write(json.dumps({"custom_id": "bad-no-input", "method": "POST", "url": "/v1/embeddings",
                              "body": {"model": model}}) + "\n")
        out.write(json.dumps({"custom_id": "bad-model", "method": "POST", "url": "/v1/embeddings",
                              "body": {"model": "no-such/model", "input": "x"}}) + "\n")
    return out.getvalue().encode()


def create(args):
    api = client(args)
    uploaded = api.files.create(file=("requests.jsonl", batch_file(args.lines, args.model, args.bad)),
                                purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0, uploaded
    assert api.files.retrieve(uploaded.id).id == uploaded.id
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                               completion_window="24h", metadata={"suite": "real_batch"})
    assert batch.status in ("validating", "in_progress"), batch
    assert batch.metadata == {"suite": "real_batch"}, batch.metadata
    assert any(b.id == batch.id for b in api.batches.list(limit=100)), "the new batch is not listed"
    return {"batch_id": batch.id, "file_id": uploaded.id}


def wait(args):
    api = client(args)
    deadline = time.monotonic() + args.timeout
    seen = []
    while True:
        batch = api.batches.retrieve(args.batch_id)
        if not seen or seen[-1] != batch.status:
            seen.append(batch.status)
        counts = batch.request_counts
        if args.until == "running" and counts is not None and counts.completed + counts.failed > 0:
            return {"status": batch.status, "seen": seen, "done": counts.completed + counts.failed}
        if batch.status == args.until:
            return {"status": batch.status, "seen": seen, "counts": counts.model_dump() if counts else None}
        if batch.status in TERMINAL:
            raise SystemExit(f"batch {args.batch_id} ended {batch.status}, not {args.until}: {batch.model_dump_json()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"batch {args.batch_id} still {batch.status} after {args.timeout}s (seen {seen})")
        time.sleep(0.5)


def cancel(args):
    batch = client(args).batches.cancel(args.batch_id)
    assert batch.status in ("cancelling", "cancelled"), batch.status
    return {"status": batch.status}


def lines_of(api, file_id):
    if file_id is None:
        return []
    return [json.loads(line) for line in api.files.content(file_id).text.splitlines() if line]


def check(args):
    api = client(args)
    batch = api.batches.retrieve(args.batch_id)
    assert batch.status in TERMINAL, batch.status
    outputs, errors = lines_of(api, batch.output_file_id), lines_of(api, batch.error_file_id)
    counts = batch.request_counts
    assert counts.completed == len(outputs), (counts, len(outputs))
    assert counts.failed == len(errors), (counts, len(errors))
    ids = [line["custom_id"] for line in outputs + errors]
    assert len(ids) == len(set(ids)), "a custom_id came back twice"
    assert len(outputs) + len(errors) == counts.completed + counts.failed
    wanted = {f"req-{i}" for i in range(args.lines)} | (set(BAD) if args.bad else set())
    if args.partial:
        assert set(ids) <= wanted, set(ids) - wanted
        assert counts.total == len(wanted), counts
    else:
        assert set(ids) == wanted, (len(set(ids)), len(wanted), sorted(wanted - set(ids))[:5])
        assert counts.total == len(wanted), counts
    for line in outputs:
        response = line["response"]
        assert line["error"] is None and response["status_code"] == 200, line
        assert line["id"].startswith("batch_req_") and response["request_id"], line
        body = response["body"]
        assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0, body
    for line in errors:
        if line["custom_id"] in BAD:
            assert line["error"]["code"] == BAD[line["custom_id"]], line
            assert line["error"]["message"], line
    if args.bad and not args.partial:
        assert {line["custom_id"] for line in errors} == set(BAD), [line["custom_id"] for line in errors]
    # Sampled vectors equal what the pool's own /v1/embeddings answers for the same body.
    pool = openai.OpenAI(base_url=args.pool_url, api_key="unused", max_retries=5, timeout=60)
    sample = random.Random(7).sample(outputs, min(50, len(outputs)))
    for line in sample:
        i = int(line["custom_id"].removeprefix("req-"))
        body = request_body(i, args.model)
        direct = pool.embeddings.create(**body)
        got = line["response"]["body"]["data"]
        # As float32, which is what TEI answers: the SDK's own call asks for base64 (exact float32s)
        # unless the body names a format, the batch line has JSON decimals.
        assert [array("f", d["embedding"]) for d in got] == [array("f", d.embedding) for d in direct.data], \
            line["custom_id"]
        assert line["response"]["body"]["usage"]["prompt_tokens"] == direct.usage.prompt_tokens
    return {"outputs": len(outputs), "errors": len(errors), "counts": counts.model_dump(), "sampled": len(sample)}


def isolation(args):
    api = client(args)
    for name, call in [("file", lambda: api.files.retrieve(args.file_id)),
                       ("file content", lambda: api.files.content(args.file_id)),
                       ("batch", lambda: api.batches.retrieve(args.batch_id)),
                       ("batch cancel", lambda: api.batches.cancel(args.batch_id))]:
        try:
            call()
        except openai.NotFoundError:
            continue
        raise SystemExit(f"another tenant's {name} was served")
    assert all(b.id != args.batch_id for b in api.batches.list(limit=100)), "another tenant's batch is listed"
    assert all(f.id != args.file_id for f in api.files.list()), "another tenant's file is listed"
    return {"isolated": True}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["create", "wait", "cancel", "check", "isolation"])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--lines", type=int, default=0)
    parser.add_argument("--model", default="")
    parser.add_argument("--bad", action="store_true")
    parser.add_argument("--partial", action="store_true")
    parser.add_argument("--batch-id")
    parser.add_argument("--file-id")
    parser.add_argument("--until", default="completed")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--pool-url")
    args = parser.parse_args()
    step = {"create": create, "wait": wait, "cancel": cancel, "check": check, "isolation": isolation}[args.step]
    print(json.dumps(step(args)))


if __name__ == "__main__":
    sys.exit(main())
