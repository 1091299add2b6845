//! Every answer byte the gRPC port writes is charged to the process's memory budget
//! (`Use::Answers`) from when the stream's writer takes it from the answer's body until h2 has
//! written it to the socket, or dropped it with a reset stream: a client that never reads (a zero
//! flow-control window on many streams) holds no more than the budget lets it, and once the
//! budget is spent the answers it would hold are refused (RESOURCE_EXHAUSTED with a retry hint)
//! instead of piling up.
//!
//! How: h2 keeps the data it was handed, as [`AnswerBuf`]s, until the peer's window lets it
//! write them, and advances each as it writes it into the connection's socket (`corked`, which
//! holds a bounded few frames per connection); the buffer gives back what was written, and on
//! drop whatever was not. One [`Charge`] per stream, grown by each frame the writer takes.

use std::sync::Arc;

use bytes::{Buf, Bytes};

use crate::admission::memory::{Charge, LARGE_SHARE_PERCENT, MemoryBudget, OverBudget, SMALL_HOLDER, Use};
use crate::vocab::rpc::{AnswerSize, Rpc};

/// Health and reflection answers (what probes and tools call; small) are not charged: a spent
/// budget must not make the pod look unhealthy.
pub fn charged(path: &str) -> bool {
    !path.starts_with("/grpc.health.") && !path.starts_with("/grpc.reflection.")
}

/// Refuses a new call of `rpc` whose answer grows with its input's tokens (a vector per token,
/// [`AnswerSize::PerToken`]) when large holders have filled their share of the budget: its
/// answer would be refused once TEI had computed it. Every front that serves such a row (tei.v1,
/// tei-manager's wrapper) asks here before the call goes on.
pub fn room_for(memory: &MemoryBudget, rpc: &Rpc) -> Result<(), OverBudget> {
    if rpc.answer != AnswerSize::PerToken {
        return Ok(());
    }
    let share = (u128::from(memory.budget()) * u128::from(LARGE_SHARE_PERCENT) / 100) as u64;
    let charged = memory.charged();
    match charged.saturating_add(SMALL_HOLDER) <= share {
        true => Ok(()),
        false => Err(OverBudget { charged, budget: share }),
    }
}

/// A stream's answer charge: `prepaid` bytes charged before its headers were sent (a body that
/// knows its size: a unary answer), the rest grown frame by frame.
pub struct Answering {
    charge: Arc<Charge>,
    prepaid: u64,
}

impl Answering {
    /// Charges the `known` bytes of an answer before its headers: refused whole when they do not
    /// fit, so the call is answered RESOURCE_EXHAUSTED and nothing of it is held.
    pub fn start(memory: &Arc<MemoryBudget>, known: u64) -> Result<Self, OverBudget> {
        Ok(Self { charge: Arc::new(memory.charge(Use::Answers, known)?), prepaid: known })
    }

    /// `data`, charged until h2 writes it: from what was prepaid first, grown for the rest.
    pub fn take(&mut self, data: Bytes) -> Result<AnswerBuf, OverBudget> {
        let len = data.len() as u64;
        let from_prepaid = len.min(self.prepaid);
        self.prepaid -= from_prepaid;
        if len > from_prepaid {
            self.charge.grow(len - from_prepaid)?;
        }
        Ok(AnswerBuf { bytes: data, charge: Some(self.charge.clone()) })
    }

    /// The answer has ended: what was prepaid and never sent is given back.
    pub fn end(&mut self) {
        self.charge.shrink(std::mem::take(&mut self.prepaid));
    }
}

/// Bytes h2 holds for a stream until it writes them, charged while held (nothing for answers
/// that are not charged).
pub struct AnswerBuf {
    bytes: Bytes,
    charge: Option<Arc<Charge>>,
}

impl AnswerBuf {
    /// Bytes not charged (health and reflection, and the empty end of a stream).
    pub fn plain(bytes: Bytes) -> Self {
        Self { bytes, charge: None }
    }
}

impl Buf for AnswerBuf {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn chunk(&self) -> &[u8] {
        &self.bytes
    }

    fn advance(&mut self, written: usize) {
        self.bytes.advance(written);
        if let Some(charge) = &self.charge {
            charge.shrink(written as u64);
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        let taken = self.bytes.split_to(len);
        if let Some(charge) = &self.charge {
            charge.shrink(len as u64);
        }
        taken
    }
}

impl Drop for AnswerBuf {
    fn drop(&mut self) {
        if let Some(charge) = &self.charge {
            charge.shrink(self.bytes.len() as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_charged_until_written_or_dropped() {
        let memory = MemoryBudget::new(4 * SMALL_HOLDER, None);
        let mut answering = Answering::start(&memory, 1000).unwrap();
        let mut first = answering.take(Bytes::from(vec![1; 600])).unwrap();
        assert_eq!(memory.charged_for(Use::Answers), 1000, "within what was prepaid");
        let second = answering.take(Bytes::from(vec![2; 600])).unwrap();
        assert_eq!(memory.charged_for(Use::Answers), 1200, "grown past it");
        first.advance(100);
        assert_eq!(memory.charged_for(Use::Answers), 1100, "written: given back");
        assert_eq!(first.copy_to_bytes(500).len(), 500);
        drop(second);
        assert_eq!(memory.charged_for(Use::Answers), 0, "a dropped buffer gives back what it held");
        assert!(answering.take(Bytes::from(vec![3; 5 * SMALL_HOLDER as usize])).is_err(), "past the budget");
        answering.end();
        drop((first, answering));
        assert_eq!(memory.charged(), 0);
    }

    #[test]
    fn large_answers_are_refused_up_front_once_their_share_is_spent() {
        let memory = MemoryBudget::new(8 * SMALL_HOLDER, None);
        let row = |path| crate::vocab::rpc::find(path).unwrap();
        let embed_all = row("/tei.v1.Embed/EmbedAll");
        assert!(room_for(&memory, embed_all).is_ok());
        let _held = memory.charge(Use::Answers, 5 * SMALL_HOLDER + 1).unwrap();
        assert!(room_for(&memory, embed_all).is_err(), "three quarters would be passed");
        assert!(room_for(&memory, row("/tei.v1.Embed/EmbedAllStream")).is_err(), "its stream too");
        assert!(room_for(&memory, row("/tei.v1.Embed/Embed")).is_ok(), "small answers keep the rest");
    }
}
