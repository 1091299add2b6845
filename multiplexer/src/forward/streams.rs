//! The two halves of a forwarded stream, as streams polled by the tasks that write them: no
//! channel of their own between the client and TEI, so a message costs one permit and two
//! polls, and backpressure runs straight through.
//!
//! [`Admitted`] is what goes upstream: each client message waits for its own permit before TEI
//! sees it. [`Answers`] is what goes back: each answer returns the permit of the message it
//! answers (TEI answers stream messages in order) and reports TEI's timing; a message refused
//! admission fails the call. [`Upstreamed`] is where the answers come from: the upstream's
//! direct connection, or tonic's channel when it has none.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt as _};
use tokio::sync::oneshot;
use tonic::metadata::MetadataMap;
use tonic::{Status, Streaming};

use crate::admission::{Cost, Permit};
use crate::error::Error;
use crate::error::Result;
use crate::forward::charge;
use crate::forward::pools::Pool;
use crate::forward::upstream::Exchange;
use crate::gate::request_meta::RequestMeta;
use crate::report::call::Call;
use crate::vocab::framing::MessageStream;
use crate::vocab::rpc::{Admit, Rpc};

/// Permits of a stream's messages in flight, oldest first.
pub type Held = Arc<Mutex<VecDeque<Permit>>>;

fn lock(held: &Held) -> std::sync::MutexGuard<'_, VecDeque<Permit>> {
    held.lock().unwrap_or_else(|p| p.into_inner())
}

/// A client's messages on their way upstream, each admitted on its own.
pub struct Admitted {
    inbound: MessageStream,
    pool: Arc<Pool>,
    /// Shared by each message's admission: a clone per message would copy its strings.
    meta: Arc<RequestMeta>,
    rpc: &'static Rpc,
    held: Held,
    waiting: Option<(Bytes, BoxFuture<'static, Result<Permit, Error>>)>,
    refused: Option<oneshot::Sender<Error>>,
    /// Every permit is held until the one answer at the end (a client stream): a message that
    /// could not fit beside the stream's own permits would wait for permits only its end frees.
    holds_all: bool,
}

impl Admitted {
    /// The stream to send upstream, the permits it takes, and where a refusal is reported.
    pub fn new(
        inbound: MessageStream,
        pool: Arc<Pool>,
        meta: RequestMeta,
        rpc: &'static Rpc,
    ) -> (Self, Held, oneshot::Receiver<Error>) {
        let (refused, refusal) = oneshot::channel();
        let held = Held::default();
        let meta = Arc::new(meta);
        let stream = Self {
            inbound,
            pool,
            meta,
            rpc,
            held: held.clone(),
            waiting: None,
            refused: Some(refused),
            holds_all: false,
        };
        (stream, held, refusal)
    }

    /// The same, for a client stream whose permits are all held until its one answer.
    pub fn holding_all(
        inbound: MessageStream,
        pool: Arc<Pool>,
        meta: RequestMeta,
        rpc: &'static Rpc,
    ) -> (Self, Held, oneshot::Receiver<Error>) {
        let (mut stream, held, refusal) = Self::new(inbound, pool, meta, rpc);
        stream.holds_all = true;
        (stream, held, refusal)
    }

