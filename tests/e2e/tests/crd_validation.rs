//! The real API server refuses invalid EmbeddingPools with messages a person understands.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};
use teifleet_crds::EmbeddingPool;
use teifleet_e2e::{admin_client, install_crd, kubectl, test_namespace};

fn pool(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "teifleet.dev/v1alpha1",
        "kind": "EmbeddingPool",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap()
}

fn with(mut base: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = if parent.is_empty() { &mut base } else { base.pointer_mut(parent).unwrap() };
    target[key] = value;
    base
}

#[tokio::test]
async fn invalid_specs_are_refused_with_readable_messages() {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace("crd").await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &ApiResource::erase::<EmbeddingPool>(&()));
    let valid = json!({
        "model": { "id": "BAAI/bge-small-en-v1.5" },
        "gpu": { "type": "nvidia-l4", "count": 1 },
        "replicas": 1,
        "concurrency": { "maxInFlight": 8, "maxQueued": 16, "queueTimeout": "1500ms", "maxInFlightPerReplica": 4,
                         "maxInFlightTokens": 16384, "adaptive": true, "tenants": [{ "name": "search", "weight": 3 }] },
        "tei": { "maxClientBatchSize": 64, "autoTruncate": false, "extraArgs": ["--tokenization-workers=2"] },
        "http": { "payloadLimit": 4000000, "maxRequestInputs": 1000 },
        "tls": { "secretName": "bge-small-tls", "clientCA": { "configMapName": "clients-ca" } },
        "cache": { "size": "64Mi", "ttl": "12h", "sharedAcrossTenants": true,
                   "store": { "url": "rediss://valkey.ml.svc:6380/0", "username": "teifleet", "timeout": "5ms",
                              "passwordSecret": { "name": "cache-auth", "key": "password" } } },
    });

    let cases = [
        ("/replicas", json!(-1), "replicas must be 0 or more"),
        ("/concurrency/maxInFlight", json!(0), "concurrency.maxInFlight must be at least 1"),
        ("/concurrency/maxQueued", json!(-1), "concurrency.maxQueued must be 0 or more"),
        ("/concurrency/queueTimeout", json!("soon"), "concurrency.queueTimeout must be a duration such as 500ms"),
        ("/concurrency/queueTimeout", json!("10"), "concurrency.queueTimeout must be a duration such as 500ms"),
        ("/gpu/type", json!("nvidia-rtx-9090"), "Unsupported value: \"nvidia-rtx-9090\""),
        ("/gpu/count", json!(0), "gpu.count must be at least 1 unless gpu.type is cpu"),
        ("/model/id", json!(""), "model.id must name a Hugging Face model or a local path"),
        ("/concurrency/maxInFlightPerReplica", json!(0), "concurrency.maxInFlightPerReplica must be at least 1"),
        ("/concurrency/maxInFlightTokens", json!(0), "concurrency.maxInFlightTokens must be at least 1"),
        ("/http", json!({ "payloadLimit": 0 }), "http.payloadLimit must be at least 1 byte"),
        ("/tei", json!({ "maxClientBatchSize": 0 }), "tei.maxClientBatchSize must be at least 1"),
        (
            "/tei",
            json!({ "extraArgs": ["--payload-limit=10"] }),
            "tei.extraArgs must not set --max-client-batch-size, --payload-limit or --auto-truncate",
        ),
        (
            "/tei",
            json!({ "extraArgs": ["--auto-truncate"] }),
            "tei.extraArgs must not set --max-client-batch-size, --payload-limit or --auto-truncate",
        ),
        (
            "/tei",
            json!({ "env": [{ "name": "AUTO_TRUNCATE", "value": "false" }] }),
            "tei.env must not set AUTO_TRUNCATE: set tei.autoTruncate",
        ),
        ("/http", json!({ "maxRequestInputs": 0 }), "http.maxRequestInputs must be between 1 and 1000000"),
        ("/concurrency/queryReserve", json!(51), "concurrency.queryReserve must be between 0 and 50 (percent)"),
        ("/concurrency/deviceTimeCap", json!(0), "concurrency.deviceTimeCap must be between 1 and 100 (percent)"),
        ("/concurrency/tenants", json!([{ "name": "a" }, { "name": "a" }]), "concurrency.tenants names must be unique"),
        ("/concurrency/tenants", json!([{ "name": "" }]), "concurrency.tenants[].name must be 1 to 128 characters"),
        (
            "/concurrency/tenants",
            json!([{ "name": "a", "weight": 0 }]),
            "concurrency.tenants[].weight must be between 1 and 1000",
        ),
        ("/tls", json!({}), "spec.tls.secretName: Required value"),
        (
            "/tls",
            json!({ "secretName": "Pool_TLS" }),
            "tls.secretName must name a Secret in the pool's namespace (lowercase letters, digits, '-' and '.')",
        ),
        (
            "/tls/clientCA",
            json!({ "secretName": "clients-ca", "configMapName": "clients-ca" }),
            "tls.clientCA needs exactly one of secretName or configMapName",
        ),
        (
            "/tls/clientCA",
            json!({ "key": "bundle.pem" }),
            "tls.clientCA needs exactly one of secretName or configMapName",
        ),
        (
            "/tls/clientCA",
            json!({ "secretName": "Clients CA" }),
            "tls.clientCA.secretName must name a Secret in the pool's namespace",
        ),
        (
            "/tls/clientCA",
            json!({ "configMapName": "clients/ca" }),
            "tls.clientCA.configMapName must name a ConfigMap in the pool's namespace",
        ),
        (
            "/tls/clientCA",
            json!({ "configMapName": "clients-ca", "key": "" }),
            "tls.clientCA.key must be a data key, 1 to 253 characters",
        ),
        (
            "/cache/size",
            json!("1Ti"),
            "cache.size must be 0 or a whole number with k, M, G, Ki, Mi or Gi, at most 64Gi",
        ),
        (
            "/cache/size",
            json!("65Gi"),
            "cache.size must be 0 or a whole number with k, M, G, Ki, Mi or Gi, at most 64Gi",
        ),
        (
            "/cache/size",
            json!("1.5Gi"),
            "cache.size must be 0 or a whole number with k, M, G, Ki, Mi or Gi, at most 64Gi",
        ),
        (
            "/cache/size",
            json!("-1Mi"),
            "cache.size must be 0 or a whole number with k, M, G, Ki, Mi or Gi, at most 64Gi",
        ),
        (
            "/cache",
            json!({ "size": "0" }),
            "cache.size 0 (no local tier) needs cache.store: the cache would keep nothing",
        ),
        ("/cache/ttl", json!("1d"), "cache.ttl must be a duration above zero such as 30m or 24h"),
        ("/cache/ttl", json!("0s"), "cache.ttl must be a duration above zero such as 30m or 24h"),
        ("/cache/store", json!({ "timeout": "5ms" }), "spec.cache.store.url: Required value"),
        (
            "/cache/store/url",
            json!("redis://teifleet:hunter2@valkey:6379/0"),
            "cache.store.url must be redis://host[:port][/db] or rediss://... (no user or password: use passwordSecret)",
        ),
        (
            "/cache/store/url",
            json!("https://valkey:6379"),
            "cache.store.url must be redis://host[:port][/db] or rediss://... (no user or password: use passwordSecret)",
        ),
        (
            "/cache/store/timeout",
            json!("2s"),
            "cache.store.timeout must be a duration above zero and at most 1s, such as 5ms",
        ),
        (
            "/cache/store/passwordSecret",
            json!({ "name": "Cache_Auth", "key": "password" }),
            "cache.store.passwordSecret.name must name a Secret in the pool's namespace",
        ),
        (
            "/cache/store/passwordSecret",
            json!({ "name": "cache-auth", "key": "pass/word" }),
            "cache.store.passwordSecret.key must be a Secret data key",
        ),
        (
            "/cache/store/passwordSecret",
            json!({ "name": "cache-auth" }),
            "spec.cache.store.passwordSecret.key: Required value",
        ),
        (
            "/cache/store",
            json!({ "url": "redis://valkey", "username": "teifleet" }),
            "cache.store.username needs cache.store.passwordSecret: a user logs in with a password",
        ),
    ];
    for (index, (pointer, value, message)) in cases.into_iter().enumerate() {
        let name = format!("invalid-{index}");
        let error = api
            .create(&PostParams::default(), &pool(&name, with(valid.clone(), pointer, value.clone())))
            .await
            .expect_err(&format!("{pointer}={value} must be refused"));
        let text = error.to_string();
        assert!(text.contains(message), "{pointer}={value}: expected {message:?} in {text:?}");
        assert!(api.get_opt(&name).await.unwrap().is_none(), "a refused pool must not exist");
    }

    // The same base spec is accepted, and so is a CPU pool with no GPUs: the rules are not
    // refusing everything.
    let accepted =
        api.create(&PostParams::default(), &pool("valid", valid.clone())).await.expect("valid spec accepted");
    assert_eq!(
        accepted.data["spec"]["tls"]["clientCA"],
        json!({ "configMapName": "clients-ca", "key": "ca.crt" }),
        "the CA bundle's key defaults to cert-manager's and trust-manager's"
    );
    assert_eq!(accepted.data["spec"]["cache"]["enabled"], json!(true), "present: on");
    let store_only = with(valid.clone(), "/cache/size", json!("0"));
    api.create(&PostParams::default(), &pool("valid-store-only", store_only))
        .await
        .expect("a store without a local tier");
    let cpu = with(with(valid, "/gpu/type", json!("cpu")), "/gpu/count", json!(0));
    api.create(&PostParams::default(), &pool("valid-cpu", cpu)).await.expect("cpu pool without GPUs accepted");

    // Omitted fields get the schema's defaults.
    let minimal =
        api.create(&PostParams::default(), &pool("minimal", json!({ "model": { "id": "m" } }))).await.unwrap();
    assert_eq!(minimal.data["spec"]["concurrency"]["maxInFlight"], json!(32));
    assert_eq!(minimal.data["spec"]["concurrency"]["queueTimeout"], json!("2s"));
    assert_eq!(minimal.data["spec"]["gpu"], json!({ "type": "nvidia-l4", "count": 1 }));
}

#[tokio::test]
async fn kubectl_explains_the_fields() {
    let client = admin_client().await;
    install_crd(&client).await;
    let (ok, text) = kubectl(&["explain", "embeddingpool.spec.concurrency"]);
    assert!(ok, "{text}");
    assert!(text.contains("pool-wide admission budget"), "{text}");
    assert!(text.contains("maxInFlightPerReplica"), "{text}");
    let (ok, text) = kubectl(&["explain", "epool.spec.concurrency.queueTimeout"]);
    assert!(ok && text.contains("duration such as"), "{text}");
}

#[tokio::test]
async fn shipped_samples_are_accepted_by_the_api_server() {
    let client = admin_client().await;
    install_crd(&client).await;
    let ns = test_namespace("samples").await;
    let samples = teifleet_e2e::repo_root().join("deploy/samples");
    let (ok, output) = kubectl(&["apply", "--dry-run=server", "-n", &ns.name, "-f", samples.to_str().unwrap()]);
    assert!(ok, "{output}");
    assert_eq!(output.matches("created (server dry run)").count(), 4, "{output}");
}
