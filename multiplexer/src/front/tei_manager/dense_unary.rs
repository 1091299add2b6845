//! EmbedArrow (dense, unary) in a task of its own, so its answer can outlive the handler's
//! future: the task says whether the answer was held (today's path, whole) or is streamed
//! (`super::streamed`); the response's body holds the task and aborts it when dropped (a client
//! gone mid-stream gives every charge back).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http_body::Frame;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::AbortOnDropHandle;
use tonic::Status;

use super::arrow::{self, Options, Routed};
use super::error::ManagerError;
use super::streamed::{Escape, Item, Reply};
use super::{Context, answers};
use crate::admission::memory::Charge;
use crate::front::grpc::stream_body::trailers;
use crate::report::status;

/// EmbedArrow (dense, unary): served in a task of its own, its answer held or streamed.
pub async fn unary(
    cx: Arc<Context>,
    routed: Routed,
    options: Options,
    ipc_in: Bytes,
    charge: Arc<Charge>,
) -> http::Response<tonic::body::Body> {
    let (reply, replied) = oneshot::channel();
    let task = AbortOnDropHandle::new(tokio::spawn(run(cx, routed, options, ipc_in, charge, reply)));
    match replied.await {
        Ok(Reply::Held(Ok(answer))) => answers::held(answer),
        Ok(Reply::Held(Err(status))) => status::into_http(status),
        Ok(Reply::Streamed(rx)) => {
            let mut response = http::Response::new(tonic::body::Body::new(Streamed { rx, _task: task, done: false }));
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
            response
        }
        Err(_) => status::into_http(Status::internal("the call's work stopped before its answer")),
    }
}

async fn run(
    cx: Arc<Context>,
    mut routed: Routed,
    options: Options,
    ipc_in: Bytes,
    charge: Arc<Charge>,
    reply: oneshot::Sender<Reply>,
) {
    let mut escape = Escape::new(reply, cx.memory.clone());
    let result = arrow::batch_with(&cx, &mut routed, &options, ipc_in, &charge, Some(&mut escape)).await;
    drop(charge);
    match escape.reply.take() {
        Some(reply) => {
            let held = result.and_then(|answer| answer.ok_or_else(|| ManagerError::Build("no answer".into())));
            let _ = reply.send(Reply::Held(routed.finish(held).map_err(ManagerError::into_status)));
        }
        None => {
            // Its headers went out before its rows were looked up: the tally is a trailer.
            let status = match routed.finish(result) {
                Ok(_) => routed.cache.ended(),
                Err(error) => error.into_status(),
            };
            let _ = escape.tx.send(Item::End(status)).await;
        }
    }
}

/// The streamed answer's body: the pieces as the task makes them, then its status.
struct Streamed {
    rx: mpsc::Receiver<Item>,
    _task: AbortOnDropHandle<()>,
    done: bool,
}

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let status = match std::task::ready!(self.rx.poll_recv(cx)) {
            Some(Item::Data(bytes)) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
            Some(Item::End(status)) => status,
            None => Status::internal("the answer stopped before its end"),
        };
        self.done = true;
        Poll::Ready(Some(trailers(&status).map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}
