//! Golden tests for every child object the operator renders, and for the Deployment of every GPU
//! type. Run with `UPDATE_GOLDEN=1` to rewrite the files after an intended change, then review
//! the diff.

use std::path::PathBuf;

use serde::Serialize;
use teifleet_crds::{EmbeddingPool, GpuType};
use teifleet_operator::render::{Children, RenderConfig, render};

fn pool(yaml: &str) -> EmbeddingPool {
    serde_norway::from_str(yaml).expect("fixture parses")
}

const BASE: &str = r#"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingPool
metadata:
  name: bge-small
  namespace: ml
  uid: 7d1c0f2e-0000-4000-8000-000000000001
  generation: 1
spec:
  model:
    id: BAAI/bge-small-en-v1.5
  replicas: 2
"#;

const OVERRIDES: &str = r#"
apiVersion: teifleet.dev/v1alpha1
kind: EmbeddingPool
metadata:
  name: gte-large
  namespace: search
  uid: 7d1c0f2e-0000-4000-8000-000000000002
  generation: 4
spec:
  model:
    id: thenlper/gte-large
    revision: v1.2
    dtype: float16
    pooling: mean
  gpu:
    type: nvidia-h100-80gb
    count: 2
  replicas: 1
  concurrency:
    maxInFlight: 400
    maxQueued: 1000
    queueTimeout: 1500ms
    maxInFlightPerReplica: 300
  tei:
    maxBatchTokens: 32768
    maxClientBatchSize: 64
    extraArgs: ["--auto-truncate"]
    env:
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef: { name: hf-token, key: token }
    - { name: RUST_LOG, value: info }
    envFrom:
    - configMapRef: { name: tei-settings }
  http:
    payloadLimit: 4000000
  modelCache:
    persistentVolumeClaim:
      claimName: hf-models
  template:
    imagePullSecrets:
    - name: registry-credentials
    multiplexerResources:
      requests: { cpu: 250m }
      limits: { memory: 512Mi }
    priorityClassName: inference-critical
    annotations:
      prometheus.io/scrape: "true"
    labels:
      team: search
    nodeSelector:
      topology.kubernetes.io/zone: us-east-1a
    tolerations:
    - key: dedicated
      operator: Equal
      value: inference
      effect: NoSchedule
    resources:
      requests: { cpu: "4", memory: 16Gi }
      limits: { memory: 32Gi }
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
          - matchExpressions:
            - { key: node.kubernetes.io/instance-type, operator: In, values: [p5.48xlarge] }
"#;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn check<T: Serialize>(file: &str, value: &T) {
    let rendered = serde_norway::to_string(value).expect("serializes");
    let path = golden_dir().join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered).expect("writes golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!("{} is missing; run UPDATE_GOLDEN=1 cargo test -p teifleet-operator --test golden", path.display())
    });
    similar_asserts::assert_eq!(expected, rendered, "{file} differs; if intended, rerun with UPDATE_GOLDEN=1");
}

fn children(yaml: &str) -> Children {
    render(&pool(yaml), &RenderConfig::default(), None).expect("renders")
}

#[test]
fn deployment_for_every_gpu_type() {
    for gpu in GpuType::ALL {
        let mut pool = pool(BASE);
        pool.spec.gpu.type_ = gpu;
        let rendered = render(&pool, &RenderConfig::default(), None).expect("renders");
        check(&format!("deployment-{gpu}.yaml"), &rendered.deployment);
    }
}

#[test]
fn deployment_with_every_override() {
    check("deployment-overrides.yaml", &children(OVERRIDES).deployment);
}

#[test]
fn ephemeral_model_cache_is_a_generic_ephemeral_volume() {
    let mut pool = pool(BASE);
    pool.spec.model_cache =
        Some(serde_norway::from_str("ephemeral: { size: 20Gi, storageClassName: fast-ssd }").unwrap());
    let rendered = render(&pool, &RenderConfig::default(), None).unwrap();
    let pod = rendered.deployment.spec.unwrap().template.spec.unwrap();
    check("volumes-ephemeral-model-cache.yaml", &pod.volumes);
    assert_eq!(pod.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path, "/data");
}

