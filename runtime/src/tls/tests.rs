use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use teifleet_testkit::certs::{Authority, Issued};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::TlsConnector;

use super::*;

fn material(ca: &Authority, issued: &Issued) -> Material {
    Material {
        chain: issued.chain_pem.clone().into(),
        key: issued.key_pem.clone().into(),
        ca: Some(ca.pem.clone().into()),
        client_ca: None,
    }
}

fn client_config(trusted: &Authority, certificate: Option<&Issued>) -> Arc<ClientConfig> {
    trusted.client_config(certificate, &[])
}

/// Shakes hands over an in-memory pipe: the server's outcome, and the serial the client saw
/// (none when the client's side failed).
async fn handshake(
    tls: &ServerTls,
    client: Arc<ClientConfig>,
) -> (Result<Option<String>, &'static str>, Option<String>) {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let server = async {
        let mut stream = accept(tls, server_io, deadline).await?;
        let identity = stream.client().map(|c| c.name.clone());
        // Read the client's byte so the handshake's last flight is in.
        let _ = stream.read(&mut [0; 1]).await;
        Ok(identity)
    };
    let client = async {
        let name = ServerName::try_from("pool.ml.svc").unwrap();
        let mut stream = TlsConnector::from(client).connect(name, client_io).await.ok()?;
        stream.write_all(b"x").await.ok()?;
        stream.flush().await.ok()?;
        let leaf = stream.get_ref().1.peer_certificates()?.first()?.clone();
        // Kept open until the server is done: it writes its session tickets after the handshake.
        Some((stream, serial_of(&leaf)?))
    };
    let (server, client) = tokio::join!(server, client);
    (server, client.map(|(_open, serial)| serial))
}

#[tokio::test]
async fn new_handshakes_get_the_certificate_in_force() {
    let ca = Authority::new("test CA");
    let (first, second) = (ca.server(&["pool.ml.svc"]), ca.server(&["pool.ml.svc"]));
    let tls = ServerTls::off();
    assert_eq!(tls.report(), None, "plain text reports nothing");
    assert_eq!(tls.offer(&material(&ca, &first)).unwrap().serial, first.serial);
    let (server, seen) = handshake(&tls, client_config(&ca, None)).await;
    assert_eq!((server, seen.as_deref()), (Ok(None), Some(first.serial.as_str())));

    tls.offer(&material(&ca, &second)).unwrap();
    let (_, seen) = handshake(&tls, client_config(&ca, None)).await;
    assert_eq!(seen.as_deref(), Some(second.serial.as_str()), "rotated");
}

#[tokio::test]
async fn a_broken_set_leaves_the_one_in_force_and_says_why() {
    let ca = Authority::new("test CA");
    let good = ca.server(&["pool.ml.svc"]);
    let other = ca.server(&["pool.ml.svc"]);
    let tls = ServerTls::off();
    tls.offer(&material(&ca, &good)).unwrap();

    let mismatched = Material { key: other.key_pem.clone().into(), ..material(&ca, &good) };
    assert!(matches!(tls.offer(&mismatched), Err(TlsError::KeyMismatch)));
    let garbage = Material { chain: b"-----BEGIN CERTIFICATE-----\nnot base64\n".to_vec(), ..material(&ca, &good) };
    assert!(matches!(tls.offer(&garbage), Err(TlsError::Certificate(_) | TlsError::NoCertificate)));
    let expired = material(&ca, &ca.expired_server(&["pool.ml.svc"]));
    let error = tls.offer(&expired).unwrap_err();
    assert!(matches!(error, TlsError::NotValidNow { .. }), "{error}");

    let report = tls.report().unwrap();
    assert_eq!(report.serving.map(|s| s.serial), Some(good.serial.clone()), "the good one stays");
    assert_eq!(report.error, Some(error.to_string()));
    let (_, seen) = handshake(&tls, client_config(&ca, None)).await;
    assert_eq!(seen, Some(good.serial), "still served");
    tls.offer(&material(&ca, &other)).unwrap();
    assert_eq!(tls.report().unwrap().error, None, "a good set clears the error");
}

