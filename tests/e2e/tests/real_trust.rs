//! The trust boundary in real pods on the local cluster's real node (`real-0`): a pool's TEI
//! container holds no ServiceAccount token (the pool names its image, so it may run anything),
//! while its sidecar, the only container that talks to the API server, mounts one and still
//! serves; and the operator gave the pool its peer Secret, owned by the pool.
//!
//! The images have no shell for `kubectl exec`, so the test looks at each container's own view
//! of its file system from the host: `/proc/<pid>/root` of its process, found through the real
//! node's containerd (the host runs the node's containers).
//!
//! Needs the real node and the images, as `real_pods.rs` does; without either it says it was
//! skipped and passes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::LogParams;
use kube::{Api, ResourceExt as _};
use serde_json::json;
use teifleet_crds::labels;
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::real::{
    answering_channel, embed, install_chart, pool_template, prerequisites, restricted_namespace, service_addr,
    wait_ready_pods,
};
use teifleet_e2e::{admin_client, import_into_real_node, install_crd, kubeconfig_path};

const RELEASE: &str = "tftrust";
const POOL: &str = "trust";
/// Where the kubelet mounts a token, and where kube's in-cluster config looks for one.
const TOKEN_DIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";

/// The host PID of `container`'s process in `pod`, from the real node's containerd.
fn container_pid(pod: &Pod, container: &str) -> u32 {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
    let status = statuses.iter().find(|s| s.name == container).expect("the container's status");
    let id = status.container_id.as_deref().and_then(|id| id.strip_prefix("containerd://")).expect("a containerd id");
    let socket = kubeconfig_path().parent().expect("the cluster directory").join("node/containerd/containerd.sock");
    let tasks = Command::new("ctr")
        .arg("--address")
        .arg(&socket)
        .args(["-n", "k8s.io", "tasks", "ls"])
        .output()
        .expect("ctr runs");
    assert!(tasks.status.success(), "ctr tasks ls: {}", String::from_utf8_lossy(&tasks.stderr));
    // TASK PID STATUS, one task per running container.
    let listing = String::from_utf8_lossy(&tasks.stdout).into_owned();
    let pid = listing.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some(id)).then(|| fields.next()?.parse().ok()).flatten()
    });
    pid.unwrap_or_else(|| panic!("no task {id} for {container} in:\n{listing}"))
}

/// Whether the process `pid` sees a token directory, however the image links `/var/run`.
fn sees_token(pid: u32) -> bool {
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    assert!(root.exists(), "the host can look into {}", root.display());
    // /var/run is often a link to /run, which the host would resolve against its own root.
    let paths = [root.join(TOKEN_DIR), root.join(Path::new(TOKEN_DIR).strip_prefix("var").expect("under var"))];
    paths.iter().any(|path| path.exists())
}

#[tokio::test]
async fn only_the_sidecar_of_a_real_pod_holds_a_token_and_the_pool_owns_its_peer_secret() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(&client).await;
    let ns = restricted_namespace("real-trust").await;
    install_chart(&client, &ns.name, RELEASE).await;

    let pool = create_pool(
        &client,
        &ns.name,
        POOL,
        json!({
            "model": { "id": "BAAI/bge-small-en-v1.5" },
            "gpu": { "type": "cpu" },
            // Two replicas: siblings, which the peer Secret is for.
            "replicas": 2,
            "tei": { "image": images["tei-sim"].1 },
            "concurrency": { "maxInFlight": 4 },
            "template": pool_template(),
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pool_pods = wait_ready_pods(&pods, &labels::pool_selector(POOL), 2).await;
    wait_until_ready(&client, &ns.name, POOL).await;

    // The sidecar still works on its projected token: the pool is Ready, and a call is answered.
    let channel = answering_channel(service_addr(&client, &ns.name, POOL).await).await;
    embed(channel, "who holds the token".into()).await.expect("a call through the pool's Service is answered");

    for pod in &pool_pods {
        let name = pod.name_any();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false), "{name}");
        let tei = container_pid(pod, "tei");
        let sidecar = container_pid(pod, "multiplexer");
        assert!(!sees_token(tei), "{name}: the TEI container (pid {tei}) must see no /{TOKEN_DIR}");
        assert!(sees_token(sidecar), "{name}: the sidecar (pid {sidecar}) mounts its token at /{TOKEN_DIR}");
        let token = PathBuf::from(format!("/proc/{sidecar}/root/{TOKEN_DIR}/token"));
        let token = std::fs::read_to_string(&token).unwrap_or_default();
        assert_eq!(token.split('.').count(), 3, "{name}: the sidecar's token is a JWT");
        // Nothing the sidecar asked the API server for was refused (its Role, the peer Secret).
        let params = LogParams { container: Some("multiplexer".into()), ..LogParams::default() };
        let log = pods.logs(&name, &params).await.expect("the sidecar's log");
        assert!(!log.to_lowercase().contains("forbidden"), "{name}'s sidecar was refused something:\n{log}");
    }

    // The operator made the pool's peer Secret, which goes with the pool.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let name = labels::peer_secret_name(POOL);
    let secret = tokio::time::timeout(Duration::from_secs(10), secrets.get(&name))
        .await
        .expect("the API server answers")
        .unwrap_or_else(|error| panic!("the peer Secret {name}: {error}"));
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    let owner = secret.owner_references().first().cloned().expect("an owner reference");
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("EmbeddingPool", POOL));
    assert_eq!(Some(owner.uid.as_str()), pool.metadata.uid.as_deref(), "this very pool");
    assert_eq!(owner.controller, Some(true));
    let key = secret.data.as_ref().and_then(|data| data.get(labels::PEER_SECRET_KEY)).expect("the key");
    assert_eq!(key.0.len(), 43, "32 random bytes as unpadded base64url text");
    assert!(key.0.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
}