#[test]
fn named_resources_replace_their_defaults_and_others_keep_them() {
    let mut pool = pool(BASE);
    pool.spec.gpu.type_ = GpuType::NvidiaH100_80gb;
    // A lone memory limit: Kubernetes makes it the request too, so no default memory request
    // may sit beside it (a larger one would be refused).
    pool.spec.template.resources = Some(serde_norway::from_str("limits: { memory: 16Gi }").unwrap());
    pool.spec.template.multiplexer_resources = Some(serde_norway::from_str("requests: { memory: 1Gi }").unwrap());
    let rendered = render(&pool, &RenderConfig::default(), None).unwrap();
    let containers = rendered.deployment.spec.unwrap().template.spec.unwrap().containers;
    let tei = containers[0].resources.clone().unwrap();
    assert_eq!(
        serde_json::to_value(&tei).unwrap(),
        serde_json::json!({
            "requests": { "cpu": "8", "nvidia.com/gpu": "1" },
            "limits": { "memory": "16Gi", "nvidia.com/gpu": "1" },
        })
    );
    let sidecar = containers[1].resources.clone().unwrap();
    assert_eq!(
        serde_json::to_value(&sidecar).unwrap(),
        serde_json::json!({ "requests": { "cpu": "100m", "memory": "1Gi" } })
    );
}

#[test]
fn explicit_tei_image_wins_over_the_gpu_variant() {
    let mut pool = pool(BASE);
    pool.spec.tei.image = Some("registry.example/tei:custom-grpc".into());
    let rendered = render(&pool, &RenderConfig::default(), None).unwrap();
    let containers = &rendered.deployment.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(containers[0].image.as_deref(), Some("registry.example/tei:custom-grpc"));
}

#[test]
fn services() {
    let rendered = children(BASE);
    check("service.yaml", &rendered.service);
    check("service-peers.yaml", &rendered.peers_service);
}

#[test]
fn sidecar_rbac() {
    let rendered = children(BASE);
    check("serviceaccount.yaml", &rendered.service_account);
    check("role.yaml", &rendered.role);
    check("rolebinding.yaml", &rendered.role_binding);
}

#[test]
fn sidecar_role_reads_the_api_key_secret_beside_the_peer_secret_and_no_other() {
    let mut pool = pool(BASE);
    pool.spec.auth = Some(serde_norway::from_str("secretName: bge-small-keys").unwrap());
    let rendered = render(&pool, &RenderConfig::default(), None).unwrap();
    check("role-auth.yaml", &rendered.role);
    let without = children(BASE).role.rules.unwrap();
    let with = rendered.role.rules.unwrap();
    let secrets = |rules: &[k8s_openapi::api::rbac::v1::PolicyRule]| -> Vec<String> {
        let rule = rules.iter().find(|rule| rule.resources.as_deref() == Some(&["secrets".to_owned()][..]));
        rule.and_then(|rule| rule.resource_names.clone()).unwrap_or_default()
    };
    assert_eq!(secrets(&without), ["bge-small-teifleet-peer"], "without keys: the peer Secret alone");
    assert_eq!(secrets(&with), ["bge-small-keys", "bge-small-teifleet-peer"]);
    assert_eq!(with.len(), without.len(), "no other rule changes");
    // Keys live in the Secret, read by the sidecar: adding or rotating them restarts no pod.
    assert_eq!(rendered.deployment, children(BASE).deployment);
}

fn with_tls(yaml: &str) -> EmbeddingPool {
    let mut pool = pool(BASE);
    pool.spec.tls = Some(serde_norway::from_str(yaml).unwrap());
    pool
}

#[test]
fn sidecar_role_reads_the_certificate_and_client_ca_by_name() {
    let mut pool = with_tls("{ secretName: bge-small-tls, clientCA: { configMapName: bge-small-clients } }");
    pool.spec.auth = Some(serde_norway::from_str("secretName: bge-small-keys").unwrap());
    let rendered = render(&pool, &RenderConfig::default(), None).unwrap();
    check("role-tls.yaml", &rendered.role);
    // The sidecars follow the Secret and the ConfigMap themselves: a rotated certificate restarts
    // no pod, and neither does turning TLS on.
    assert_eq!(rendered.deployment, children(BASE).deployment);

    // A certificate Secret whose ca.crt is also the client CA bundle: one name, and no ConfigMaps.
    let same = with_tls("{ secretName: bge-small-tls, clientCA: { secretName: bge-small-tls } }");
    let rules = render(&same, &RenderConfig::default(), None).unwrap().role.rules.unwrap();
    let named: Vec<_> = rules
        .iter()
        .filter_map(|rule| Some((rule.resources.as_ref()?[0].as_str(), rule.resource_names.clone()?)))
        .collect();
    assert_eq!(named, [("secrets", vec!["bge-small-teifleet-peer".to_owned(), "bge-small-tls".to_owned()])]);
}

