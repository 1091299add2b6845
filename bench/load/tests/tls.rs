//! gRPC in TLS: the load generator against a TLS terminator (rustls, tickets on, as the sidecar
//! serves) splicing into an in-process simulator, over 127.0.0.1. Long-lived connections make one
//! full handshake; a connection per call resumes the run's session.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use teifleet_load::{Call, Error, LoadConfig};
use teifleet_testkit::certs::Authority;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// Accepts TLS on a loopback port and splices each connection to `upstream` in plaintext.
async fn terminator(authority: &Authority, upstream: SocketAddr) -> SocketAddr {
    let issued = authority.server(&["127.0.0.1", "localhost"]);
    let chain = CertificateDer::pem_slice_iter(issued.chain_pem.as_bytes()).collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let mut config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let Ok(mut plain) = TcpStream::connect(upstream).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

fn ca_file(authority: &Authority, name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("teifleet-load-{name}-{}.pem", std::process::id()));
    std::fs::write(&path, &authority.pem).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_over_tls_resume_when_each_opens_its_own_connection() {
    let sim = teifleet_tei_sim::start(teifleet_tei_sim::SimConfig::default()).await.unwrap();
    let authority = Authority::new("load test CA");
    let target = format!("https://{}", terminator(&authority, sim.addr()).await);
    let ca = ca_file(&authority, "ca");
    let config = LoadConfig { ca_cert: Some(ca.clone()), ..LoadConfig::closed(target.clone(), 1, 20) };

    // One long-lived connection: one full handshake, before the first call.
    let report = teifleet_load::run(&config).await.unwrap();
    assert_eq!(report.ok, 20, "{:?}", report.codes);
    let handshakes = report.tls.unwrap();
    assert_eq!((handshakes.full, handshakes.resumed), (1, 0));

    // A connection per call: the first (before the run) is full, the calls' resume its session.
    let per_call = LoadConfig { call: Call::Info, connection_per_call: true, ..config };
    let report = teifleet_load::run(&per_call).await.unwrap();
    assert_eq!(report.ok, 20, "{:?}", report.codes);
    assert!(report.info.connection_per_call);
    let handshakes = report.tls.unwrap();
    assert_eq!(handshakes.full + handshakes.resumed, 21, "{handshakes:?}");
    assert!(handshakes.resumed >= 19, "{handshakes:?}");
    let _ = std::fs::remove_file(ca);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_targets_need_the_right_ca() {
    let sim = teifleet_tei_sim::start(teifleet_tei_sim::SimConfig::default()).await.unwrap();
    let authority = Authority::new("load test CA");
    let target = format!("https://{}", terminator(&authority, sim.addr()).await);

    let without = LoadConfig::closed(target.clone(), 1, 1);
    assert!(matches!(teifleet_load::run(&without).await, Err(Error::InvalidArgument(_))));

    let other = ca_file(&Authority::new("another CA"), "other");
    let untrusted = LoadConfig { ca_cert: Some(other.clone()), ..LoadConfig::closed(target, 1, 1) };
    assert!(matches!(teifleet_load::run(&untrusted).await, Err(Error::Connect { .. })));

    // A CA bundle for a plaintext target is a mistake, not silently ignored.
    let plain =
        LoadConfig { ca_cert: Some(other.clone()), ..LoadConfig::closed(format!("http://{}", sim.addr()), 1, 1) };
    assert!(matches!(teifleet_load::run(&plain).await, Err(Error::InvalidArgument(_))));
    let _ = std::fs::remove_file(other);
}
