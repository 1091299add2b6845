//! EmbedArrow's dense answer too large to hold (over the largest held message, or over what the
//! memory budget has room for) streamed as its one gRPC message: its length is known once the
//! first sub-batch tells the vector size (the rows, and which of them fail here, are known
//! before), so the gRPC prefix, the response's field header and the IPC's schema and batch
//! metadata (`super::layout`) go first, then the values in row order as the sub-batches are
//! answered, then the `error` column and the end-of-stream marker. The header says every row sent
//! to TEI is answered: a row TEI refuses after it (or any other failure) ends the call with its
//! status in the trailers; the client sees the error, never a wrong answer.
//!
//! Memory: the window's answers (charged as decoded, `super::arrow`) and each piece queued for the
//! socket (charged until h2 drops its bytes, as held answers are in `super::answers`); nothing else
//! grows with the rows but a bit a row and the request's texts. A reader that stops reading stalls
//! the call under h2's flow control: at most [`QUEUE`] pieces wait here, one in h2.
//!
//! The call that writes it runs in a task of its own (`super::dense_unary`).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::answers::Answer;
use super::error::ManagerError;
use super::ipc::{Dtype, Texts};
use super::layout::{self, Layout, Shape};
use crate::admission::memory::{Charge, MemoryBudget, Use};
use crate::error::Error;
use crate::vocab::framing::PREFIX;

/// Pieces of a streamed answer made and not yet taken by the body: with the one h2 holds, what a
/// stalled reader keeps (each at most a sub-batch's vectors).
pub const QUEUE: usize = 2;

/// What the body is sent.
pub enum Item {
    Data(Bytes),
    End(Status),
}

/// What the call's task tells the handler once it knows.
pub enum Reply {
    Held(Result<Answer, Status>),
    Streamed(mpsc::Receiver<Item>),
}

/// How a batch's answer may leave as a stream: the handler's reply, and the body's queue.
pub struct Escape {
    pub reply: Option<oneshot::Sender<Reply>>,
    pub tx: mpsc::Sender<Item>,
    rx: Option<mpsc::Receiver<Item>>,
    memory: Arc<MemoryBudget>,
}

impl Escape {
    /// An answer's way out: `reply` tells the handler whether it is held or streamed.
    pub fn new(reply: oneshot::Sender<Reply>, memory: Arc<MemoryBudget>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        Self { reply: Some(reply), tx, rx: Some(rx), memory }
    }
}

/// Bytes charged to the budget until h2 drops them.
struct Piece {
    bytes: Vec<u8>,
    _charge: Charge,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Whether a held answer's refusal is one a streamed answer avoids.
pub fn streams_past(refused: &ManagerError) -> bool {
    matches!(refused, ManagerError::AnswerTooLarge { .. } | ManagerError::Call(Error::Memory(_)))
}

/// A streamed answer being written, row by row.
pub struct Writer<'a> {
    layout: Layout,
    texts: &'a Texts,
    /// TEI's reasons for rows it refused before the header was written.
    refused: Vec<(usize, String)>,
    dim: usize,
    dtype: Dtype,
    /// The next row whose values are written.
    row: usize,
    out: Vec<u8>,
    tx: mpsc::Sender<Item>,
    memory: Arc<MemoryBudget>,
}

