//! TLS at zero: one activator stands in for two pools with `spec.tls` and one without. A client
//! of each TLS pool that trusts only that pool's CA shakes hands (the activator serves the
//! pool's own certificate, picked by the name asked for), its call is held, and once a replica
//! is ready it is passed on to it in TLS and answered; the same over HTTPS (`/embed`); the plain
//! pool's client is served in plain text on the same port.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use teifleet_multiplexer::activator::{Activations, PoolNaming};
use teifleet_multiplexer::forward::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::report::metrics::Metrics;
use teifleet_multiplexer::run::server::{self, Running, Settings};
use teifleet_multiplexer::transport::tls::{Certificates, PoolCertificates};
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_runtime::tls::{Material, ServerTls};
use teifleet_tei_sim::SimHandle;
use teifleet_testkit::certs::{Authority, Issued};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::support::*;

/// A pool's certificate authority and the certificate its sidecars (and the activator) serve.
struct PoolCert {
    ca: Authority,
    issued: Issued,
}

impl PoolCert {
    fn new(pool: &str) -> Self {
        let ca = Authority::new(&format!("{pool} CA"));
        let names = [format!("{pool}.ml.svc"), format!("{pool}.ml.svc.cluster.local")];
        let issued = ca.peer(&names.iter().map(String::as_str).collect::<Vec<_>>());
        Self { ca, issued }
    }

    /// The pool's set; under mutual TLS the client CA bundle holds the pool's own CA too, as it
    /// must (docs/clients.md): its sidecars, and the activator, show the pool's certificate.
    fn material(&self, client_ca: Option<&Authority>) -> Material {
        Material {
            chain: self.issued.chain_pem.clone().into(),
            key: self.issued.key_pem.clone().into(),
            ca: Some(self.ca.pem.clone().into()),
            client_ca: client_ca.map(|ca| format!("{}{}", ca.pem, self.ca.pem).into()),
        }
    }
}

/// A client trusting only `ca`, showing `certificate` when it has one.
pub fn trusting(ca: &Authority, certificate: Option<&Issued>, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    ca.client_config(certificate, alpn)
}

/// A gRPC client of the activator at `addr` that dialled `name` in TLS with `config` (asking for
/// `name`, as a client of the pool Service does).
pub fn tls_dialling(addr: SocketAddr, name: &'static str, config: Arc<ClientConfig>) -> EmbedClient<Channel> {
    let endpoint = Endpoint::from_shared(format!("https://{name}:50051")).unwrap();
    let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let config = config.clone();
        async move {
            let tcp = TcpStream::connect(addr).await?;
            let stream = TlsConnector::from(config).connect(ServerName::try_from(name).unwrap(), tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    }));
    EmbedClient::new(channel)
}

/// An HTTP/1.1 request in TLS to the activator's HTTP port, asking for `name` (and sending it as
/// `Host` too, unless `host` names another): its status line's code and its body.
pub async fn https_post(
    addr: SocketAddr,
    name: &'static str,
    host: Option<&'static str>,
    config: Arc<ClientConfig>,
    path: &str,
    body: &str,
) -> (u16, String) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut stream =
        TlsConnector::from(config).connect(ServerName::try_from(name).unwrap(), tcp).await.expect("handshake");
    let host = host.unwrap_or(name);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}:8000\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    (status, body)
}

/// Whether a handshake with the activator asking for `name`, trusting only `ca`, succeeds.
async fn shakes_hands(addr: SocketAddr, name: &'static str, config: Arc<ClientConfig>) -> bool {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let Ok(mut stream) = TlsConnector::from(config).connect(ServerName::try_from(name).unwrap(), tcp).await else {
        return false;
    };
    // Under TLS 1.3 a refused client certificate is only told after the client's last flight.
    stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.is_ok()
        && stream.read(&mut [0; 64]).await.is_ok_and(|n| n > 0)
}

