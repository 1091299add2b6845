//! Loopback addresses for servers a test starts.

use std::net::{Ipv4Addr, SocketAddr};

use crate::{Error, Result};

/// A loopback port nothing listens on right now, for a child process to bind. Another process
/// could take it first; in-process servers should bind port 0 instead and ask what they got.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(Error::FreePort)?;
    Ok(listener.local_addr().map_err(Error::FreePort)?.port())
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        std::net::TcpListener::bind(loopback(port)).expect("the port is free");
    }
}
