//! HTTP/2 keepalive, the same on both sides of the sidecar: a PING every interval, and the
//! connection given up when one goes unanswered too long, so a peer whose node vanished fails
//! its calls instead of holding them.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::task::AbortOnDropHandle;

/// PINGs the peer every `interval`; resolves when one goes unanswered for `timeout`. Never, when
/// the connection gives no PING handle (it was taken already). The connection must be driven
/// beside this future, which only sends and waits.
pub async fn unanswered(pings: Option<h2::PingPong>, interval: Duration, timeout: Duration) {
    let Some(mut pings) = pings else { return std::future::pending().await };
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => return,
        }
    }
}

/// [`unanswered`] in a task of its own, for a connection's task, which wakes several times per
/// call and would otherwise poll the timer at every wake: the receiver resolves when a PING goes
/// unanswered, and the task ends when the handle is dropped.
pub fn watched(
    pings: Option<h2::PingPong>,
    interval: Duration,
    timeout: Duration,
) -> (AbortOnDropHandle<()>, oneshot::Receiver<()>) {
    let (tell, told) = oneshot::channel();
    let watch = tokio::spawn(async move {
        unanswered(pings, interval, timeout).await;
        let _ = tell.send(());
    });
    (AbortOnDropHandle::new(watch), told)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(20);
    /// Ample for a peer whose connection is driven, even on a loaded machine.
    const TIMEOUT: Duration = Duration::from_millis(300);

    /// A client connection to a server whose side is driven (`answering`) or left alone.
    async fn keepalive_against(answering: bool) -> bool {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut server = h2::server::handshake(server_io).await.unwrap();
            if answering {
                while server.accept().await.is_some() {}
            } else {
                std::future::pending::<()>().await;
            }
        });
        let (_send, mut connection) = h2::client::handshake(client_io).await.unwrap();
        let pings = connection.ping_pong();
        let outcome = tokio::select! {
            _ = &mut connection => false,
            () = unanswered(pings, INTERVAL, TIMEOUT) => true,
            () = tokio::time::sleep(INTERVAL * 4 + TIMEOUT * 2) => false,
        };
        server.abort();
        outcome
    }

    #[tokio::test]
    async fn a_peer_that_answers_is_kept_and_a_silent_one_given_up() {
        assert!(!keepalive_against(true).await, "answered PINGs keep the connection");
        assert!(keepalive_against(false).await, "an unanswered PING ends it");
    }
}