impl<'a> Writer<'a> {
    /// The answer's head sent, the handler told the answer is streamed. `refused`: TEI's reasons
    /// for rows it refused so far (all before any answered row).
    pub async fn open(
        escape: &mut Escape,
        texts: &'a Texts,
        (dtype, lz4): (Dtype, bool),
        dim: usize,
        refused: Vec<(usize, String)>,
    ) -> Result<Writer<'a>, ManagerError> {
        let rows = texts.len();
        let mut tei = refused.iter().peekable();
        let (mut failed, mut reasons) = (0, 0);
        for row in 0..rows {
            let reason = match tei.peek() {
                Some((at, reason)) if *at == row => tei.next().map(|_| reason.len()),
                _ => texts.refused_here(row).map(str::len),
            };
            if let Some(len) = reason {
                failed += 1;
                reasons += len;
            }
        }
        if i32::try_from(reasons).is_err() {
            return Err(ManagerError::AnswerTooLarge { bytes: reasons, limit: i32::MAX as usize });
        }
        let shape = Shape { rows, dim, dtype, failed, reasons, lz4 };
        let layout = Layout::new(&shape)?;
        // EmbedArrowResponse { arrow_ipc = 1 }: its key and length, within the gRPC prefix's u32.
        let mut field = Vec::with_capacity(11);
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut field);
        prost::encoding::encode_varint(layout.total, &mut field);
        let message = layout.total + field.len() as u64;
        let Ok(length) = u32::try_from(message) else {
            let bytes = usize::try_from(message).unwrap_or(usize::MAX);
            return Err(ManagerError::AnswerTooLarge { bytes, limit: u32::MAX as usize });
        };
        let (Some(reply), Some(rx)) = (escape.reply.take(), escape.rx.take()) else {
            return Err(ManagerError::Build("an answer streamed twice".into()));
        };
        if reply.send(Reply::Streamed(rx)).is_err() {
            return Err(ManagerError::Build("the call was gone".into()));
        }
        let mut out = Vec::with_capacity(PREFIX + field.len() + layout.head.len() + rows.div_ceil(8) + 16);
        out.push(0);
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&field);
        out.extend_from_slice(&layout.head);
        let mut writer = Writer {
            layout,
            texts,
            refused,
            dim,
            dtype,
            row: 0,
            out,
            tx: escape.tx.clone(),
            memory: escape.memory.clone(),
        };
        if writer.layout.validity.is_some() {
            let bits = writer.bitmap(|writer, row| !writer.failed(row));
            layout::put_buffer(&writer.layout, &mut writer.out, &bits);
        }
        let values = writer.layout.values;
        let prefix = writer.layout.prefix(values);
        writer.out.extend_from_slice(prefix);
        Ok(writer)
    }

    /// Whether `row` fails: refused here, or by TEI before the header.
    fn failed(&self, row: usize) -> bool {
        self.texts.refused_here(row).is_some() || self.refused.binary_search_by_key(&row, |(at, _)| *at).is_ok()
    }

    fn reason(&self, row: usize) -> Option<&str> {
        match self.refused.binary_search_by_key(&row, |(at, _)| *at) {
            Ok(at) => Some(self.refused[at].1.as_str()),
            Err(_) => self.texts.refused_here(row),
        }
    }

    fn bitmap(&self, set: impl Fn(&Self, usize) -> bool) -> Vec<u8> {
        let mut bits = vec![0u8; self.texts.len().div_ceil(8)];
        for row in 0..self.texts.len() {
            if set(self, row) {
                bits[row / 8] |= 1 << (row % 8);
            }
        }
        bits
    }

    /// Zeros for the failed rows up to `row` (their values are a null's).
    pub fn fail_until(&mut self, row: usize) {
        let zeros = row.saturating_sub(self.row) * self.dim * self.dtype.bytes();
        self.out.resize(self.out.len() + zeros, 0);
        self.row = self.row.max(row);
    }

    /// Row `row`'s vector (the rows before it failed); the vector size every row must have.
    pub fn push(&mut self, row: usize, vector: &[f32]) -> Result<(), ManagerError> {
        if vector.len() != self.dim {
            return Err(ManagerError::InconsistentDimensions { first: self.dim, now: vector.len() });
        }
        self.fail_until(row);
        match self.dtype {
            Dtype::F32 => vector.iter().for_each(|v| self.out.extend_from_slice(&v.to_le_bytes())),
            Dtype::F16 => {
                vector.iter().for_each(|v| self.out.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes()))
            }
        }
        self.row = row + 1;
        Ok(())
    }

    /// What was written so far, charged, to the body; waits while the reader is behind.
    pub async fn flush(&mut self) -> Result<(), ManagerError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::take(&mut self.out);
        let charge = self
            .memory
            .charge(Use::Answers, bytes.len() as u64)
            .map_err(|over| ManagerError::Call(Error::Memory(over)))?;
        let piece = Bytes::from_owner(Piece { bytes, _charge: charge });
        self.tx.send(Item::Data(piece)).await.map_err(|_| ManagerError::Build("the call was gone".into()))
    }

    /// The rest: the failed rows after the last answered one, the `error` column, the end.
    pub async fn finish(mut self) -> Result<(), ManagerError> {
        let rows = self.texts.len();
        self.fail_until(rows);
        let values = self.layout.values;
        let pad = self.layout.pad(values);
        self.out.resize(self.out.len() + pad, 0);
        self.flush().await?;
        if self.layout.error_validity.is_some() {
            let bits = self.bitmap(|writer, row| writer.failed(row));
            layout::put_buffer(&self.layout, &mut self.out, &bits);
        }
        let mut offsets = Vec::with_capacity(4 * (rows + 1));
        let mut data = Vec::new();
        offsets.extend_from_slice(&0i32.to_le_bytes());
        for row in 0..rows {
            if let Some(reason) = self.reason(row) {
                data.extend_from_slice(reason.as_bytes());
            }
            // Within i32: checked when the header was made.
            offsets.extend_from_slice(&(data.len() as i32).to_le_bytes());
        }
        layout::put_buffer(&self.layout, &mut self.out, &offsets);
        layout::put_buffer(&self.layout, &mut self.out, &data);
        self.out.extend_from_slice(&layout::EOS);
        self.flush().await
    }
}