#[test]
fn services_under_tls_claim_https_not_cleartext_http2() {
    let rendered = render(&with_tls("secretName: bge-small-tls"), &RenderConfig::default(), None).unwrap();
    check("service-tls.yaml", &rendered.service);
    let peers = rendered.peers_service.spec.unwrap().ports.unwrap();
    assert_eq!(peers[0].app_protocol.as_deref(), Some("https"));
}

#[test]
fn network_policy_admits_only_the_sidecar_ports_and_can_be_turned_off() {
    check("networkpolicy.yaml", &children(BASE).network_policy.expect("on by default"));
    let mut pool = pool(BASE);
    pool.spec.network_policy = serde_norway::from_str(
        "metricsNamespaceSelector: { matchLabels: { kubernetes.io/metadata.name: monitoring } }",
    )
    .unwrap();
    // In a cluster the operator's own namespace is let in too: it reads adaptive pools' limits.
    let in_cluster = RenderConfig { operator_namespace: Some("teifleet-system".into()), ..RenderConfig::default() };
    let rendered = render(&pool, &in_cluster, None).unwrap();
    check("networkpolicy-metrics-namespaces.yaml", &rendered.network_policy.expect("still on"));
    pool.spec.network_policy.enabled = false;
    assert_eq!(render(&pool, &RenderConfig::default(), None).unwrap().network_policy, None);
}

#[test]
fn pdb_only_with_more_than_one_replica() {
    check("pdb.yaml", &children(BASE).pdb.expect("two replicas get a PodDisruptionBudget"));
    assert!(children(OVERRIDES).pdb.is_none(), "one replica gets no PodDisruptionBudget");
}

#[test]
fn unset_replicas_leave_the_count_to_an_autoscaler() {
    let mut pool = pool(BASE);
    pool.spec.replicas = None;
    let rendered = render(&pool, &RenderConfig::default(), None).unwrap();
    assert_eq!(rendered.deployment.spec.unwrap().replicas, None);
    assert!(rendered.pdb.is_some());
}

#[test]
fn an_autoscaled_pool_gets_the_autoscalers_count() {
    let mut pool = pool(BASE);
    pool.spec.replicas = None;
    pool.spec.autoscaling =
        Some(serde_json::from_value(serde_json::json!({ "minReplicas": 2, "maxReplicas": 6 })).expect("autoscaling"));
    let replicas =
        |autoscaled| render(&pool, &RenderConfig::default(), autoscaled).unwrap().deployment.spec.unwrap().replicas;
    assert_eq!(replicas(Some(5)), Some(5), "the decision the controller passes in");
    assert_eq!(replicas(Some(0)), Some(0), "scaled to zero");
    assert_eq!(replicas(None), Some(2), "before any decision: minReplicas, never unset");
    assert!(render(&pool, &RenderConfig::default(), Some(1)).unwrap().pdb.is_some(), "it may grow: a budget");
    // Nothing else differs from the pool sized by hand.
    let mut by_hand = pool.clone();
    by_hand.spec.autoscaling = None;
    by_hand.spec.replicas = Some(5);
    assert_eq!(
        render(&pool, &RenderConfig::default(), Some(5)).unwrap().deployment,
        render(&by_hand, &RenderConfig::default(), None).unwrap().deployment
    );
}

#[test]
fn budget_edits_do_not_change_the_deployment() {
    // A changed pod template would restart every TEI; budgets are applied live by the sidecars.
    let mut small = pool(BASE);
    small.spec.concurrency.max_in_flight = 8;
    small.spec.concurrency.max_queued = 0;
    let mut large = pool(BASE);
    large.spec.concurrency.max_in_flight = 1024;
    large.spec.concurrency.max_queued = 100_000;
    large.spec.concurrency.queue_timeout = "30s".into();
    let config = RenderConfig::default();
    assert_eq!(render(&small, &config, None).unwrap().deployment, render(&large, &config, None).unwrap().deployment);
}