#[test]
fn a_certificate_that_expires_in_force_stays_served_and_is_reported_expired_until_replaced() {
    let ca = Authority::new("test CA");
    // Whole seconds, as the certificate holds its end.
    let end = std::time::UNIX_EPOCH
        + Duration::from_secs(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs())
        + Duration::from_secs(3600);
    let ending = ca.server_valid_until(&["pool.ml.svc"], end);
    let tls = ServerTls::off();
    let info = tls.offer(&material(&ca, &ending)).unwrap();
    assert_eq!(info.expires_at(), end + Duration::from_secs(1), "valid through its notAfter second");

    let at = |moment| tls.report_at(moment).unwrap();
    assert!(!at(end).expired, "still valid in its last second");
    let after = at(end + Duration::from_secs(1));
    assert!(after.expired);
    assert_eq!((after.serving.map(|s| s.serial), after.error), (Some(ending.serial), None), "still served");

    let renewed = ca.server(&["pool.ml.svc"]);
    tls.offer(&material(&ca, &renewed)).unwrap();
    let rotated = at(end + Duration::from_secs(1));
    assert_eq!((rotated.serving.map(|s| s.serial), rotated.expired), (Some(renewed.serial), false), "renewed");
    assert!(!tls.report().unwrap().expired);
}

#[tokio::test]
async fn waiting_closes_connections_and_a_failed_first_set_keeps_waiting() {
    let ca = Authority::new("test CA");
    let tls = ServerTls::waiting();
    let (server, seen) = handshake(&tls, client_config(&ca, None)).await;
    assert_eq!((server, seen), (Err(REFUSED_TLS_NOT_LOADED), None));
    let off = ServerTls::off();
    let broken = Material { key: b"nonsense".to_vec(), ..material(&ca, &ca.server(&["pool.ml.svc"])) };
    assert!(off.offer(&broken).is_err());
    assert!(off.in_force().is_err(), "TLS was asked for: never plain text after a broken first set");
}

#[tokio::test]
async fn clients_must_trust_the_ca() {
    let (ca, stranger) = (Authority::new("test CA"), Authority::new("someone else"));
    let tls = ServerTls::off();
    tls.offer(&material(&ca, &ca.server(&["pool.ml.svc"]))).unwrap();
    let (server, seen) = handshake(&tls, client_config(&stranger, None)).await;
    assert_eq!((server, seen), (Err(REFUSED_TLS_HANDSHAKE), None));
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_from_the_client_ca_and_names_the_others() {
    let (ca, clients, stranger) = (Authority::new("test CA"), Authority::new("client CA"), Authority::new("other"));
    let tls = ServerTls::off();
    let with_clients =
        Material { client_ca: Some(clients.pem.clone().into()), ..material(&ca, &ca.server(&["pool.ml.svc"])) };
    tls.offer(&with_clients).unwrap();
    assert!(tls.report().unwrap().client_auth);

    let (server, _) = handshake(&tls, client_config(&ca, None)).await;
    assert_eq!(server, Err(REFUSED_TLS_HANDSHAKE), "no certificate");
    let (server, _) = handshake(&tls, client_config(&ca, Some(&stranger.client("search")))).await;
    assert_eq!(server, Err(REFUSED_TLS_HANDSHAKE), "a certificate from another CA");
    let (server, _) = handshake(&tls, client_config(&ca, Some(&clients.client("search")))).await;
    assert_eq!(server, Ok(Some("search".to_owned())));
}

#[test]
fn serials_read_as_openssl_prints_them() {
    assert_eq!(openssl_serial(&[0x00, 0xC0, 0xFF, 0xEE]), "C0FFEE", "DER's sign byte dropped");
    assert_eq!(openssl_serial(&[0x6B, 0x05]), "6B05");
    assert_eq!(openssl_serial(&[0x00]), "00");
    let issued = Authority::new("test CA").server(&["localhost"]);
    assert_eq!(serial_of(&issued.der), Some(issued.serial));
}

/// Two servers' sets, picked by the name asked for.
#[derive(Debug)]
struct TwoNames(Arc<Loaded>, Arc<Loaded>);

impl ServerNames for TwoNames {
    fn pick(&self, server_name: Option<&str>) -> Option<Arc<Loaded>> {
        match server_name? {
            "a.ml.svc" => Some(self.0.clone()),
            "b.ml.svc" => Some(self.1.clone()),
            _ => None,
        }
    }
}

type Served = Result<(bool, Option<ClientIdentity>, u8), &'static str>;

/// One connection to a port of `tls` over TCP, made by `client`: whether the server took it in
/// plain text, who its certificate names and the first byte it read; and what the client got.
async fn serve_once<F, T>(tls: &ServerTls, client: impl FnOnce(std::net::SocketAddr) -> F) -> (Served, T)
where
    F: Future<Output = T>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = async {
        let (tcp, _) = listener.accept().await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut stream = accept(tls, tcp, deadline).await?;
        let plain = matches!(stream, MaybeTls::Plain(_));
        let identity = stream.client().cloned();
        let mut first = [0; 1];
        let _ = stream.read(&mut first).await;
        Ok((plain, identity, first[0]))
    };
    tokio::join!(server, client(addr))
}

