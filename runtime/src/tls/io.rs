//! An accepted connection, in TLS or plain text, and who the client proved to be.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};

use super::{REFUSED_TLS_HANDSHAKE, ServerTls};

/// Who a client certificate, checked against the client CA, says its holder is. What a front
/// makes of it (a tenant) is the front's business.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The subject's common name, else the first DNS name.
    pub name: String,
    /// The client showed the server's own certificate, byte for byte: another replica of the same
    /// pool (they serve one Secret), passing a call on (whose tenant it carries along). A
    /// certificate merely named like the pool is a client like any other.
    pub sibling: bool,
}

/// The name a certificate gives its holder: the subject's common name, else its first DNS name.
pub fn certificate_name(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = X509Certificate::from_der(certificate).ok()?;
    if let Some(name) = parsed.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()) {
        return Some(name.to_owned());
    }
    let names = parsed.subject_alternative_name().ok().flatten()?;
    names.value.general_names.iter().find_map(|name| match name {
        GeneralName::DNSName(dns) => Some((*dns).to_owned()),
        _ => None,
    })
}

/// A connection as the server reads it: plain, or TLS with the client's identity when it showed
/// a certificate.
pub enum MaybeTls<Io> {
    Plain(Io),
    Tls { stream: Box<TlsStream<Io>>, client: Option<ClientIdentity> },
}

impl<Io> MaybeTls<Io> {
    /// Who the client certificate names; none in plain text or without mutual TLS.
    pub fn client(&self) -> Option<&ClientIdentity> {
        match self {
            Self::Plain(_) => None,
            Self::Tls { client, .. } => client.as_ref(),
        }
    }
}

/// `io` as the port's TLS wants it: as it is in plain text, after a handshake (which must end by
/// `deadline`) with TLS on. `Err` holds the refusal reason; the connection is then dropped.
pub async fn accept<Io>(tls: &ServerTls, io: Io, deadline: Instant) -> Result<MaybeTls<Io>, &'static str>
where
    Io: AsyncRead + AsyncWrite + Unpin,
{
    let Some(loaded) = tls.in_force()? else { return Ok(MaybeTls::Plain(io)) };
    match tokio::time::timeout_at(deadline, TlsAcceptor::from(loaded.server_config()).accept(io)).await {
        Ok(Ok(stream)) => {
            let shown = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
            let client = shown
                .and_then(certificate_name)
                .zip(shown)
                .map(|(name, shown)| ClientIdentity { sibling: loaded.is_own_certificate(shown), name });
            Ok(MaybeTls::Tls { stream: Box::new(stream), client })
        }
        Ok(Err(error)) => {
            tracing::debug!(%error, "TLS handshake failed");
            Err(REFUSED_TLS_HANDSHAKE)
        }
        Err(_) => {
            tracing::debug!("TLS handshake not finished within the header timeout");
            Err(REFUSED_TLS_HANDSHAKE)
        }
    }
}

#[cfg(feature = "tonic")]
impl tonic::transport::server::Connected for MaybeTls<tokio::net::TcpStream> {
    type ConnectInfo = Option<ClientIdentity>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.client().cloned()
    }
}

impl<Io: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<Io> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<Io: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<Io> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(io) => io.is_write_vectored(),
            Self::Tls { stream, .. } => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls { stream, .. } => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