/// An activator for `pools` of namespace `ml` (the TLS ones with their sets in `tls`), holding
/// calls up to `hold`.
pub async fn tls_activator(
    pools: &[&str],
    tls: &[(&str, Material)],
    hold: Duration,
) -> (Running, Arc<Activations>, Arc<PoolCertificates>) {
    let metrics = Metrics::new();
    let certificates = Certificates::new(&metrics.registry).unwrap();
    let pool_certificates = Arc::new(PoolCertificates::new("ml", &certificates));
    for (pool, material) in tls {
        pool_certificates.offer(pool, material, "test");
    }
    let activations = Arc::new(Activations::default().with_certificates(pool_certificates.clone()));
    activations.sync(&pools.iter().map(|pool| ((*pool).to_owned(), hold)).collect::<Vec<_>>());
    let table = Arc::new(PoolTable::activator(metrics.clone(), activations.clone()));
    let spec = |pool: &str| {
        let tls = tls.iter().any(|(name, _)| name == &pool);
        activations.set_tls(pool, tls).unwrap();
        let scheme = if tls { "activated-tls" } else { "activated" };
        PoolSpec {
            name: pool.into(),
            model: Some(format!("{MODEL}/{pool}")),
            upstream: format!("{scheme}://{pool}"),
            limits: Some(limits(1 << 20, 1 << 20)),
            remote: true,
            coalesce: false,
            cache: None,
            tenants: BTreeMap::new(),
        }
    };
    table.sync(pools.iter().map(|pool| spec(pool)).collect()).unwrap();
    let naming = PoolNaming::new("ml");
    // The pools with mutual TLS, as the activator's watch finds them.
    let mutual = tls.iter().filter(|(_, material)| material.client_ca.is_some());
    naming.set_mutual(mutual.map(|(pool, _)| ((*pool).to_owned(), Some(format!("{MODEL}/{pool}")))).collect());
    let settings = Settings {
        http_listen: Some("127.0.0.1:0".parse().unwrap()),
        pool_naming: Some(Arc::new(naming)),
        tls: Arc::new(ServerTls::by_server_name(pool_certificates.clone())),
        ..Settings::default()
    };
    (server::start(settings, table, metrics).await.expect("the activator starts"), activations, pool_certificates)
}

/// A ready replica of `pool`: a sidecar in front of a simulator, serving `material` when given.
pub async fn replica(pool: &str, material: Option<Material>) -> (Running, SimHandle) {
    let sim = sim(|_| {}).await;
    let tls = Arc::new(ServerTls::off());
    if let Some(material) = material {
        tls.offer(&material).expect("a valid set");
    }
    let tenants = BTreeMap::from([("search".to_owned(), 1), ("forged".to_owned(), 1)]);
    let spec = PoolSpec { tenants, ..spec(pool, sim.addr(), limits(8, 64)) };
    let (running, _) = mux_with(vec![spec], Settings { tls, ..Settings::default() }).await;
    (running, sim)
}

pub fn held(activations: &Activations) -> u32 {
    activations.report().pools.iter().map(|pool| pool.held).sum()
}

fn served(replica: &Running) -> f64 {
    metric_sum(&metrics_text(replica), "teifleet_requests_total", &[("outcome", "ok")])
}

#[tokio::test]
async fn each_tls_pool_is_served_its_own_certificate_held_and_answered_and_a_plain_pool_in_plain_text() {
    let (bge, gte) = (PoolCert::new("bge"), PoolCert::new("gte"));
    let tls = [("bge", bge.material(None)), ("gte", gte.material(None))];
    let (activator, activations, _) = tls_activator(&["bge", "gte", "plain"], &tls, Duration::from_secs(30)).await;
    let (grpc, http) = (activator.grpc_addr, activator.http_addr.unwrap());

    // Each pool's certificate, checked by a client that trusts only that pool's CA.
    let h2: &[&[u8]] = &[b"h2"];
    assert!(shakes_hands(grpc, "bge.ml.svc", trusting(&bge.ca, None, h2)).await);
    assert!(shakes_hands(grpc, "gte.ml.svc.cluster.local", trusting(&gte.ca, None, h2)).await);
    assert!(!shakes_hands(grpc, "gte.ml.svc", trusting(&bge.ca, None, h2)).await, "gte's is not bge's");
    assert!(!shakes_hands(grpc, "plain.ml.svc", trusting(&bge.ca, None, h2)).await, "no TLS for the plain pool");
    assert!(!shakes_hands(grpc, "bge.other.svc", trusting(&bge.ca, None, h2)).await, "another namespace's");
    until("the unknown names counted", Duration::from_secs(5), || {
        refused(&activator, "grpc", "tls_unknown_name") >= 2.0
    })
    .await;

    let bge_call =
        spawn_embed(&tls_dialling(grpc, "bge.ml.svc", trusting(&bge.ca, None, h2)), embed_request("bge at zero"));
    let gte_call =
        spawn_embed(&tls_dialling(grpc, "gte.ml.svc", trusting(&gte.ca, None, h2)), embed_request("gte at zero"));
    let gte_https = tokio::spawn(https_post(
        http,
        "gte.ml.svc",
        None,
        trusting(&gte.ca, None, &[]),
        "/embed",
        r#"{"inputs":"over HTTPS"}"#,
    ));
    let plain_client = {
        let endpoint = Endpoint::from_shared(format!("http://{grpc}")).unwrap();
        EmbedClient::new(endpoint.origin("http://plain.ml.svc:50051".parse().unwrap()).connect_lazy())
    };
    let plain_call = spawn_embed(&plain_client, embed_request("plain at zero"));
    until("four calls held", Duration::from_secs(10), || held(&activations) == 4).await;

    // The pools' first replicas are ready: bge's and gte's serve their own sets.
    let (bge_replica, _bge_sim) = replica("bge", Some(bge.material(None))).await;
    let (gte_replica, _gte_sim) = replica("gte", Some(gte.material(None))).await;
    let (plain_replica, _plain_sim) = replica("plain", None).await;
    activations.set_peers("bge", &[format!("https://{}", bge_replica.grpc_addr)]).unwrap();
    activations.set_peers("gte", &[format!("https://{}", gte_replica.grpc_addr)]).unwrap();
    activations.set_peers("plain", &[format!("http://{}", plain_replica.grpc_addr)]).unwrap();

    bge_call.await.unwrap().expect("bge's held call is answered");
    gte_call.await.unwrap().expect("gte's held call is answered");
    plain_call.await.unwrap().expect("the plain pool's held call is answered");
    let (status, body) = gte_https.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(held(&activations), 0);
    assert_eq!((served(&bge_replica), served(&gte_replica), served(&plain_replica)), (1.0, 2.0, 1.0));
}

