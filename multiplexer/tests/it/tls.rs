//! TLS on the pool's ports: gRPC in TLS with a certificate that rotates under load, mutual TLS
//! naming the tenant, nothing served in plain text while a certificate is awaited, and sidecars
//! calling each other (spillover, routing to another pool) in TLS, verifying each other, and a
//! call that came in TLS routed on in plain text only where its pool allows it.
//! Real clients (grpcio, the OpenAI SDK, curl) are in tests/clients/test_tls.py.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rustls::pki_types::ServerName;
use teifleet_multiplexer::forward::pools::{PoolSpec, PoolTable};
use teifleet_multiplexer::forward::upstream::{Dialer, Upstream};
use teifleet_multiplexer::run::server::{InputBounds, Running, Settings};
use teifleet_proto::v1::embed_client::EmbedClient;
use teifleet_runtime::tls::{Material, ServerTls};
use teifleet_testkit::certs::{Authority, Issued};
use teifleet_wire::headers::POOL as POOL_HEADER;
use tonic::transport::Channel;

use crate::support::*;

fn material(ca: &Authority, issued: &Issued, client_ca: Option<&Authority>) -> Material {
    Material {
        chain: issued.chain_pem.clone().into(),
        key: issued.key_pem.clone().into(),
        ca: Some(ca.pem.clone().into()),
        client_ca: client_ca.map(|ca| ca.pem.clone().into()),
    }
}

fn serving(ca: &Authority, issued: &Issued, client_ca: Option<&Authority>) -> Arc<ServerTls> {
    let tls = Arc::new(ServerTls::off());
    tls.offer(&material(ca, issued, client_ca)).expect("a valid set");
    tls
}

/// A client of `addr` in TLS, trusting `ca` and showing `certificate`.
pub fn tls_client(addr: SocketAddr, ca: &Authority, certificate: &Issued) -> EmbedClient<Channel> {
    let dialer = Dialer::new(serving(ca, certificate, None));
    let upstream = Upstream::lazy(&format!("https://{addr}"), &dialer).expect("a valid URL");
    EmbedClient::new(upstream.channel())
}

/// The serial of the certificate a new TLS connection to `addr` is shown.
async fn served_serial(addr: SocketAddr, ca: &Authority) -> String {
    let client = serving(ca, &ca.client("probe"), None).client().unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let stream = tokio_rustls::TlsConnector::from(client).connect(name, tcp).await.expect("handshake");
    teifleet_runtime::tls::serial_of(&stream.get_ref().1.peer_certificates().unwrap()[0]).unwrap()
}

async fn tls_mux(sim: SocketAddr, tls: Arc<ServerTls>, tenants: &[(&str, u32)]) -> Running {
    let tenants: BTreeMap<String, u32> = tenants.iter().map(|(t, w)| ((*t).to_owned(), *w)).collect();
    let spec = PoolSpec { tenants, ..spec("pool-a", sim, limits(8, 256)) };
    mux_with(vec![spec], Settings { tls, ..Settings::default() }).await.0
}