/// A TLS client of `addr` asking for `name`: the serial it was shown (kept open meanwhile).
async fn dial_at(
    addr: std::net::SocketAddr,
    name: &'static str,
    config: Arc<ClientConfig>,
) -> Option<(tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String)> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut stream = TlsConnector::from(config).connect(ServerName::try_from(name).unwrap(), tcp).await.ok()?;
    stream.write_all(b"x").await.ok()?;
    stream.flush().await.ok()?;
    let serial = serial_of(stream.get_ref().1.peer_certificates()?.first()?)?;
    Some((stream, serial))
}

#[tokio::test]
async fn a_port_by_name_serves_each_name_its_set_and_plain_text_beside_them() {
    let (ca_a, ca_b, clients) = (Authority::new("a CA"), Authority::new("b CA"), Authority::new("b clients"));
    let (a, b) = (ca_a.server(&["a.ml.svc"]), ca_b.server(&["b.ml.svc"]));
    let loaded_a = Arc::new(Loaded::check(&material(&ca_a, &a)).unwrap());
    let with_clients = Material { client_ca: Some(clients.pem.clone().into()), ..material(&ca_b, &b) };
    let loaded_b = Arc::new(Loaded::check(&with_clients).unwrap());
    let tls = ServerTls::by_server_name(Arc::new(TwoNames(loaded_a, loaded_b)));
    assert_eq!((tls.report(), tls.client().is_none()), (None, true), "no one set to report or call with");

    // In plain text: served in plain text, its first byte left for the server to read.
    let plain = |addr| async move {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"P").await.unwrap();
        tcp
    };
    let (served, _open) = serve_once(&tls, plain).await;
    assert_eq!(served, Ok((true, None, b'P')));
    // One that closes, or sends nothing in time, is the plain-text port's to close.
    let (served, ()) = serve_once(&tls, |addr| async move { drop(tokio::net::TcpStream::connect(addr).await) }).await;
    assert_eq!(served, Ok((true, None, 0)));

    // Each name gets its own set, as a client trusting only that server's CA checks.
    let (served, seen) = serve_once(&tls, |addr| dial_at(addr, "a.ml.svc", client_config(&ca_a, None))).await;
    assert_eq!((served, seen.map(|(_, serial)| serial)), (Ok((false, None, b'x')), Some(a.serial.clone())));
    let search = clients.client("search");
    let (served, seen) = serve_once(&tls, |addr| dial_at(addr, "b.ml.svc", client_config(&ca_b, Some(&search)))).await;
    assert_eq!(seen.map(|(_, serial)| serial), Some(b.serial.clone()));
    let identity = served.unwrap().1.unwrap();
    assert_eq!((identity.name.as_str(), identity.served.as_deref()), ("search", Some("b.ml.svc")));
    let (_, seen) = serve_once(&tls, |addr| dial_at(addr, "a.ml.svc", client_config(&ca_b, None))).await;
    assert!(seen.is_none(), "a's certificate is not from b's CA");

    // b's client CA is b's alone; a name no set is for, or none, is refused.
    let (served, _) = serve_once(&tls, |addr| dial_at(addr, "b.ml.svc", client_config(&ca_b, None))).await;
    assert_eq!(served.unwrap_err(), REFUSED_TLS_HANDSHAKE, "no client certificate");
    let (served, _) = serve_once(&tls, |addr| dial_at(addr, "c.ml.svc", client_config(&ca_a, None))).await;
    assert_eq!(served.unwrap_err(), REFUSED_TLS_UNKNOWN_NAME);
}