    /// For a stream that holds every permit to its end: why `cost` can never be admitted beside
    /// what the stream already holds (more inputs or tokens than the pool ever has in flight).
    /// Waiting would last until the queue timeout, since only the stream's end frees its permits.
    fn never_fits(&self, cost: Cost) -> Option<Error> {
        let held = lock(&self.held);
        if !self.holds_all || held.is_empty() {
            return None;
        }
        let (inputs, tokens) =
            held.iter().map(Permit::cost).fold((u64::from(cost.inputs), u64::from(cost.tokens)), |(i, t), c| {
                (i + u64::from(c.inputs), t + u64::from(c.tokens))
            });
        let limits = self.pool.admission.snapshot().limits;
        let over_tokens = limits.max_in_flight_tokens.is_some_and(|max| tokens > max as u64);
        (inputs > limits.max_in_flight as u64 || over_tokens).then(|| {
            Error::Message(Status::out_of_range(format!(
                "{}: the stream's texts are held together until its one answer, and {} messages ({inputs} inputs, \
                 about {tokens} tokens) are more than pool {} takes in flight at once ({} inputs{}); send fewer",
                self.rpc.label,
                held.len() + 1,
                self.pool.spec.name,
                limits.max_in_flight,
                limits.max_in_flight_tokens.map(|t| format!(", {t} tokens")).unwrap_or_default(),
            )))
        })
    }
}

impl Stream for Admitted {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let this = &mut *self;
        loop {
            if let Some((_, admission)) = &mut this.waiting {
                let admitted = ready!(admission.as_mut().poll(cx));
                let (message, _) = this.waiting.take().expect("checked above");
                return match admitted {
                    Ok(permit) => {
                        lock(&this.held).push_back(permit);
                        Poll::Ready(Some(message))
                    }
                    Err(error) => {
                        // Ending the upstream stream here would let TEI answer part of it as if
                        // whole; the answers' side fails the call instead.
                        if let Some(refused) = this.refused.take() {
                            let _ = refused.send(error);
                        }
                        Poll::Ready(None)
                    }
                };
            }
            if this.refused.is_none() {
                return Poll::Ready(None);
            }
            let message = match ready!(this.inbound.as_mut().poll_next(cx)) {
                Some(Ok(message)) => message,
                // A message that cannot be read (too large, cut short) fails the call as a refused
                // one does: TEI must not answer the rest as if it were the whole stream.
                Some(Err(status)) => {
                    if let Some(refused) = this.refused.take() {
                        let _ = refused.send(Error::Message(status));
                    }
                    return Poll::Ready(None);
                }
                // The client ended its stream, or went away.
                None => return Poll::Ready(None),
            };
            if this.rpc.admit == Admit::Free {
                return Poll::Ready(Some(message));
            }
            let cost = charge::cost_of(&this.pool, this.rpc, &message);
            if let Some(error) = this.never_fits(cost) {
                if let Some(refused) = this.refused.take() {
                    let _ = refused.send(error);
                }
                return Poll::Ready(None);
            }
            let (pool, meta) = (this.pool.clone(), this.meta.clone());
            let admission = Box::pin(async move { charge::acquire(&pool, &meta, cost).await });
            this.waiting = Some((message, admission));
        }
    }
}

/// A streaming call's answers from upstream, message by message.
pub enum Upstreamed {
    Direct(Exchange),
    /// On tonic's channel: an upstream without a direct connection (the activator's balancer).
    Channel {
        pool: String,
        metadata: MetadataMap,
        answers: Streaming<Bytes>,
    },
}

impl Upstreamed {
    /// The answer's headers and trailers, once the rest of its messages are read: a status the
    /// upstream ends with is the call's error.
    pub async fn metadata(mut self) -> Result<MetadataMap> {
        while let Some(answer) = self.next().await {
            answer?;
        }
        match self {
            Self::Direct(exchange) => Ok(exchange.into_metadata()),
            Self::Channel { pool, metadata, mut answers } => {
                let trailers = answers.trailers().await.map_err(|status| Error::Upstream { pool, status })?;
                let mut headers = metadata.into_headers();
                headers.extend(trailers.map(MetadataMap::into_headers).unwrap_or_default());
                Ok(MetadataMap::from_headers(headers))
            }
        }
    }
}

impl Stream for Upstreamed {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match &mut *self {
            Self::Direct(exchange) => Pin::new(exchange).poll_next(cx),
            Self::Channel { pool, answers, .. } => Pin::new(answers).poll_next(cx).map(|answer| {
                answer.map(|answer| answer.map_err(|status| Error::Upstream { pool: pool.clone(), status }))
            }),
        }
    }
}

/// TEI's answers on their way back to the client; the call is counted when they end.
pub struct Answers {
    answers: Upstreamed,
    call: Call,
    held: Held,
    /// Each answer returns one permit (stream messages); otherwise all return at the end.
    per_message: bool,
    refusal: Option<oneshot::Receiver<Error>>,
    done: bool,
}

impl Answers {
    pub fn new(
        answers: Upstreamed,
        call: Call,
        held: Held,
        per_message: bool,
        refusal: Option<oneshot::Receiver<Error>>,
    ) -> Self {
        Self { answers, call, held, per_message, refusal, done: false }
    }
}

impl Stream for Answers {
    type Item = Result<Bytes, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(refusal) = &mut this.refusal
            && let Poll::Ready(refused) = Pin::new(refusal).poll(cx)
        {
            this.refusal = None;
            if let Ok(error) = refused {
                this.done = true;
                return Poll::Ready(Some(Err(this.call.fail(error).into())));
            }
        }
        match ready!(Pin::new(&mut this.answers).poll_next(cx)) {
            Some(Ok(answer)) => {
                let timing = charge::timing(this.call.rpc, &answer);
                if this.per_message {
                    let permit = lock(&this.held).pop_front();
                    charge::observe(permit.as_ref(), timing, None);
                } else {
                    // The permits return at the end; each answer is one message's.
                    charge::observe(lock(&this.held).front(), timing, Some(1));
                }
                this.call.observe(timing);
                Poll::Ready(Some(Ok(answer)))
            }
            Some(Err(error)) => {
                this.done = true;
                Poll::Ready(Some(Err(this.call.fail(error).into())))
            }
            None => {
                this.done = true;
                this.call.succeed();
                lock(&this.held).clear();
                Poll::Ready(None)
            }
        }
    }
}
