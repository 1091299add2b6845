//! An accepted connection, in TLS or plain text, and who the client proved to be.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{LazyConfigAcceptor, TlsAcceptor};
use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};

use super::{Loaded, Mode, REFUSED_TLS_HANDSHAKE, REFUSED_TLS_UNKNOWN_NAME, ServerTls};

/// The first byte of a TLS handshake record: what a client that opens in TLS sends first.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A connection whose first byte can be read without taking it: how a port that serves TLS and
/// plain text side by side tells them apart.
pub trait PeekFirst {
    /// The first byte the client sent, left in place; an error when the connection closed first.
    fn peek_first(&self) -> impl Future<Output = io::Result<u8>> + Send;
}

impl PeekFirst for TcpStream {
    async fn peek_first(&self) -> io::Result<u8> {
        let mut first = [0; 1];
        match self.peek(&mut first).await? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            _ => Ok(first[0]),
        }
    }
}

/// In-memory pipes (tests) cannot be peeked: a port that picks by name serves them in plain text.
impl PeekFirst for tokio::io::DuplexStream {
    async fn peek_first(&self) -> io::Result<u8> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

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
    /// On a port that picks its certificate by name ([`ServerTls::by_server_name`]), the server
    /// name the client asked for, whose set (and client CA) checked this certificate; none on a
    /// port with one set.
    pub served: Option<String>,
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
    Io: AsyncRead + AsyncWrite + Unpin + PeekFirst,
{
    if let Mode::ByName(names) = tls.mode() {
        // A client that opens with anything but a TLS handshake (or sends nothing, or closes) is
        // the plain-text port's to serve or to close, as it would be on a port without TLS.
        match tokio::time::timeout_at(deadline, io.peek_first()).await {
            Ok(Ok(TLS_HANDSHAKE_RECORD)) => {}
            _ => return Ok(MaybeTls::Plain(io)),
        }
        return match tokio::time::timeout_at(deadline, accept_by_name(&*names, io)).await {
            Ok(accepted) => accepted,
            Err(_) => {
                tracing::debug!("TLS handshake not finished within the header timeout");
                Err(REFUSED_TLS_HANDSHAKE)
            }
        };
    }
    let Some(loaded) = tls.in_force()? else { return Ok(MaybeTls::Plain(io)) };
    match tokio::time::timeout_at(deadline, TlsAcceptor::from(loaded.server_config()).accept(io)).await {
        Ok(Ok(stream)) => Ok(tls_stream(stream, &loaded, None)),
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

/// A port that picks by name, for a client that opened with a TLS handshake: the set `names`
/// picks for the name its hello asks for.
async fn accept_by_name<Io>(names: &dyn super::ServerNames, io: Io) -> Result<MaybeTls<Io>, &'static str>
where
    Io: AsyncRead + AsyncWrite + Unpin,
{
    let started = match LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io).await {
        Ok(started) => started,
        Err(error) => {
            tracing::debug!(%error, "TLS hello unreadable");
            return Err(REFUSED_TLS_HANDSHAKE);
        }
    };
    let asked = started.client_hello().server_name().map(str::to_owned);
    let Some(loaded) = names.pick(asked.as_deref()) else {
        tracing::debug!(server_name = ?asked, "no certificate for the server name asked for");
        return Err(REFUSED_TLS_UNKNOWN_NAME);
    };
    match started.into_stream(loaded.server_config()).await {
        Ok(stream) => Ok(tls_stream(stream, &loaded, asked)),
        Err(error) => {
            tracing::debug!(%error, server_name = ?asked, "TLS handshake failed");
            Err(REFUSED_TLS_HANDSHAKE)
        }
    }
}

/// A finished handshake with `loaded`, and who the client certificate, if any, names.
fn tls_stream<Io>(stream: TlsStream<Io>, loaded: &Loaded, served: Option<String>) -> MaybeTls<Io> {
    let shown = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
    let client = shown.and_then(certificate_name).zip(shown).map(|(name, shown)| ClientIdentity {
        sibling: loaded.is_own_certificate(shown),
        name,
        served,
    });
    MaybeTls::Tls { stream: Box::new(stream), client }
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