#[test]
fn only_the_sidecar_gets_an_api_token_and_the_role_has_no_unused_rule() {
    const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let rendered = children(OVERRIDES);
    let pod = rendered.deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false), "no token in every container");
    let mounts_token = |name: &str| {
        let container = pod.containers.iter().find(|c| c.name == name).unwrap();
        container.volume_mounts.iter().flatten().find(|m| m.mount_path == TOKEN_DIR).cloned()
    };
    assert!(mounts_token("tei").is_none(), "TEI runs any image a pool names: it gets no token");
    let mount = mounts_token("multiplexer").expect("the sidecar watches the API server");
    assert_eq!(mount.read_only, Some(true));
    let volume = pod.volumes.unwrap().into_iter().find(|v| v.name == mount.name).unwrap();
    let sources = volume.projected.unwrap().sources.unwrap();
    let token = sources.iter().find_map(|s| s.service_account_token.clone()).unwrap();
    assert_eq!((token.path.as_str(), token.expiration_seconds), ("token", Some(3600)));
    assert_eq!(sources.iter().find_map(|s| s.config_map.clone()).unwrap().name, "kube-root-ca.crt");
    assert!(sources.iter().any(|s| s.downward_api.is_some()), "the namespace file kube's client reads");
    let sidecar = pod.containers.iter().find(|c| c.name == "multiplexer").unwrap();
    assert!(sidecar.args.as_ref().unwrap().contains(&"--peer-secret=gte-large-teifleet-peer".to_owned()));

    let rules = rendered.role.rules.unwrap();
    let resources: Vec<_> = rules.iter().flat_map(|r| r.resources.clone().unwrap()).collect();
    assert_eq!(resources, ["embeddingpools", "endpointslices", "secrets"], "no Services: the sidecar never reads one");
    assert!(rules.iter().all(|r| r.verbs == ["get", "list", "watch"]), "read only");
}

#[test]
fn peer_secret() {
    // A fixed key: the operator's own are random (teifleet_operator::peer_secret::new_key).
    let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    check("peer-secret.yaml", &teifleet_operator::render::peer_secret(&pool(BASE), key).expect("renders"));
}

#[test]
fn activator_network_policy_opens_the_call_ports_and_can_be_turned_off() {
    use teifleet_operator::render::activator;
    let mut pool = pool(BASE);
    pool.spec.replicas = None;
    pool.spec.autoscaling = Some(serde_norway::from_str("{ minReplicas: 0, maxReplicas: 2 }").unwrap());
    pool.spec.network_policy = serde_norway::from_str(
        "metricsNamespaceSelector: { matchLabels: { kubernetes.io/metadata.name: monitoring } }",
    )
    .unwrap();
    let in_cluster = RenderConfig { operator_namespace: Some("teifleet-system".into()), ..RenderConfig::default() };
    let mut other = pool.clone();
    other.metadata.name = Some("gte-small".into());
    other.metadata.uid = Some("7d1c0f2e-0000-4000-8000-000000000003".into());
    other.spec.network_policy = Default::default();
    let rendered = activator::render("ml", &[&pool, &other], &in_cluster).expect("a pool scales to zero");
    // The peers both owners admit to their admin ports are listed once.
    check("activator-networkpolicy.yaml", &rendered.network_policy.expect("on by default"));
    let off = RenderConfig { activator_network_policy: false, ..in_cluster };
    assert!(activator::render("ml", &[&pool], &off).unwrap().network_policy.is_none());
}

#[test]
fn activator_deployment_runs_two_replicas_spread_and_rolled_one_at_a_time_under_a_budget() {
    use teifleet_operator::render::activator;
    let mut pool = pool(BASE);
    pool.spec.replicas = None;
    pool.spec.autoscaling = Some(serde_norway::from_str("{ minReplicas: 0, maxReplicas: 2 }").unwrap());
    let in_cluster = RenderConfig { operator_namespace: Some("teifleet-system".into()), ..RenderConfig::default() };
    let rendered = activator::render("ml", &[&pool], &in_cluster).expect("a pool scales to zero");
    check("activator-deployment.yaml", &rendered.deployment);
    check("activator-pdb.yaml", &rendered.pdb.expect("two replicas: a budget"));
}

fn with_cache(yaml: &str) -> EmbeddingPool {
    let mut pool = pool(BASE);
    pool.spec.cache = Some(serde_norway::from_str(yaml).unwrap());
    pool
}

/// The sidecar's memory request and limit, its `--memory-limit` flag, and its environment.
fn sidecar(pool: &EmbeddingPool) -> (serde_json::Value, Option<String>, Vec<k8s_openapi::api::core::v1::EnvVar>) {
    let rendered = render(pool, &RenderConfig::default(), None).unwrap();
    let containers = rendered.deployment.spec.unwrap().template.spec.unwrap().containers;
    let sidecar = containers.into_iter().find(|c| c.name == "multiplexer").unwrap();
    let flag = sidecar.args.unwrap().into_iter().find(|arg| arg.starts_with("--memory-limit"));
    let memory = serde_json::to_value(sidecar.resources.unwrap()).unwrap();
    let memory = serde_json::json!({ "requests": memory["requests"]["memory"], "limits": memory["limits"]["memory"] });
    (memory, flag, sidecar.env.unwrap())
}

