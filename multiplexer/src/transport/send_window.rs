//! Writing within the peer's HTTP/2 flow-control window, the same on both sides of the sidecar:
//! a message is handed to `h2` once the peer grants some room for it (h2 buffers the rest of a
//! frame once some room is granted, as hyper does), so a peer that stops reading holds back the
//! writer instead of filling the sidecar's memory.

use std::future::poll_fn;

use bytes::Buf;
use h2::{Reason, SendStream};

/// Waits until the peer's window grants some room for `len` bytes.
pub async fn room<B: Buf>(to: &mut SendStream<B>, len: usize) -> Result<(), h2::Error> {
    to.reserve_capacity(len);
    while to.capacity() == 0 {
        match poll_fn(|cx| to.poll_capacity(cx)).await {
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error),
            None => return Err(h2::Error::from(Reason::CANCEL)),
        }
    }
    Ok(())
}
