//! Loopback addresses for servers a test starts.

use std::net::{Ipv4Addr, SocketAddr};

use crate::{Error, Result};

/// A loopback port nothing listens on right now, for a child process to bind. Another process
/// could take it first; in-process servers should bind port 0 instead and ask what they got.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(Error::FreePort)?;
    Ok(listener.local_addr().map_err(Error::FreePort)?.port())
}

/// A loopback address where connections are refused for as long as this lives: its socket is
/// bound but not listening, so no other process can take the port meanwhile (a port bound and let
/// go, as [`free_port`]'s, could be taken and answer).
#[derive(Debug)]
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl ClosedPort {
    pub fn new() -> Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4().map_err(Error::FreePort)?;
        socket.bind(loopback(0)).map_err(Error::FreePort)?;
        let addr = socket.local_addr().map_err(Error::FreePort)?;
        Ok(Self { _socket: socket, addr })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_refuses_connections_and_cannot_be_bound_while_held() {
        let closed = ClosedPort::new().unwrap();
        let refused = tokio::net::TcpStream::connect(closed.addr()).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(std::net::TcpListener::bind(closed.addr()).is_err(), "the port is held");
    }

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        std::net::TcpListener::bind(loopback(port)).expect("the port is free");
    }
}
