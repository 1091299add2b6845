//! A pool with `spec.tls`, as shipped, on the local cluster's real node: its sidecars serve TLS
//! through the pool's ClusterIP Service with the certificate of a `kubernetes.io/tls` Secret (made
//! here, as cert-manager would); plain text is refused; the replicas spill to each other in TLS;
//! replacing the Secret's certificate under steady load fails no call and new connections get the
//! new one; a corrupt certificate in the Secret leaves the good one served and turns `TLSReady`
//! False with the reason.
//!
//!
//! And TLS at zero: a pool with `spec.tls` and `minReplicas: 0` is at zero with the activator behind
//! its Service; a client trusting only the pool's CA is shown the pool's certificate there, and its
//! first gRPC call and an HTTPS request (curl with the CA) are held and answered once a replica is
//! ready.
//!
//! Needs the real node and the images (see `real_pods.rs`); without them it says it was skipped
//! and passes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use teifleet_crds::conditions::reasons::{CERTIFICATE_INVALID, CERTIFICATE_SERVED};
use teifleet_crds::conditions::{self, TLS_READY};
use teifleet_crds::{EmbeddingPool, labels};
use teifleet_e2e::pools::{create_pool, wait_until_ready};
use teifleet_e2e::real::{
    Tally, install_chart, ip_of, pool_template, prerequisites, restricted_namespace, service_addr, sidecar_metrics,
    steady_load, wait_ready_pods,
};
use teifleet_e2e::{admin_client, eventually, helm, import_into_real_node, install_crd};
use teifleet_multiplexer::forward::upstream::{Dialer, Upstream};
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_proto::v1::{EmbedRequest, InfoRequest, embed_client::EmbedClient};
use teifleet_runtime::tls::serial_of;
use teifleet_runtime::tls::{Material, ServerTls};
use teifleet_testkit::certs::{Authority, Issued};
use teifleet_testkit::prom;
use tonic::transport::Channel;

const RELEASE: &str = "tftls";
const POOL: &str = "secure";
const SECRET: &str = "secure-tls";

/// The names a pool certificate carries, as a cert-manager `Certificate` would list them.
fn pool_names(namespace: &str) -> Vec<String> {
    let service = format!("{POOL}.{namespace}");
    vec![POOL.into(), service.clone(), format!("{service}.svc"), format!("{service}.svc.cluster.local")]
}

fn tls_secret(ca: &Authority, issued: &Issued) -> Secret {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": SECRET },
        "stringData": { "tls.crt": issued.chain_pem, "tls.key": issued.key_pem, "ca.crt": ca.pem },
    }))
    .expect("a Secret")
}

/// TLS clients of the pool Service: trusting the pool's CA, verifying the Service's name though
/// they connect to its ClusterIP.
struct Clients {
    /// The clients' own certificate set: the CA they trust.
    own: Arc<ServerTls>,
    dialer: Dialer,
    service: SocketAddr,
    name: String,
}

impl Clients {
    fn new(ca: &Authority, service: SocketAddr, namespace: &str) -> Self {
        let own = Arc::new(ServerTls::off());
        let client = ca.client("e2e");
        let set = Material {
            chain: client.chain_pem.into(),
            key: client.key_pem.into(),
            ca: Some(ca.pem.clone().into()),
            client_ca: None,
        };
        own.offer(&set).expect("a client set");
        let dialer = Dialer::new(own.clone());
        let name = format!("{POOL}.{namespace}.svc");
        dialer.name_ip_peers(Some(name.clone()));
        Self { own, dialer, service, name }
    }

    /// A new connection (one HTTP/2 connection: the ClusterIP pins it to one pod).
    fn channel(&self) -> Channel {
        Upstream::lazy(&format!("https://{}", self.service), &self.dialer).expect("a URL").channel()
    }

