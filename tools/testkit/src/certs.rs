//! Certificates for TLS tests, made on the spot: a CA, and server and client certificates it
//! signs, in the PEM a `kubernetes.io/tls` Secret holds. Panics on failure, as a test wants.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SerialNumber,
};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// A certificate and its key, as PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    /// `tls.crt`: the leaf.
    pub chain_pem: String,
    /// `tls.key`.
    pub key_pem: String,
    /// The serial, in hex as `openssl x509 -serial` prints it.
    pub serial: String,
    /// The certificate, DER.
    pub der: Vec<u8>,
}

/// A CA that signs test certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    /// `ca.crt`.
    pub pem: String,
    next_serial: std::sync::atomic::AtomicU64,
}

impl Authority {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("a CA key");
        let pem = params.self_signed(&key).expect("a self-signed CA").pem();
        // Serials start from the clock, so two CAs of one test run do not hand out the same ones.
        let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs()) << 16;
        Self { issuer: Issuer::new(params, key), pem, next_serial: start.into() }
    }

    fn issue(&self, mut params: CertificateParams, usages: &[ExtendedKeyUsagePurpose]) -> Issued {
        let serial = self.next_serial.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Minimal bytes, the high bit clear: DER's encoding, which is what a reader shows.
        let bytes: Vec<u8> = serial.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        params.serial_number = Some(SerialNumber::from_slice(&bytes));
        params.extended_key_usages = usages.to_vec();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate().expect("a key");
        let certificate = params.signed_by(&key, &self.issuer).expect("a signed certificate");
        Issued {
            chain_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
            serial: bytes.iter().map(|b| format!("{b:02X}")).collect(),
            der: certificate.der().to_vec(),
        }
    }

    /// A server certificate for `names` (DNS names, or IP addresses such as `127.0.0.1`).
    pub fn server(&self, names: &[&str]) -> Issued {
        let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).expect("names");
        self.issue(params, &[ExtendedKeyUsagePurpose::ServerAuth])
    }

    /// A server certificate that is a client certificate too, as a pool's must be under mutual
    /// TLS: its sidecars show it when they call each other.
    pub fn peer(&self, names: &[&str]) -> Issued {
        let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).expect("names");
        self.issue(params, &[ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth])
    }

    /// The same, expired a day ago.
    pub fn expired_server(&self, names: &[&str]) -> Issued {
        let now = std::time::SystemTime::now();
        self.server_valid_until(names, now - std::time::Duration::from_secs(86_400))
    }

    /// A server certificate for `names` valid from two days before `not_after` until
    /// `not_after` (to the second, as X.509 holds it): one that expires while in force, when
    /// `not_after` is a moment ahead.
    pub fn server_valid_until(&self, names: &[&str], not_after: std::time::SystemTime) -> Issued {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).expect("names");
        params.not_before = (not_after - std::time::Duration::from_secs(2 * 86_400)).into();
        params.not_after = not_after.into();
        self.issue(params, &[ExtendedKeyUsagePurpose::ServerAuth])
    }

    /// A TLS client (rustls on ring) trusting only this CA, showing `certificate` when given and
    /// offering `alpn`.
    pub fn client_config(&self, certificate: Option<&Issued>, alpn: &[&[u8]]) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.pem.as_bytes()).expect("the CA's PEM")).expect("a CA root");
        let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots);
        let mut config = match certificate {
            None => builder.with_no_client_auth(),
            Some(issued) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(issued.chain_pem.as_bytes())
                        .collect::<Result<_, _>>()
                        .expect("the chain's PEM"),
                    PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("the key's PEM"),
                )
                .expect("a client certificate"),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A client certificate whose subject's common name is `name`.
    pub fn client(&self, name: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        self.issue(params, &[ExtendedKeyUsagePurpose::ClientAuth])
    }
}
