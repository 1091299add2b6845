//! A batch's sub-batches in an ordered window: at most `limit` in flight or answered and not yet
//! taken, answered in row order, as `bulk::Bulk::run`'s `buffered` window, but with the sub-batches
//! in flight driven apart from their taking ([`Window::progress`]): a streamed answer whose reader
//! stalls stops taking answers, and the sub-batches already in flight still finish and give their
//! admission back (a `buffered` stream not polled holds its in-flight grants, and the pool's share
//! with them, for as long as the reader sleeps). Their answers wait here, charged, and no new
//! sub-batch starts until one is taken.

use std::collections::VecDeque;
use std::task::Poll;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;

pub struct Window<'a, I: Iterator, T> {
    source: I,
    make: Box<dyn FnMut(I::Item) -> BoxFuture<'a, T> + Send + 'a>,
    running: FuturesOrdered<BoxFuture<'a, T>>,
    /// Answered, in order, before any still running.
    ready: VecDeque<T>,
    limit: usize,
}

impl<'a, I: Iterator, T> Window<'a, I, T> {
    pub fn new(source: I, limit: usize, make: impl FnMut(I::Item) -> BoxFuture<'a, T> + Send + 'a) -> Self {
        Self {
            source,
            make: Box::new(make),
            running: FuturesOrdered::new(),
            ready: VecDeque::new(),
            limit: limit.max(1),
        }
    }

    /// Starts sub-batches until the window is full or the source is done.
    fn fill(&mut self) {
        while self.running.len() + self.ready.len() < self.limit {
            match self.source.next() {
                Some(item) => self.running.push_back((self.make)(item)),
                None => break,
            }
        }
    }

    /// The next sub-batch's answer, in order; `None` once all are taken.
    pub async fn next(&mut self) -> Option<T> {
        self.fill();
        let next = match self.ready.pop_front() {
            Some(ready) => Some(ready),
            None => self.running.next().await,
        };
        self.fill();
        next
    }

    /// Drives the sub-batches in flight, keeping their answers in order; never returns (used
    /// beside a wait for the reader, in a `select`). Cancelled at any point, nothing is lost.
    pub async fn progress(&mut self) {
        futures::future::poll_fn(|cx| {
            while let Poll::Ready(Some(answered)) = self.running.poll_next_unpin(cx) {
                self.ready.push_back(answered);
            }
            Poll::<()>::Pending
        })
        .await
    }
}