    /// The serial of the certificate a new TLS connection to the Service is shown.
    async fn served_serial(&self) -> Option<String> {
        let config = self.own.client()?;
        let tcp = tokio::net::TcpStream::connect(self.service).await.ok()?;
        let name = rustls::pki_types::ServerName::try_from(self.name.clone()).ok()?;
        let stream = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.ok()?;
        serial_of(stream.get_ref().1.peer_certificates()?.first()?)
    }
}

async fn tls_ready(client: &Client, namespace: &str) -> Option<(String, String, String)> {
    let pool = Api::<EmbeddingPool>::namespaced(client.clone(), namespace).get(POOL).await.ok()?;
    let condition = conditions::find(&pool.status?.conditions, TLS_READY)?.clone();
    Some((condition.status, condition.reason, condition.message))
}

async fn wait_tls_ready(client: &Client, namespace: &str, status: &str, reason: &str, mentions: &str) -> String {
    let what = format!("TLSReady={status} ({reason}) mentioning {mentions:?}");
    eventually(&what, Duration::from_secs(90), || async {
        let (now, why, message) = tls_ready(client, namespace).await?;
        (now == status && why == reason && message.contains(mentions)).then_some(message)
    })
    .await
}

#[tokio::test]
async fn a_pool_with_tls_serves_rotates_and_survives_a_corrupt_certificate_on_real_pods() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(&client).await;
    let ns = restricted_namespace("real-tls").await;
    install_chart(&client, &ns.name, RELEASE).await;

    let ca = Authority::new("teifleet e2e CA");
    let names = pool_names(&ns.name);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let first = ca.peer(&names);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets.create(&PostParams::default(), &tls_secret(&ca, &first)).await.expect("the TLS Secret");
    create_pool(
        &client,
        &ns.name,
        POOL,
        json!({
            "gpu": { "type": "cpu" },
            "replicas": 2,
            "tei": { "image": images["tei-sim"].1, "extraArgs": ["--fixed-latency=20ms"] },
            "concurrency": { "maxInFlight": 4, "maxQueued": 128 },
            "tls": { "secretName": SECRET },
            "template": pool_template(),
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let replicas = wait_ready_pods(&pods, &labels::pool_selector(POOL), 2).await;
    let pool = wait_until_ready(&client, &ns.name, POOL).await;
    let endpoints = pool.status.and_then(|s| s.endpoints).expect("endpoints");
    assert!(endpoints.tls && endpoints.http.starts_with("https://"), "{endpoints:?}");
    wait_tls_ready(&client, &ns.name, "True", CERTIFICATE_SERVED, &first.serial).await;

    // In TLS through the ClusterIP; plain text is refused.
    let service = service_addr(&client, &ns.name, POOL).await;
    let clients = Clients::new(&ca, service, &ns.name);
    let answering = eventually("the Service answering Info in TLS", Duration::from_secs(30), || async {
        let channel = clients.channel();
        InfoClient::new(channel.clone()).info(InfoRequest {}).await.ok().map(|_| channel)
    })
    .await;
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{service}")).unwrap();
    let plain = InfoClient::new(plain.connect_timeout(Duration::from_secs(2)).connect_lazy());
    assert!(plain.clone().info(InfoRequest {}).await.is_err(), "plain text refused");
    assert_eq!(clients.served_serial().await.as_deref(), Some(first.serial.as_str()));

    // HTTP in TLS, with curl and the CA, as a user would.
    let ca_file = teifleet_e2e::log_dir().join(format!("{}-ca.crt", ns.name));
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let resolve = format!("{}:{}:{}", clients.name, teifleet_wire::ports::MULTIPLEXER_HTTP, service.ip());
    let url = format!("https://{}:{}/embed", clients.name, teifleet_wire::ports::MULTIPLEXER_HTTP);
    let curl = std::process::Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "10", "--cacert"])
        .arg(&ca_file)
        .args(["--resolve", &resolve, "-H", "content-type: application/json", "-d", r#"{"inputs":"over TLS"}"#])
        .arg(&url)
        .output()
        .expect("curl runs");
    assert!(curl.status.success(), "curl over TLS: {}", String::from_utf8_lossy(&curl.stderr));

    // One connection, more calls than its replica's share: they spill to the sibling, in TLS. A
    // sidecar spills once it has seen its sibling's endpoint and its own share, which can lag the
    // pods turning Ready by seconds, so the burst repeats (every call must still succeed) until
    // the sibling has served some.
    let pinned = answering.clone();
    let spills = eventually("calls on one connection spilling to the sibling in TLS", Duration::from_secs(30), || {
        let pinned = pinned.clone();
        let replicas = &replicas;
        async move {
            let calls: Vec<_> = (0..32)
                .map(|i| {
                    let channel = pinned.clone();
                    tokio::spawn(async move {
                        EmbedClient::new(channel)
                            .embed(EmbedRequest { inputs: format!("pinned {i}"), ..Default::default() })
                            .await
                    })
                })
                .collect();
            for call in calls {
                call.await.unwrap().expect("served here or at the sibling");
            }
            let mut spills: BTreeMap<String, f64> = BTreeMap::new();
            for pod in replicas {
                let text = sidecar_metrics(ip_of(pod)).await.expect("sidecar metrics");
                for result in ["served", "refused", "unreachable"] {
                    *spills.entry(result.into()).or_default() +=
                        prom::sum_matching(&text, "teifleet_spills_total", &[("result", result)]);
                }
            }
            (spills["served"] > 0.0).then_some(spills)
        }
    })
    .await;
    assert!(spills["unreachable"] == 0.0, "spills over TLS: {spills:?}");

    // Rotation under steady load: no call fails; new connections get the new certificate.
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(steady_load(clients.channel(), stop.clone(), false));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second = ca.peer(&names);
    let patch = Patch::Apply(tls_secret(&ca, &second));
    secrets.patch(SECRET, &PatchParams::apply("teifleet-e2e").force(), &patch).await.expect("rotated");
    eventually("new connections getting the rotated certificate", Duration::from_secs(30), || async {
        (clients.served_serial().await? == second.serial).then_some(())
    })
    .await;
    wait_tls_ready(&client, &ns.name, "True", CERTIFICATE_SERVED, &second.serial).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let tally: Tally = load.await.unwrap();
    println!("rotation under load: {tally:?}");
    assert!(tally.ok > 0 && tally.failed.is_empty(), "no call fails while the certificate rotates: {tally:?}");

    // A corrupt certificate: the good one stays served, and status says why.
    let corrupt: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": SECRET },
        "data": { "tls.crt": ByteString(b"-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n".to_vec()),
                  "tls.key": ByteString(second.key_pem.clone().into_bytes()), "ca.crt": ByteString(ca.pem.clone().into_bytes()) },
    }))
    .unwrap();
    secrets.patch(SECRET, &PatchParams::apply("teifleet-e2e").force(), &Patch::Apply(corrupt)).await.unwrap();
    let message = wait_tls_ready(&client, &ns.name, "False", CERTIFICATE_INVALID, "tls.crt").await;
    println!("corrupt certificate: TLSReady False: {message}");
    assert_eq!(clients.served_serial().await, Some(second.serial.clone()), "the good certificate stays served");
    let channel = clients.channel();
    InfoClient::new(channel).info(InfoRequest {}).await.expect("new connections still served");

    let (ok, output) = helm(&["uninstall", RELEASE, "-n", &ns.name, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");
}

#[tokio::test]
async fn a_tls_pool_at_zero_is_served_its_own_certificate_by_the_activator_and_its_first_calls_answered_on_real_pods() {
    let client = admin_client().await;
    let Some(images) = prerequisites(&client).await else { return };
    for (tar, _) in images.values() {
        import_into_real_node(tar);
    }
    install_crd(&client).await;
    let ns = restricted_namespace("real-tls-zero").await;
    let release = "tftlszero";
    install_chart(&client, &ns.name, release).await;

    let ca = Authority::new("teifleet e2e CA at zero");
    let names = pool_names(&ns.name);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let issued = ca.peer(&names);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets.create(&PostParams::default(), &tls_secret(&ca, &issued)).await.expect("the TLS Secret");
    // Accepted by the API server: no rule refuses spec.tls with minReplicas 0 any more.
    create_pool(
        &client,
        &ns.name,
        POOL,
        json!({
            "replicas": null,
            "gpu": { "type": "cpu" },
            "tei": { "image": images["tei-sim"].1, "extraArgs": ["--fixed-latency=20ms"] },
            "concurrency": { "maxInFlight": 4, "maxInFlightPerReplica": 4, "maxQueued": 64 },
            "autoscaling": { "minReplicas": 0, "maxReplicas": 1, "scaleToZeroAfter": "30s", "coldStartHold": "180s" },
            "tls": { "secretName": SECRET },
            "template": pool_template(),
        }),
    )
    .await;

    // At zero, the activator behind the pool's Service.
    let pools = Api::<EmbeddingPool>::namespaced(client.clone(), &ns.name);
    eventually("the pool at zero", Duration::from_secs(120), || async {
        let pool = pools.get(POOL).await.ok()?;
        let status = pool.status?;
        (status.autoscaling?.desired_replicas == 0 && status.ready_replicas == 0).then_some(())
    })
    .await;
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns.name);
    let slice = format!("{POOL}-{}", labels::ACTIVATOR_COMPONENT);
    eventually("the activator behind the pool's Service", Duration::from_secs(120), || async {
        (!slices.get_opt(&slice).await.ok()??.endpoints.is_empty()).then_some(())
    })
    .await;
    let service = service_addr(&client, &ns.name, POOL).await;
    let clients = Clients::new(&ca, service, &ns.name);

    // The activator shows the pool's own certificate to a client trusting only the pool's CA.
    let serial = eventually("the activator serving the pool's certificate", Duration::from_secs(60), || async {
        clients.served_serial().await
    })
    .await;
    assert_eq!(serial, issued.serial, "the pool's certificate, from its Secret");

    // The first calls at zero: a gRPC call in TLS and an HTTPS request, held and answered.
    let started = std::time::Instant::now();
    let grpc = tokio::spawn({
        let channel = clients.channel();
        async move {
            let mut call = tonic::Request::new(EmbedRequest { inputs: "TLS at zero".into(), ..Default::default() });
            call.set_timeout(Duration::from_secs(180));
            let answer = EmbedClient::new(channel).embed(call).await;
            (answer.map(drop), started.elapsed())
        }
    });
    let ca_file = teifleet_e2e::log_dir().join(format!("{}-ca.crt", ns.name));
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let https = tokio::task::spawn_blocking({
        let name = clients.name.clone();
        move || {
            let resolve = format!("{name}:{}:{}", teifleet_wire::ports::MULTIPLEXER_HTTP, service.ip());
            std::process::Command::new("curl")
                .args(["-sS", "--fail", "--max-time", "180", "--cacert"])
                .arg(&ca_file)
                .args(["--resolve", &resolve, "-H", "content-type: application/json"])
                .args(["-d", r#"{"inputs":"HTTPS at zero"}"#])
                .arg(format!("https://{name}:{}/embed", teifleet_wire::ports::MULTIPLEXER_HTTP))
                .output()
                .expect("curl runs")
        }
    });
    let (answer, waited) = grpc.await.unwrap();
    answer.expect("the held gRPC call in TLS is answered");
    let https = https.await.unwrap();
    assert!(https.status.success(), "HTTPS at zero: {}", String::from_utf8_lossy(&https.stderr));
    println!("TLS at zero: the first gRPC call waited {waited:?}");

    let (ok, output) = helm(&["uninstall", release, "-n", &ns.name, "--wait", "--timeout", "60s"]);
    assert!(ok, "{output}");
}
