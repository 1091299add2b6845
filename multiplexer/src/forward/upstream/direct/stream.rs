//! Streaming calls on the direct connection: the caller's messages go up as its stream yields
//! them, each within the upstream's window, from a task of their own (as hyper's client pipes a
//! request body), so a client that reads its answers only after sending everything cannot stall
//! its own stream; the answer's messages come back to whoever polls [`Exchange`], the client's
//! stream task, with no task or channel between. What tonic's channel and its streaming decoder
//! did is done the same way: the upstream's statuses pass on as they came, an answer message
//! larger than `--max-message-bytes` is OUT_OF_RANGE, and an answer cut off inside a message is
//! INTERNAL.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures::{FutureExt as _, Stream, StreamExt as _};
use h2::{RecvStream, SendStream};
use http::{HeaderMap, StatusCode};
use tokio_util::task::AbortOnDropHandle;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use super::{Direct, carried_status, from_http_status};
use crate::error::{Error, Result};
use crate::transport::send_window;
use crate::vocab::framing::{self, Messages, Side};

impl Direct {
    /// Opens a streaming call of `path`: the request's messages are sent as they come, and the
    /// answer's come back on the [`Exchange`] once the upstream has answered with its headers.
    pub async fn stream<S>(
        &self,
        pool: &str,
        path: &'static str,
        request: Request<S>,
        max_message: usize,
    ) -> Result<Exchange>
    where
        S: Stream<Item = Bytes> + Send + Unpin + 'static,
    {
        let (metadata, _, messages) = request.into_parts();
        let (answer, to) = self.start(pool, path, metadata).await?;
        // Stopped when the exchange is dropped: a call that ends (answered, failed, or its client
        // gone) takes its unsent messages, and their permits, with it.
        let sending = AbortOnDropHandle::new(tokio::spawn(send(messages, to)));
        let response = answer.await.map_err(|error| self.failed(pool, error))?;
        let upstream = Upstream { pool: pool.to_owned(), url: self.url.clone() };
        let (parts, body) = response.into_parts();
        // Trailers-only: no message follows, and the status (OK: no answers) is in the headers.
        let state = match carried_status(&parts.headers) {
            Some(Ok(())) => State::Done,
            Some(Err(status)) => return Err(upstream.status(status)),
            None if parts.status != StatusCode::OK => {
                return Err(upstream.status(from_http_status(parts.status, parts.headers)));
            }
            None => State::Messages(body),
        };
        let messages = Messages::new(max_message, Side::Answer);
        Ok(Exchange { upstream, state, messages, headers: parts.headers, _sending: sending })
    }
}

/// Sends the messages as they come (those ready together in one data frame), each frame once the
/// upstream's window has room for it, then ends the stream. A stream that breaks ends this; the
/// answer's side tells the call why.
async fn send<S>(mut messages: S, mut to: SendStream<Bytes>)
where
    S: Stream<Item = Bytes> + Unpin,
{
    let mut ended = false;
    while !ended {
        let Some(message) = messages.next().await else { break };
        let mut frames = BytesMut::new();
        framing::frame_into(&mut frames, &message);
        while frames.len() < framing::GATHER_BYTES {
            match messages.next().now_or_never() {
                Some(Some(more)) => framing::frame_into(&mut frames, &more),
                Some(None) => {
                    ended = true;
                    break;
                }
                // Nothing more ready now.
                None => break,
            }
        }
        if send_window::room(&mut to, frames.len()).await.is_err() || to.send_data(frames.freeze(), false).is_err() {
            return;
        }
    }
    let _ = to.send_data(Bytes::new(), true);
}

/// Who answered, for the call's errors.
struct Upstream {
    pool: String,
    url: String,
}

impl Upstream {
    fn status(&self, status: Status) -> Error {
        Error::Upstream { pool: self.pool.clone(), status }
    }

    fn broken(&self, error: h2::Error) -> Error {
        super::broken(&self.pool, &self.url, error)
    }
}

enum State {
    Messages(RecvStream),
    Trailers(RecvStream),
    Done,
}

/// A streaming call's answers, message by message; the upstream's failure, or its status, ends
/// them with an error.
pub struct Exchange {
    upstream: Upstream,
    state: State,
    messages: Messages,
    /// The answer's headers, then its trailers too: its metadata.
    headers: HeaderMap,
    _sending: AbortOnDropHandle<()>,
}

impl Exchange {
    /// The answer's headers and trailers, as tonic's client gives a client stream's metadata.
    pub fn into_metadata(self) -> MetadataMap {
        MetadataMap::from_headers(self.headers)
    }

    fn fail(&mut self, error: Error) -> Poll<Option<Result<Bytes>>> {
        self.state = State::Done;
        Poll::Ready(Some(Err(error)))
    }
}

impl Stream for Exchange {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Messages(body) => {
                    match this.messages.take() {
                        Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                        Ok(None) => {}
                        Err(status) => {
                            let error = this.upstream.status(status);
                            return this.fail(error);
                        }
                    }
                    match ready!(body.poll_data(cx)) {
                        Some(Ok(data)) => {
                            // Fails only once the stream is gone, which the next poll reports.
                            let _ = body.flow_control().release_capacity(data.len());
                            this.messages.push(data);
                        }
                        Some(Err(error)) => {
                            let error = this.upstream.broken(error);
                            return this.fail(error);
                        }
                        None => {
                            let State::Messages(body) = std::mem::replace(&mut this.state, State::Done) else {
                                unreachable!("matched above")
                            };
                            this.state = State::Trailers(body);
                        }
                    }
                }
                State::Trailers(body) => {
                    let trailers = match ready!(body.poll_trailers(cx)) {
                        Ok(trailers) => trailers,
                        Err(error) => {
                            let error = this.upstream.broken(error);
                            return this.fail(error);
                        }
                    };
                    this.state = State::Done;
                    if let Some(trailers) = trailers {
                        if let Some(Err(status)) = carried_status(&trailers) {
                            return Poll::Ready(Some(Err(this.upstream.status(status))));
                        }
                        this.headers.extend(trailers);
                    }
                    if this.messages.is_cut_short() {
                        return Poll::Ready(Some(Err(this.upstream.status(framing::cut_short()))));
                    }
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
mod tests;