#[tokio::test]
async fn grpc_in_tls_and_a_rotation_under_load_fails_no_call() {
    let sim = sim(|_| {}).await;
    let ca = Authority::new("pool CA");
    let (first, second) = (ca.server(&["127.0.0.1"]), ca.server(&["127.0.0.1"]));
    let tls = serving(&ca, &first, None);
    let mux = tls_mux(sim.addr(), tls.clone(), &[]).await;
    assert_eq!(served_serial(mux.grpc_addr, &ca).await, first.serial);

    let client = tls_client(mux.grpc_addr, &ca, &ca.client("caller"));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let (done, failed) = (done.clone(), failed.clone());
        tokio::spawn(async move {
            for i in 0..200 {
                match client.clone().embed(embed_request(&format!("steady {i}"))).await {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(status) => {
                        eprintln!("failed: {status:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    until("calls flowing", Duration::from_secs(10), || done.load(Ordering::Relaxed) >= 20).await;
    tls.offer(&material(&ca, &second, None)).unwrap();
    assert_eq!(served_serial(mux.grpc_addr, &ca).await, second.serial, "new connections get the new certificate");
    load.await.unwrap();
    assert_eq!((done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed)), (200, 0));

    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_requests_total", &[("outcome", "ok")]), 200.0);
}

#[tokio::test]
async fn a_plain_text_client_or_one_without_the_ca_is_refused_at_the_handshake() {
    let sim = sim(|_| {}).await;
    let (ca, stranger) = (Authority::new("pool CA"), Authority::new("another CA"));
    let mux = tls_mux(sim.addr(), serving(&ca, &ca.server(&["127.0.0.1"]), None), &[]).await;
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", mux.grpc_addr)).unwrap();
    // How a client reports a refused handshake is its own business (tonic: UNAVAILABLE, or the
    // TLS alert read as a broken HTTP/2 frame); that it is refused, and counted, is ours.
    assert!(EmbedClient::new(plain.connect_lazy()).embed(embed_request("clear")).await.is_err());
    let untrusting = tls_client(mux.grpc_addr, &stranger, &stranger.client("x"));
    assert!(untrusting.clone().embed(embed_request("who are you")).await.is_err());
    until("both handshakes counted", Duration::from_secs(5), || refused(&mux, "grpc", "tls_handshake") >= 2.0).await;
    assert_eq!(sim.stats().requests_received, 0, "nothing reached TEI");
}

#[tokio::test]
async fn mutual_tls_names_the_tenant_from_the_client_certificate() {
    let sim = sim(|_| {}).await;
    let (ca, clients, stranger) = (Authority::new("pool CA"), Authority::new("client CA"), Authority::new("other"));
    let tls = serving(&ca, &ca.server(&["127.0.0.1"]), Some(&clients));
    let mux = tls_mux(sim.addr(), tls, &[("search", 3)]).await;

    let search = tls_client(mux.grpc_addr, &ca, &clients.client("search"));
    // The tenant it names itself is overruled by its certificate.
    let call = with_meta(embed_request("mine"), &[(teifleet_wire::headers::TENANT, "batch")]);
    search.clone().embed(call).await.expect("a certified client is served");
    let text = metrics_text(&mux);
    assert_eq!(metric_sum(&text, "teifleet_tenant_requests_total", &[("tenant", "search")]), 1.0, "{text}");

    let uncertified = tls_client(mux.grpc_addr, &ca, &stranger.client("search"));
    assert!(uncertified.clone().embed(embed_request("forged")).await.is_err());
    until("the handshake refusal counted", Duration::from_secs(5), || refused(&mux, "grpc", "tls_handshake") >= 1.0)
        .await;
    assert_eq!(sim.stats().requests_received, 1);
}

#[tokio::test]
async fn while_a_certificate_is_awaited_nothing_is_served_in_plain_text() {
    let sim = sim(|_| {}).await;
    let settings = Settings {
        tls: Arc::new(ServerTls::waiting()),
        bounds: InputBounds { header_read_timeout: Duration::from_millis(300), ..InputBounds::default() },
        ..Settings::default()
    };
    let (mux, _) = mux_with(vec![spec("pool-a", sim.addr(), limits(8, 64))], settings).await;
    assert!(embed_client_lazy(mux.grpc_addr).embed(embed_request("too early")).await.is_err());
    assert!(refused(&mux, "grpc", "tls_not_loaded") >= 1.0);
    assert_eq!(sim.stats().requests_received, 0);
}

fn embed_client_lazy(addr: SocketAddr) -> EmbedClient<Channel> {
    EmbedClient::new(tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy())
}

#[tokio::test]
async fn a_silent_client_is_closed_at_the_header_timeout_handshake_included() {
    use tokio::io::AsyncReadExt as _;
    let sim = sim(|_| {}).await;
    let ca = Authority::new("pool CA");
    let settings = Settings {
        tls: serving(&ca, &ca.server(&["127.0.0.1"]), None),
        bounds: InputBounds { header_read_timeout: Duration::from_millis(300), ..InputBounds::default() },
        ..Settings::default()
    };
    let (mux, _) = mux_with(vec![spec("pool-a", sim.addr(), limits(8, 64))], settings).await;
    let mut silent = tokio::net::TcpStream::connect(mux.grpc_addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut [0; 16])).await;
    assert!(matches!(closed, Ok(Ok(0) | Err(_))), "closed, not left open: {closed:?}");
    assert_eq!(refused(&mux, "grpc", "tls_handshake"), 1.0);
}

#[tokio::test]
async fn sidecars_spill_and_route_to_each_other_in_tls_verifying_each_other() {
    let (ca, clients) = (Authority::new("pool CA"), Authority::new("client CA"));
    // Mutual TLS on both replicas. A sibling shows its own certificate when it calls the other,
    // so the pool's certificate serves as a client certificate too, and the client CA bundle
    // trusts the pool's CA beside the callers'.
    let bundle = format!("{}{}", clients.pem, ca.pem);
    let pool_certificate = ca.peer(&["127.0.0.1"]);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let sim = sim(|config| config.fixed_latency = Duration::from_millis(20)).await;
        let tls = Arc::new(ServerTls::off());
        let set = Material { client_ca: Some(bundle.clone().into()), ..material(&ca, &pool_certificate, None) };
        tls.offer(&set).unwrap();
        let metrics = teifleet_multiplexer::report::metrics::Metrics::new();
        let table = Arc::new(teifleet_multiplexer::forward::pools::PoolTable::with_dialer(
            "pool-a",
            metrics.clone(),
            Dialer::new(tls.clone()),
        ));
        let tenants: BTreeMap<String, u32> = [("search".to_owned(), 2)].into();
        table.sync(vec![PoolSpec { tenants, ..spec("pool-a", sim.addr(), limits(2, 256)) }]).unwrap();
        let settings = Settings { tls, health_interval: Duration::from_millis(100), ..Settings::default() };
        let mux = teifleet_multiplexer::run::server::start(settings, table.clone(), metrics).await.unwrap();
        replicas.push((sim, mux, table));
    }
    let (first, second) = (replicas[0].1.grpc_addr, replicas[1].1.grpc_addr);
    replicas[0].2.siblings().sync(&[format!("https://{second}")]).unwrap();
    replicas[1].2.siblings().sync(&[format!("https://{first}")]).unwrap();
    for (_, _, table) in &replicas {
        table.siblings().peer_key().set(Some(crate::spill::PEER_KEY.as_bytes())).unwrap();
    }

    let client = tls_client(first, &ca, &clients.client("search"));
    let calls: Vec<_> = (0..24).map(|i| spawn_embed(&client, embed_request(&format!("pinned {i}")))).collect();
    for call in calls {
        call.await.unwrap().expect("served here or at the sibling");
    }
    let text = metrics_text(&replicas[0].1);
    assert_eq!(metric_sum(&text, "teifleet_spills_total", &[("result", "unreachable")]), 0.0, "{text}");
    let spilled = metric_sum(&text, "teifleet_spills_total", &[("result", "served")]);
    assert!(spilled > 0.0, "{text}");
    // The sibling served them as the caller's tenant, not as the sibling's certificate's name.
    let sibling = metrics_text(&replicas[1].1);
    assert_eq!(
        metric_sum(&sibling, "teifleet_tenant_requests_total", &[]),
        0.0,
        "spilled calls are counted once, by the replica called"
    );
    assert_eq!(metric_sum(&sibling, "teifleet_spilled_in_total", &[("outcome", "ok")]), spilled, "{sibling}");

    // Routing to another pool whose sidecar serves TLS.
    let remote =
        PoolSpec { remote: true, upstream: format!("https://{second}"), ..spec("pool-b", second, limits(8, 64)) };
    let own = spec("pool-a", replicas[0].0.addr(), limits(2, 256));
    replicas[0].2.sync(vec![own, remote]).unwrap();
    let routed = client.clone().embed(with_meta(embed_request("to b"), &[(POOL_HEADER, "pool-b")])).await;
    // pool-b is not a pool the second sidecar serves: it answers NOT_FOUND, in TLS, which proves
    // the hop was made and verified.
    assert_eq!(routed.unwrap_err().code(), tonic::Code::NotFound);
}

/// A sidecar serving TLS, its own pool first in `specs`, reaching `https://` pools with its own
/// certificate set.
async fn tls_sidecar(tls: Arc<ServerTls>, specs: Vec<PoolSpec>) -> (Running, Arc<PoolTable>) {
    let metrics = teifleet_multiplexer::report::metrics::Metrics::new();
    let table = Arc::new(PoolTable::with_dialer(&specs[0].name, metrics.clone(), Dialer::new(tls.clone())));
    table.sync(specs).unwrap();
    let settings = Settings { tls, health_interval: Duration::from_millis(100), ..Settings::default() };
    (teifleet_multiplexer::run::server::start(settings, table.clone(), metrics).await.unwrap(), table)
}

/// A call that came in TLS is not routed to a pool served in plain text, where it would cross the
/// network in clear text, unless the pool it came to allows it (`spec.tls.allowPlaintextRoutes`);
/// TLS to TLS is served as ever (plain text to plain text: `routing.rs`).
#[tokio::test]
async fn a_call_that_came_in_tls_goes_on_in_plain_text_only_where_its_pool_allows_it() {
    let ca = Authority::new("pool CA");
    let certificate = ca.peer(&["127.0.0.1"]);
    let (tei_a, tei_plain, tei_tls) =
        (sim(|_| {}).await, sim(|c| c.dimensions = 12).await, sim(|c| c.dimensions = 6).await);
    let (plain, _) = mux_with(vec![spec("plain", tei_plain.addr(), limits(2, 8))], Settings::default()).await;
    let (secure, _) =
        tls_sidecar(serving(&ca, &certificate, None), vec![spec("secure", tei_tls.addr(), limits(2, 8))]).await;
    let routes = vec![
        spec("a", tei_a.addr(), limits(2, 8)),
        PoolSpec { remote: true, ..spec("plain", plain.grpc_addr, limits(2, 8)) },
        PoolSpec {
            remote: true,
            upstream: format!("https://{}", secure.grpc_addr),
            ..spec("secure", secure.grpc_addr, limits(2, 8))
        },
    ];
    let (a, table) = tls_sidecar(serving(&ca, &certificate, None), routes).await;
    let client = tls_client(a.grpc_addr, &ca, &ca.client("search"));
    let to = |pool: &'static str| {
        let mut client = client.clone();
        async move { client.embed(with_meta(embed_request("routed"), &[(POOL_HEADER, pool)])).await }
    };

    let refused = to("plain").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    let message = refused.message();
    assert!(message.contains("pool plain") && message.contains("allowPlaintextRoutes"), "{message}");
    let port = plain.grpc_addr.port().to_string();
    assert!(!message.contains("127.0.0.1") && !message.contains(&port) && !message.contains("http"), "{message}");
    assert_eq!(tei_plain.stats().requests_received, 0, "nothing went out in clear text");

    let served = to("secure").await.expect("TLS to TLS");
    assert_eq!(served.into_inner().embeddings.len(), 6);

    table.allow_plaintext_routes(true);
    let served = to("plain").await.expect("allowed");
    assert_eq!(served.into_inner().embeddings.len(), 12);
    assert_eq!(tei_plain.stats().requests_received, 1);
}