#[test]
fn a_cache_with_a_store_grows_the_sidecars_memory_and_hands_it_the_password() {
    let pool = with_cache(
        r#"
size: 1Gi
ttl: 12h
sharedAcrossTenants: true
store:
  url: rediss://valkey.ml.svc:6380/0
  username: teifleet
  timeout: 10ms
  passwordSecret: { name: embedding-cache, key: password }
"#,
    );
    let rendered = render(&pool, &RenderConfig::default(), None).unwrap();
    check("deployment-cache.yaml", &rendered.deployment);

    // Request: 64Mi + the tier's 1Gi. Limit: 256Mi + 8/3 GiB (the budget is half the limit and
    // the tier fills at most three quarters of it), rounded up to a MiB; the flag says the same.
    let (memory, flag, env) = sidecar(&pool);
    assert_eq!(memory, serde_json::json!({ "requests": "1088Mi", "limits": "2987Mi" }));
    assert_eq!(flag.as_deref(), Some("--memory-limit=2987Mi"));
    let password = env.iter().find(|var| var.name == "TEIFLEET_CACHE_STORE_PASSWORD").expect("the password's env");
    assert_eq!(
        serde_json::to_value(password).unwrap(),
        serde_json::json!({ "name": "TEIFLEET_CACHE_STORE_PASSWORD", "valueFrom": { "secretKeyRef":
            { "name": "embedding-cache", "key": "password", "optional": true } } }),
    );
    // The kubelet reads the Secret: the sidecar's role is the same as without a cache.
    assert_eq!(rendered.role, children(BASE).role);

    // The TTL, the store's address, user and timeout, sharing between tenants: the sidecar reads
    // them from the pool live, so editing them restarts no pod.
    let edited = with_cache(
        r#"
size: 1Gi
ttl: 1h
store:
  url: redis://other:6379/3
  passwordSecret: { name: embedding-cache, key: password }
"#,
    );
    let deployment = |pool: &EmbeddingPool| render(pool, &RenderConfig::default(), None).unwrap().deployment;
    assert_eq!(deployment(&edited), rendered.deployment);
    // Another Secret or key is in the pod template: the pods roll to pick it up.
    let other_key =
        with_cache("{ size: 1Gi, store: { url: 'redis://a', passwordSecret: { name: embedding-cache, key: pw } } }");
    assert_ne!(deployment(&other_key), rendered.deployment);
}

#[test]
fn the_cache_grows_whatever_memory_the_sidecar_has() {
    // The default size, 256Mi, on the default 64Mi request and 256Mi limit.
    let (memory, flag, env) = sidecar(&with_cache("{}"));
    assert_eq!(memory, serde_json::json!({ "requests": "320Mi", "limits": "939Mi" }));
    assert_eq!(flag.as_deref(), Some("--memory-limit=939Mi"));
    assert!(env.iter().all(|var| var.name != "TEIFLEET_CACHE_STORE_PASSWORD"), "no store, no password");

    // A user's limit grows as the default does.
    let mut pool = with_cache("{ size: 64Mi }");
    pool.spec.template.multiplexer_resources = Some(serde_norway::from_str("limits: { memory: 1Gi }").unwrap());
    let (memory, flag, _) = sidecar(&pool);
    assert_eq!(memory, serde_json::json!({ "requests": null, "limits": "1195Mi" }), "a lone limit stays lone");
    assert_eq!(flag.as_deref(), Some("--memory-limit=1195Mi"));

    // No limit at all: the sidecar would budget from its default 256Mi, so the flag says more.
    pool.spec.template.multiplexer_resources = Some(serde_norway::from_str("requests: { memory: 1Gi }").unwrap());
    let (memory, flag, _) = sidecar(&pool);
    assert_eq!(memory, serde_json::json!({ "requests": "1088Mi", "limits": null }));
    assert_eq!(flag.as_deref(), Some("--memory-limit=427Mi"));
}

#[test]
fn a_cache_off_or_without_a_local_tier_adds_no_memory() {
    let off =
        with_cache("{ enabled: false, size: 1Gi, store: { url: 'redis://a', passwordSecret: { name: s, key: k } } }");
    assert_eq!(render(&off, &RenderConfig::default(), None).unwrap().deployment, children(BASE).deployment);

    // `size: 0`: the store alone, which needs the password and no memory.
    let (memory, flag, env) =
        sidecar(&with_cache("{ size: '0', store: { url: 'redis://a', passwordSecret: { name: s, key: k } } }"));
    assert_eq!(memory, serde_json::json!({ "requests": "64Mi", "limits": "256Mi" }));
    assert_eq!(flag, None);
    assert!(env.iter().any(|var| var.name == "TEIFLEET_CACHE_STORE_PASSWORD"));
}
