//! A certificate set as a Secret (or files) holds it, checked whole and turned into the rustls
//! settings of both sides: serving, and calling peers.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerSessionMemoryCache, WebPkiClientVerifier};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use x509_parser::prelude::{FromDer as _, X509Certificate};

/// Sessions a server remembers for resumption (TLS 1.2 ids; TLS 1.3 uses tickets).
const RESUMABLE_SESSIONS: usize = 4096;

/// PEM text, as `kubernetes.io/tls` Secrets hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Material {
    /// `tls.crt`: the chain, leaf first.
    pub chain: Vec<u8>,
    /// `tls.key`.
    pub key: Vec<u8>,
    /// `ca.crt`: whom to trust when calling peers; none: the system's roots.
    pub ca: Option<Vec<u8>>,
    /// Mutual TLS: clients must show a certificate from this bundle.
    pub client_ca: Option<Vec<u8>>,
}

/// Why a set was not put in force.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the certificate (tls.crt) holds no PEM certificate")]
    NoCertificate,
    #[error("the certificate (tls.crt): {0}")]
    Certificate(String),
    #[error("the private key (tls.key): {0}")]
    Key(String),
    #[error("the private key (tls.key) is not the key of the certificate (tls.crt)")]
    KeyMismatch,
    #[error("the certificate {serial} is valid from {not_before} until {not_after}, not now")]
    NotValidNow { serial: String, not_before: String, not_after: String },
    #[error("the CA bundle (ca.crt): {0}")]
    Ca(String),
    #[error("the client CA bundle: {0}")]
    ClientCa(String),
    #[error("TLS settings: {0}")]
    Settings(String),
}

/// What people look a certificate up by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateInfo {
    /// Hex, as `openssl x509 -serial` prints it.
    pub serial: String,
    pub subject: String,
    /// RFC 3339.
    pub not_after: String,
    pub not_after_unix: i64,
}

impl CertificateInfo {
    /// The first instant the certificate is no longer valid: the second after its `notAfter`
    /// (X.509 validity includes `notAfter` itself, and peers check it to the second).
    pub fn expires_at(&self) -> SystemTime {
        let after = self.not_after_unix.saturating_add(1);
        let offset = Duration::from_secs(after.unsigned_abs());
        if after >= 0 { UNIX_EPOCH + offset } else { UNIX_EPOCH - offset }
    }

    /// Whether the certificate has expired at `now`: every peer that checks it refuses it.
    pub fn expired_at(&self, now: SystemTime) -> bool {
        now >= self.expires_at()
    }
}

/// A checked set: what new handshakes use.
#[derive(Debug)]
pub struct Loaded {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    info: CertificateInfo,
    /// The name the certificate gives its holder, as a client certificate's is read.
    name: Option<String>,
    /// The served certificate itself: a client showing exactly this one is a sibling replica.
    leaf: CertificateDer<'static>,
    client_auth: bool,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn rfc3339(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| unix.to_string())
}

fn certificates(pem: &[u8], error: fn(String) -> TlsError) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| error(e.to_string()))
}

fn roots(pem: &[u8], error: fn(String) -> TlsError) -> Result<Arc<RootCertStore>, TlsError> {
    let certificates = certificates(pem, error)?;
    if certificates.is_empty() {
        return Err(error("holds no PEM certificate".into()));
    }
    let mut store = RootCertStore::empty();
    for certificate in certificates {
        store.add(certificate).map_err(|e| error(e.to_string()))?;
    }
    Ok(Arc::new(store))
}

/// The system's roots, for peers whose certificates come from a public CA.
fn system_roots() -> Arc<RootCertStore> {
    let mut store = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    store.add_parsable_certificates(found.certs);
    Arc::new(store)
}