#[tokio::test]
async fn under_mutual_tls_only_a_client_certificate_from_the_pools_client_ca_is_held_and_its_tenant_kept() {
    let (secure, bge) = (PoolCert::new("secure"), PoolCert::new("bge"));
    let (clients, stranger) = (Authority::new("secure's clients"), Authority::new("someone else"));
    let tls = [("secure", secure.material(Some(&clients))), ("bge", bge.material(None))];
    let (activator, activations, _) = tls_activator(&["secure", "bge"], &tls, Duration::from_secs(30)).await;
    let (grpc, http) = (activator.grpc_addr, activator.http_addr.unwrap());
    let h2: &[&[u8]] = &[b"h2"];
    let search = clients.client("search");

    // No certificate, or one from another CA: refused at the handshake.
    assert!(!shakes_hands(grpc, "secure.ml.svc", trusting(&secure.ca, None, h2)).await);
    assert!(!shakes_hands(grpc, "secure.ml.svc", trusting(&secure.ca, Some(&stranger.client("search")), h2)).await);
    assert!(shakes_hands(grpc, "secure.ml.svc", trusting(&secure.ca, Some(&search), h2)).await);

    // Naming the pool in plain text, or in TLS to another pool: refused at once, not held.
    let plain = {
        let endpoint = Endpoint::from_shared(format!("http://{grpc}")).unwrap();
        EmbedClient::new(endpoint.origin("http://secure.ml.svc:50051".parse().unwrap()).connect_lazy())
    };
    let status = plain.clone().embed(embed_request("no certificate")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    let via_bge = tls_dialling(grpc, "bge.ml.svc", trusting(&bge.ca, None, h2));
    let named = with_meta(embed_request("through bge"), &[(teifleet_wire::headers::POOL, "secure")]);
    assert_eq!(via_bge.clone().embed(named).await.unwrap_err().code(), tonic::Code::Unauthenticated);
    let (status, body) = https_post(
        http,
        "bge.ml.svc",
        Some("secure.ml.svc"),
        trusting(&bge.ca, None, &[]),
        "/embed",
        r#"{"inputs":"x"}"#,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(held(&activations), 0, "none of them held");

    // With a certificate from the pool's client CA: held, passed on, and counted at the replica
    // for the certificate's tenant, not the one the call names itself.
    let certified = tls_dialling(grpc, "secure.ml.svc", trusting(&secure.ca, Some(&search), h2));
    let forged = with_meta(embed_request("mutual at zero"), &[(teifleet_wire::headers::TENANT, "forged")]);
    let call = spawn_embed(&certified, forged);
    let https = tokio::spawn(https_post(
        http,
        "secure.ml.svc",
        None,
        trusting(&secure.ca, Some(&search), &[]),
        "/embed",
        r#"{"inputs":"mutual over HTTPS"}"#,
    ));
    until("two calls held", Duration::from_secs(10), || held(&activations) == 2).await;
    let (replica, _sim) = replica("secure", Some(secure.material(Some(&clients)))).await;
    activations.set_peers("secure", &[format!("https://{}", replica.grpc_addr)]).unwrap();
    call.await.unwrap().expect("the certified call is answered");
    let (status, body) = https.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let text = metrics_text(&replica);
    let tenant = |name: &str| metric_sum(&text, "teifleet_tenant_requests_total", &[("tenant", name)]);
    assert_eq!((tenant("search"), tenant("forged")), (2.0, 0.0), "{text}");
}
