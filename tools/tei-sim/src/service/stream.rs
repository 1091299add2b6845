//! Streaming calls, handled like TEI's: each message waits for a slot (instead of being refused),
//! messages run concurrently, and answers come back in the order the messages were sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::{Admitted, SHUTTING_DOWN, Sim};

pub(crate) type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// How many messages of one stream may be in progress at once (TEI's default).
const MAX_PARALLEL_STREAM_REQUESTS: usize = 1024;

impl Sim {
    /// Runs `f` for every message of a bidirectional inference stream.
    pub(crate) fn bidi<Req, Resp, F, Fut>(&self, mut inbound: Streaming<Req>, f: F) -> ResponseStream<Resp>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        F: Fn(Admitted, Req) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resp, Status>> + Send + 'static,
    {
        let (order_tx, order_rx) =
            mpsc::channel::<oneshot::Receiver<Result<Resp, Status>>>(MAX_PARALLEL_STREAM_REQUESTS);
        let sim = self.clone();
        let f = Arc::new(f);
        // The client's messages are read as they arrive, whether or not a slot is free: a reader
        // that stops while messages wait for slots leaves their frames in h2, which closes the
        // connection once too many small ones wait (GOAWAY "too_many_data_frames"); TEI, on an
        // h2 without that bound, answers a client streaming 100,000 small messages whole. A reader
        // late for want of CPU (a busy machine) is covered by the server's windows (server.rs:
        // STREAM_WINDOW, CONNECTION_WINDOW): the client waits on flow control before that bound.
        let (read_tx, mut read_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            loop {
                let message = inbound.message().await;
                let last = !matches!(message, Ok(Some(_)));
                if read_tx.send(message).is_err() || last {
                    break;
                }
            }
        });
        tokio::spawn(async move {
            let _reader = tokio_util::task::AbortOnDropHandle::new(reader);
            loop {
                let message = tokio::select! {
                    m = read_rx.recv() => m.unwrap_or(Ok(None)),
                    () = order_tx.closed() => break,
                    () = sim.state.shutdown.cancelled() => break,
                };
                let request = match message {
                    Ok(Some(request)) => request,
                    // The client finished sending, or its stream broke: answers already promised
                    // still go out.
                    Ok(None) | Err(_) => break,
                };
                let (mut answer_tx, answer_rx) = oneshot::channel();
                if order_tx.send(answer_rx).await.is_err() {
                    break;
                }
                let received = match sim.receive(true) {
                    Ok(received) => received,
                    Err(status) => {
                        sim.record::<()>(&Err(status.clone()), true);
                        let _ = answer_tx.send(Err(status));
                        break;
                    }
                };
                // Slots are taken in message order; a caller that leaves stops the wait.
                let slot = tokio::select! {
                    slot = sim.admit() => slot,
                    () = answer_tx.closed() => break,
                };
                let slot = match slot {
                    Ok(slot) => slot,
                    Err(status) => {
                        let _ = answer_tx.send(Err(status));
                        break;
                    }
                };
                let admitted = Admitted { sim: sim.clone(), _slot: slot, received };
                let work = f(admitted, request);
                let sim = sim.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        result = work => {
                            sim.record(&result, true);
                            let _ = answer_tx.send(result);
                        }
                        // Dropping the work drops its slot and its place in the device queue.
                        () = answer_tx.closed() => {}
                    }
                });
            }
        });
        Box::pin(
            ReceiverStream::new(order_rx)
                .then(|answer| async move { answer.await.unwrap_or_else(|_| Err(Status::unavailable(SHUTTING_DOWN))) }),
        )
    }

    /// Answers every message of a stream that needs neither a slot nor the device.
    pub(crate) fn direct_stream<Req, Resp, F>(&self, inbound: Streaming<Req>, f: F) -> ResponseStream<Resp>
    where
        Req: Send + 'static,
        Resp: Send + 'static,
        F: Fn(Req) -> Result<Resp, Status> + Send + 'static,
    {
        let sim = self.clone();
        let shutdown = self.state.shutdown.clone().cancelled_owned();
        Box::pin(
            inbound
                .map(move |message| {
                    let request = message?;
                    let result = sim.receive(false).and_then(|_| f(request));
                    sim.record(&result, false);
                    result
                })
                .take_until(shutdown),
        )
    }
}