/// A DER INTEGER's content as `openssl x509 -serial` prints it: without the zero byte DER puts
/// before a first byte with its top bit set (00C0FFEE is printed C0FFEE).
pub fn openssl_serial(der_integer: &[u8]) -> String {
    let significant = match der_integer {
        [0, rest @ ..] if !rest.is_empty() => rest,
        all => all,
    };
    significant.iter().map(|byte| format!("{byte:02X}")).collect()
}

/// The serial of a DER certificate, as `openssl x509 -serial` prints it.
pub fn serial_of(certificate: &[u8]) -> Option<String> {
    let (_, parsed) = X509Certificate::from_der(certificate).ok()?;
    Some(openssl_serial(parsed.raw_serial()))
}

fn describe(leaf: &CertificateDer<'_>) -> Result<CertificateInfo, TlsError> {
    let (_, parsed) = X509Certificate::from_der(leaf).map_err(|e| TlsError::Certificate(e.to_string()))?;
    let validity = parsed.validity();
    let serial = openssl_serial(parsed.raw_serial());
    let info = CertificateInfo {
        serial,
        subject: parsed.subject().to_string(),
        not_after: rfc3339(validity.not_after.timestamp()),
        not_after_unix: validity.not_after.timestamp(),
    };
    if !validity.is_valid() {
        return Err(TlsError::NotValidNow {
            serial: info.serial,
            not_before: rfc3339(validity.not_before.timestamp()),
            not_after: info.not_after,
        });
    }
    Ok(info)
}

fn settings(error: rustls::Error) -> TlsError {
    match error {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch,
        other => TlsError::Settings(other.to_string()),
    }
}

impl Loaded {
    /// Checks `material` whole and builds both sides' settings from it.
    pub fn check(material: &Material) -> Result<Self, TlsError> {
        let chain = certificates(&material.chain, TlsError::Certificate)?;
        let leaf = chain.first().ok_or(TlsError::NoCertificate)?;
        let info = describe(leaf)?;
        let name = super::certificate_name(leaf);
        let leaf = leaf.clone().into_owned();
        let key = PrivateKeyDer::from_pem_slice(&material.key).map_err(|e| TlsError::Key(e.to_string()))?;
        let provider = provider();

        let versions = |e: rustls::Error| TlsError::Settings(e.to_string());
        let server = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions();
        let server = server.map_err(versions)?;
        let server = match &material.client_ca {
            Some(pem) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(roots(pem, TlsError::ClientCa)?, provider.clone())
                        .build()
                        .map_err(|e| TlsError::ClientCa(e.to_string()))?;
                server.with_client_cert_verifier(verifier)
            }
            None => server.with_no_client_auth(),
        };
        let mut server = server.with_single_cert(chain.clone(), key.clone_key()).map_err(settings)?;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        server.session_storage = ServerSessionMemoryCache::new(RESUMABLE_SESSIONS);
        server.ticketer = rustls::crypto::ring::Ticketer::new().map_err(settings)?;

        let trusted = match &material.ca {
            Some(pem) => roots(pem, TlsError::Ca)?,
            None => system_roots(),
        };
        let client = ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions();
        let client = client.map_err(versions)?.with_root_certificates(trusted);
        // The own certificate goes with every call to a peer, for peers that require one.
        let mut client = client.with_client_auth_cert(chain, key).map_err(settings)?;
        client.alpn_protocols = vec![b"h2".to_vec()];

        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
            info,
            name,
            leaf,
            client_auth: material.client_ca.is_some(),
        })
    }

    pub fn info(&self) -> &CertificateInfo {
        &self.info
    }

    /// The name the served certificate gives its holder (common name, else first DNS name).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether `shown` is the very certificate served here (byte for byte): what a sibling
    /// replica of the same pool, which serves the same Secret, shows as its client certificate. A
    /// name proves nothing: a client CA may issue any name to anyone.
    pub fn is_own_certificate(&self, shown: &CertificateDer<'_>) -> bool {
        self.leaf.as_ref() == shown.as_ref()
    }

    pub fn client_auth(&self) -> bool {
        self.client_auth
    }

    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}
