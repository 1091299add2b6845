//! tei-manager's Arrow batch RPCs (EmbedArrow, EmbedArrowStream, EmbedSparseArrow): the rows of
//! a RecordBatch sent as tei.v1 Embed (or EmbedSparse) exchanges in sub-batches over the whole
//! pool (`crate::forward::bulk`), each admitted on its own, the answers assembled in row order into
//! one RecordBatch. A null row, or one TEI refuses (INVALID_ARGUMENT: empty, too long without
//! truncation), gets its reason in the `error` column; anything else fails the call. The call is
//! counted once, under its tei.v1 RPC's label (Embed, EmbedSparse).

use std::pin::pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use prost::Message as _;
use teifleet_proto::tei_multiplexer::v1 as mux;
use teifleet_proto::v1;
use tonic::metadata::MetadataMap;

use super::answers::Answer;
use super::error::ManagerError;
use super::inbound;
use super::ipc::{self, Dense, Dtype, Sparse, Texts};
use super::streamed::{self, Escape, Writer};
use super::upstream::{CARRIED_ENTRY, Chunks, InFlight, MESSAGE_FIXED, WithInputs, prompt_name};
use super::window::Window;
use super::{Context, target};
use crate::admission::Lane;
use crate::admission::memory::{Charge, Use};
use crate::error::Error;
use crate::forward::bulk::{self, Bulk, CacheTally, Exchanged};
use crate::forward::pools::Pool;
use crate::gate::request_meta::RequestMeta;
use crate::report::call::Call;
use crate::vocab::Protocol;
use crate::vocab::framing::{Framed, PREFIX};
use crate::vocab::outcome::ErrorKind;
use crate::vocab::rpc::{self, Rpc};

/// tei-manager's vector size in `noop` mode (BGE-small's).
const NOOP_DIM: usize = 384;

/// What a batch asks for, from its request (the first one, for a stream).
#[derive(Clone, Debug)]
pub struct Options {
    pub target: target::Target,
    pub sparse: bool,
    pub noop: bool,
    pub truncate: bool,
    pub normalize: bool,
    pub truncation_direction: i32,
    pub prompt_name: Option<String>,
    pub dimensions: Option<u32>,
    pub lz4: bool,
    pub dtype: Dtype,
}

impl Options {
    pub fn dense(request: &mux::EmbedArrowRequest) -> Result<Self, ManagerError> {
        let target = target::target(request.target.as_ref().map(|t| Bytes::from(t.encode_to_vec())).as_ref())?;
        let dtype = match mux::OutputDtype::try_from(request.output_dtype) {
            // tei-manager's server default, unless configured otherwise there.
            Ok(mux::OutputDtype::Unspecified | mux::OutputDtype::F32) => Dtype::F32,
            Ok(mux::OutputDtype::F16) => Dtype::F16,
            Err(_) => return Err(ManagerError::UnknownEnum { field: "output_dtype", value: request.output_dtype }),
        };
        Ok(Self {
            target,
            sparse: false,
            noop: request.noop,
            truncate: request.truncate,
            normalize: request.normalize,
            truncation_direction: request.truncation_direction,
            prompt_name: prompt_name(&request.prompt_name)?,
            dimensions: request.dimensions,
            lz4: lz4(request.compression)?,
            dtype,
        })
    }

    pub fn sparse(request: &mux::EmbedSparseArrowRequest) -> Result<Self, ManagerError> {
        let target = target::target(request.target.as_ref().map(|t| Bytes::from(t.encode_to_vec())).as_ref())?;
        Ok(Self {
            target,
            sparse: true,
            noop: request.noop,
            truncate: request.truncate,
            normalize: false,
            truncation_direction: request.truncation_direction,
            prompt_name: prompt_name(&request.prompt_name)?,
            dimensions: None,
            lz4: lz4(request.compression)?,
            dtype: Dtype::F32,
        })
    }

    /// The tei.v1 row each input row goes upstream as.
    pub fn rpc(&self) -> &'static Rpc {
        let path = if self.sparse { "/tei.v1.Embed/EmbedSparse" } else { "/tei.v1.Embed/Embed" };
        rpc::find(path).unwrap_or_else(|| panic!("{path} is a row of rpc::RPCS"))
    }

    /// One input row as the tei.v1 request TEI gets for it: tei-manager's options, as it sends
    /// them (`normalize` as the request says, unset meaning false). The text is encoded straight
    /// from the decoded column into the framed message: one copy, no `String` of it between.
    fn message(&self, text: &str) -> Framed {
        let (truncation_direction, prompt_name) = (self.truncation_direction, self.prompt_name.clone());
        match self.sparse {
            false => Framed::encode(&WithInputs {
                inputs: text,
                rest: v1::EmbedRequest {
                    inputs: String::new(),
                    truncate: self.truncate,
                    normalize: Some(self.normalize),
                    truncation_direction,
                    prompt_name,
                    dimensions: self.dimensions,
                },
            }),
            true => Framed::encode(&WithInputs {
                inputs: text,
                rest: v1::EmbedSparseRequest {
                    inputs: String::new(),
                    truncate: self.truncate,
                    truncation_direction,
                    prompt_name,
                },
            }),
        }
    }

    /// The most bytes a row's upstream message has beside its text: the options (the prompt's
    /// name at most [`super::upstream::MAX_PROMPT_NAME`]), field keys and lengths, the gRPC prefix.
    fn message_overhead(&self) -> usize {
        MESSAGE_FIXED + self.prompt_name.as_ref().map_or(0, String::len)
    }
}

fn lz4(compression: i32) -> Result<bool, ManagerError> {
    match mux::ArrowCompression::try_from(compression) {
        Ok(mux::ArrowCompression::None) => Ok(false),
        Ok(mux::ArrowCompression::Lz4) => Ok(true),
        Err(_) => Err(ManagerError::UnknownEnum { field: "compression", value: compression }),
    }
}

/// A batch call routed to its pool, counted once whatever it becomes.
pub struct Routed {
    pub call: Call,
    pub meta: RequestMeta,
    pub pool: Arc<Pool>,
    pub carried: MetadataMap,
    /// Its rows' lookups in the pool's cache so far (a stream's, over its batches).
    pub cache: CacheTally,
}

impl Routed {
    /// Routes a batch call from its headers, its target already written into them.
    pub fn route(cx: &Context, options: &Options, headers: &http::HeaderMap) -> Result<Self, Error> {
        let mut call = cx.forwarder.call(options.rpc(), Protocol::Grpc);
        match cx.forwarder.route(&mut call, headers) {
            Ok((mut meta, pool)) => {
                // An Arrow batch is a bulk call: ingest, unless it says otherwise.
                if !meta.lane_named {
                    meta.lane = Lane::Ingest;
                }
                let carried = crate::gate::request_meta::carried_to_peers(headers);
                Ok(Self { call, meta, pool, carried, cache: CacheTally::default() })
            }
            Err(error) => Err(call.fail(error)),
        }
    }

    /// Counts how the call ended; its error handed back to be answered.
    pub fn finish<T>(&mut self, result: Result<T, ManagerError>) -> Result<T, ManagerError> {
        match result {
            Ok(answer) => {
                self.call.succeed();
                Ok(answer)
            }
            Err(error) => Err(self.fail(error)),
        }
    }

    /// Counts the call as failed by `error`: the crate's errors by their kind, the batch's own
    /// (a malformed payload, an answer too large) as the caller's.
    pub fn fail(&mut self, error: ManagerError) -> ManagerError {
        match error {
            ManagerError::Call(error) => ManagerError::Call(self.call.fail(error)),
            ManagerError::AnswerTooLarge { .. } | ManagerError::RowTooLarge { .. } => {
                self.call.refuse(ErrorKind::TooLarge);
                error
            }
            error => {
                self.call.refuse(ErrorKind::InvalidRequest);
                error
            }
        }
    }
}

/// One batch: its IPC in, its answer out. `request` is the request message's memory charge: the
/// IPC is checked and what decoding it inflates charged before it is decoded
/// (`super::inbound`), and once the IPC is dropped the charge is what the decoded texts hold.
pub async fn batch(
    cx: &Context,
    routed: &mut Routed,
    options: &Options,
    ipc_in: Bytes,
    request: &Charge,
) -> Result<Answer, ManagerError> {
    batch_with(cx, routed, options, ipc_in, request, None)
        .await?
        .ok_or_else(|| ManagerError::Build("an answer streamed where none may be".into()))
}

/// [`batch`], its dense answer streamed through `escape` when too large to hold (`None` then:
/// the answer went out, see `super::streamed`).
pub async fn batch_with(
    cx: &Context,
    routed: &mut Routed,
    options: &Options,
    ipc_in: Bytes,
    request: &Charge,
    escape: Option<&mut Escape>,
) -> Result<Option<Answer>, ManagerError> {
    // Inflating, validating (UTF-8 of every row) and writing are CPU work of up to tens of
    // megabytes: off the runtime's workers, so callers beside this one are not stalled by it.
    let memory = cx.memory.clone();
    let decoded = blocking(move || inbound::decode_texts(&ipc_in, &memory)).await?;
    let (texts, inflated) = (decoded.texts, decoded.charge);
    // Both charges shrink here as a rule: the texts hold at most the message and what it inflated.
    let held = texts.memory_size() as u64;
    let before = request.bytes();
    match held.checked_sub(before) {
        None => {
            request.shrink(before - held);
            inflated.shrink(inflated.bytes());
        }
        Some(more) => inflated.set(more).map_err(|over| ManagerError::Call(Error::Memory(over)))?,
    }
    let answer = cx.memory.charge(Use::Answers, 0).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
    let limit = cx.arrow_max_message();
    let mut assembled = Assembled::new(options, &texts, &answer, limit)?;
    match options.noop {
        true => noop(&mut assembled, &texts)?,
        false => {
            if embed(cx, routed, options, &texts, &mut assembled, escape).await? {
                return Ok(None);
            }
        }
    }
    let (rows, dtype, lz4) = (assembled.rows, assembled.dtype, options.lz4);
    let mut written = blocking(move || {
        let here = |row: usize| texts.refused_here(row);
        let batch = match rows {
            Rows::Dense(dense) => dense.batch(dtype, &here),
            Rows::Sparse(sparse) => sparse.batch(&here),
        }?;
        drop(texts);
        ipc::write_after(ANSWER_ROOM, batch, lz4)
    })
    .await?;
    drop(inflated);
    let start = frame_in_place(&mut written);
    let message = written.len() - start - PREFIX;
    if message > limit {
        return Err(ManagerError::AnswerTooLarge { bytes: message, limit });
    }
    // The vectors are gone: what stays until it is sent is the written answer.
    answer.set(written.len() as u64).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
    Ok(Some(Answer { written, start, charge: answer, cache: routed.cache.header() }))
}

/// `work` on tokio's blocking threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| ManagerError::Build(format!("the work stopped: {e}")))?
}

/// Room kept before an answer's IPC: the gRPC prefix, then the key of `arrow_ipc` (field 1 of both
/// EmbedArrowResponse and EmbedSparseArrowResponse) and its length, a varint of up to 10 bytes.
pub const ANSWER_ROOM: usize = PREFIX + 1 + 10;

/// `Embed[Sparse]ArrowResponse { arrow_ipc }` framed around the IPC written after [`ANSWER_ROOM`]:
/// the gRPC prefix, the field's key and length written into the room's end; returns where the
/// framed message starts. A large answer is written once, never copied.
pub fn frame_in_place(written: &mut [u8]) -> usize {
    let mut head = Vec::with_capacity(ANSWER_ROOM - PREFIX);
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut head);
    prost::encoding::encode_varint((written.len() - ANSWER_ROOM) as u64, &mut head);
    let start = ANSWER_ROOM - head.len() - PREFIX;
    let len = written.len() - start - PREFIX;
    written[start] = 0;
    written[start + 1..start + PREFIX].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    written[ANSWER_ROOM - head.len()..ANSWER_ROOM].copy_from_slice(&head);
    start
}

/// The rows sent upstream in sub-batches over the pool, their answers assembled in order. Rows
/// refused here (null, empty) are never sent. With an `escape`, a dense answer too large to hold
/// is streamed from its first vector on; `true` then.
async fn embed(
    cx: &Context,
    routed: &mut Routed,
    options: &Options,
    texts: &Texts,
    assembled: &mut Assembled<'_>,
    mut escape: Option<&mut Escape>,
) -> Result<bool, ManagerError> {
    let rpc = options.rpc();
    let pool = &*routed.pool;
    // A row whose message TEI would refuse for its size fails the call before any is built (a
    // 40 MB row was copied into a message and sent, for TEI to refuse it at 4 MiB).
    let overhead = options.message_overhead();
    for row in 0..texts.len() {
        let bytes = texts.get(row).map_or(0, str::len);
        if bytes.saturating_add(overhead) > cx.max_message {
            return Err(ManagerError::RowTooLarge { row, bytes, limit: cx.max_message });
        }
    }
    let size = bulk::sub_batch(pool, cx.max_client_batch_size, routed.meta.lane);
    let window = bulk::window(pool, size);
    let messages = (0..texts.len())
        .filter(|row| texts.refused_here(*row).is_none())
        .filter_map(|row| texts.get(row).map(|text| options.message(text)));
    // The sub-batches' messages are copies of their rows (and options): charged as each is made,
    // given back as its answers are taken.
    // Each message also goes with its own copy of the headers carried to peers (a map whose
    // values share the request's bytes): its entries are charged too.
    let per_message = (routed.carried.len() * CARRIED_ENTRY) as u64;
    let in_flight = InFlight::new(cx)?;
    let chunks = Chunks { messages, size, per_message, in_flight: &in_flight };
    let bulk = Bulk { forwarder: &cx.forwarder, pool, meta: &routed.meta, carried: &routed.carried, rpc };
    let sparse = options.sparse;
    // The window's answers, charged as each is decoded, given back as each is taken.
    let decoded = cx.memory.charge(Use::Answers, 0).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
    let decoded = &decoded;
    let keep = move |exchanged: Exchanged| -> crate::error::Result<Result<Vector, String>> {
        let (response, _) = match exchanged {
            Ok(answered) => answered,
            Err(error) => return bulk::refused_row(&error).map(|status| Err(status.message().to_owned())).ok_or(error),
        };
        let bytes = response.get_ref().as_ref();
        let undecodable = |e: prost::DecodeError| Error::Upstream {
            pool: pool.spec.name.clone(),
            status: tonic::Status::internal(format!("the upstream answered with an undecodable message: {e}")),
        };
        let vector = match sparse {
            false => Vector::Dense(v1::EmbedResponse::decode(bytes).map_err(undecodable)?.embeddings),
            true => Vector::Sparse(v1::EmbedSparseResponse::decode(bytes).map_err(undecodable)?.sparse_embeddings),
        };
        decoded.grow(vector.held()).map_err(Error::Memory)?;
        Ok(Ok(vector))
    };
    let mut window = Window::new(chunks, window, move |chunk| {
        Box::pin(async move {
            let mut answers = pin!(bulk.run(std::iter::once(chunk), 1, keep));
            match answers.next().await {
                Some(answered) => answered.map_err(ManagerError::Call),
                None => Err(ManagerError::Build("a sub-batch with no answer".into())),
            }
        })
    });
    let (mut row, mut first, mut timing) = (0, true, None);
    let mut streamed: Option<Writer<'_>> = None;
    while let Some(chunk) = window.next().await {
        let chunk = chunk?;
        routed.cache.add(&chunk);
        if std::mem::take(&mut first) {
            routed.call.admitted_at(chunk.admitted);
        }
        in_flight.answered();
        timing = chunk.timing.or(timing);
        // The first vector tells the answer's size: held as today if it fits, streamed if not.
        if streamed.is_none()
            && let Some(escape) = escape.as_deref_mut()
            && let Some(dim) = assembled.first_dim(&chunk.answers)
            && let Err(refused) = assembled.fits(dim)
        {
            if !streamed::streams_past(&refused) {
                return Err(refused);
            }
            let refused_by_tei = assembled.take_errors();
            // What the held answer had charged (its per-row state) is not made.
            assembled.answer.shrink(assembled.answer.bytes());
            let mut writer = Writer::open(escape, texts, (options.dtype, options.lz4), dim, refused_by_tei).await?;
            writer.fail_until(row);
            streamed = Some(writer);
        }
        for kept in chunk.answers {
            if let Ok(vector) = &kept {
                decoded.shrink(vector.held());
            }
            while row < texts.len() && texts.refused_here(row).is_some() {
                if streamed.is_none() {
                    assembled.push(Err(None))?;
                }
                row += 1;
            }
            match (&mut streamed, kept) {
                (None, kept) => assembled.push(kept.map_err(Some))?,
                (Some(writer), Ok(Vector::Dense(vector))) => writer.push(row, &vector)?,
                (Some(_), Err(reason)) => return Err(ManagerError::RowRefused { row, reason }),
                (Some(_), Ok(Vector::Sparse(_))) => {
                    return Err(ManagerError::Build("an answer of the other kind".into()));
                }
            }
            row += 1;
        }
        match &mut streamed {
            None => assembled.bound()?,
            // While the reader is behind, the sub-batches in flight still finish.
            Some(writer) => tokio::select! {
                flushed = writer.flush() => flushed?,
                () = window.progress() => {}
            },
        }
    }
    // Sub-batches stopped being made for want of memory: the call fails, not its rows.
    in_flight.refused()?;
    if let Some(writer) = streamed {
        writer.finish().await?;
        routed.call.observe(timing);
        return Ok(true);
    }
    while row < texts.len() {
        assembled.push(Err(None))?;
        row += 1;
    }
    routed.call.observe(timing);
    Ok(false)
}

/// One row's answer.
enum Vector {
    Dense(Vec<f32>),
    Sparse(Vec<v1::SparseValue>),
}

impl Vector {
    /// The bytes it holds, as charged while it waits in the window.
    fn held(&self) -> u64 {
        let numbers = match self {
            Self::Dense(vector) => vector.capacity() * 4,
            Self::Sparse(pairs) => pairs.capacity() * 8,
        };
        (numbers + VECTOR_OVERHEAD) as u64
    }
}

/// A decoded vector's own bytes beside its numbers (the `Vec`, the row's slot), rounded up.
const VECTOR_OVERHEAD: usize = 32;

/// The answer's rows so far, kept within the largest answer the service sends and charged to the
/// memory budget before each part of it is built: the per-row state (validity, the `error`
/// column with the reasons of the rows refused here) at once, a dense answer's vectors as soon
/// as the first one tells their size (a call whose answer could never be sent is refused before
/// its other sub-batches are), a sparse one's as they come.
struct Assembled<'a> {
    rows: Rows,
    dtype: Dtype,
    answer: &'a Charge,
    limit: usize,
    /// Bytes the answer sends and holds whatever its vectors: the `error` column, the validity.
    fixed_sent: usize,
    fixed_held: usize,
}

enum Rows {
    Dense(Dense),
    Sparse(Sparse),
}

impl<'a> Assembled<'a> {
    fn new(options: &Options, texts: &Texts, answer: &'a Charge, limit: usize) -> Result<Self, ManagerError> {
        let rows = texts.len();
        let here: usize = (0..rows).filter_map(|row| texts.refused_here(row)).map(str::len).sum();
        // The `error` column (offsets and the reasons given here) and the validity bits as sent;
        // held, they are built once and written once, beside a byte a row of `ok`.
        let fixed_sent = 4 * (rows + 1) + here + rows.div_ceil(8);
        let fixed_held = 2 * fixed_sent + rows;
        let rows_state = match options.sparse {
            true => Rows::Sparse(Sparse::with_rows(0)),
            false => Rows::Dense(Dense::with_rows(0)),
        };
        let mut assembled = Self { rows: rows_state, dtype: options.dtype, answer, limit, fixed_sent, fixed_held };
        assembled.check(fixed_sent, fixed_held)?;
        // Charged: now the per-row state may be made.
        assembled.rows = match options.sparse {
            true => Rows::Sparse(Sparse::with_rows(rows)),
            false => Rows::Dense(Dense::with_rows(rows)),
        };
        Ok(assembled)
    }

    fn check(&self, sent: usize, held: usize) -> Result<(), ManagerError> {
        if sent > self.limit {
            return Err(ManagerError::AnswerTooLarge { bytes: sent, limit: self.limit });
        }
        self.answer.set(held as u64).map_err(|over| ManagerError::Call(Error::Memory(over)))
    }

    /// The vector size of a dense answer's first vector in `answers`, while none is known yet.
    fn first_dim(&self, answers: &[Result<Vector, String>]) -> Option<usize> {
        match &self.rows {
            Rows::Dense(dense) if dense.dim.is_none() => answers.iter().find_map(|kept| match kept {
                Ok(Vector::Dense(vector)) => Some(vector.len()),
                _ => None,
            }),
            _ => None,
        }
    }

    /// Whether a dense answer of `dim` numbers a row can be held: its bytes checked against the
    /// largest message and charged (the check the first vector's push makes).
    fn fits(&self, dim: usize) -> Result<(), ManagerError> {
        let rows = self.rows_made_for();
        // The f32 values, then the IPC written from them (framed in place, no third copy).
        let sent = rows.saturating_mul(dim).saturating_mul(self.dtype.bytes()).saturating_add(self.fixed_sent);
        let held = rows.saturating_mul(dim).saturating_mul(4 + self.dtype.bytes()).saturating_add(self.fixed_held);
        self.check(sent, held)
    }

    /// TEI's reasons for the rows it refused so far (a dense answer's), taken.
    fn take_errors(&mut self) -> Vec<(usize, String)> {
        match &mut self.rows {
            Rows::Dense(dense) => dense.take_errors(),
            Rows::Sparse(_) => Vec::new(),
        }
    }

    /// A row's answer: its vector, or why it failed (TEI's words, `None` for a row refused here).
    fn push(&mut self, row: Result<Vector, Option<String>>) -> Result<(), ManagerError> {
        if let Err(Some(reason)) = &row {
            // TEI's reason, kept, then in the column, then written.
            self.fixed_sent += reason.len();
            self.fixed_held += 3 * reason.len();
        }
        if let (Rows::Dense(dense), Ok(Vector::Dense(vector))) = (&self.rows, &row)
            && dense.dim.is_none()
        {
            self.fits(vector.len())?;
        }
        match (&mut self.rows, row) {
            (Rows::Dense(dense), Ok(Vector::Dense(vector))) => dense.push_ok(&vector),
            (Rows::Sparse(sparse), Ok(Vector::Sparse(pairs))) => {
                sparse.push_ok(pairs.into_iter().map(|pair| (pair.index, pair.value)))
            }
            (Rows::Dense(dense), Err(reason)) => {
                dense.push_err(reason);
                Ok(())
            }
            (Rows::Sparse(sparse), Err(reason)) => {
                sparse.push_err(reason);
                Ok(())
            }
            (_, Ok(_)) => Err(ManagerError::Build("an answer of the other kind".into())),
        }
    }

    fn rows_made_for(&self) -> usize {
        match &self.rows {
            Rows::Dense(dense) => dense.rows(),
            Rows::Sparse(sparse) => sparse.rows(),
        }
    }

    /// After each sub-batch: a sparse answer's pairs so far, checked and charged.
    fn bound(&mut self) -> Result<(), ManagerError> {
        match &self.rows {
            Rows::Dense(dense) if dense.dim.is_some() => Ok(()),
            Rows::Dense(_) => self.check(self.fixed_sent, self.fixed_held),
            Rows::Sparse(sparse) => {
                let pairs = sparse.held_bytes();
                self.check(pairs + self.fixed_sent, 2 * pairs + self.fixed_held)
            }
        }
    }
}

/// tei-manager's `noop`: no TEI call; zero vectors of its noop size (sparse: three values) for
/// every row TEI would have embedded, the others refused as they would be.
fn noop(assembled: &mut Assembled<'_>, texts: &Texts) -> Result<(), ManagerError> {
    for row in 0..texts.len() {
        let vector = match (&assembled.rows, texts.refused_here(row)) {
            (_, Some(_)) => Err(None),
            (Rows::Dense(_), None) => Ok(Vector::Dense(vec![0.0; NOOP_DIM])),
            (Rows::Sparse(_), None) => {
                let i = u32::try_from(row).unwrap_or(u32::MAX);
                let pair = |index: u32, value| v1::SparseValue { index, value };
                Ok(Vector::Sparse(vec![
                    pair(i, 1.0),
                    pair(i.saturating_add(100), 0.5),
                    pair(i.saturating_add(200), 0.25),
                ]))
            }
        };
        assembled.push(vector)?;
        if row.is_multiple_of(1024) {
            assembled.bound()?;
        }
    }
    assembled.bound()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::tei_manager::upstream::MAX_PROMPT_NAME;

    fn options(prompt_name: Option<String>, sparse: bool) -> Result<Options, ManagerError> {
        let target = Some(mux::Target { routing: Some(mux::target::Routing::ModelId("m".into())) });
        match sparse {
            false => Options::dense(&mux::EmbedArrowRequest { target, prompt_name, ..Default::default() }),
            true => Options::sparse(&mux::EmbedSparseArrowRequest { target, prompt_name, ..Default::default() }),
        }
    }

    #[test]
    fn a_row_message_is_the_one_prost_encodes() {
        for (text, prompt) in [("hello", Some("query".to_owned())), ("", None), (&"x".repeat(300)[..], None)] {
            let dense = options(prompt.clone(), false).unwrap();
            let expected = Framed::encode(&v1::EmbedRequest {
                inputs: text.to_owned(),
                truncate: dense.truncate,
                normalize: Some(dense.normalize),
                truncation_direction: dense.truncation_direction,
                prompt_name: prompt.clone(),
                dimensions: dense.dimensions,
            });
            let made = dense.message(text);
            assert_eq!(made.as_ref(), expected.as_ref(), "{text:?}");
            assert!(made.as_ref().len() <= text.len() + dense.message_overhead());
            let sparse = options(prompt.clone(), true).unwrap();
            let read = v1::EmbedSparseRequest::decode(sparse.message(text).as_ref()).unwrap();
            assert_eq!((read.inputs.as_str(), read.prompt_name), (text, prompt));
        }
    }

    #[test]
    fn a_prompt_name_past_its_bound_is_refused_naming_it() {
        for sparse in [false, true] {
            assert!(options(Some("p".repeat(MAX_PROMPT_NAME)), sparse).is_ok());
            let refused = options(Some("p".repeat(MAX_PROMPT_NAME + 1)), sparse).unwrap_err().into_status();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument);
            assert!(refused.message().contains(&MAX_PROMPT_NAME.to_string()), "{}", refused.message());
        }
    }

    #[test]
    fn an_answer_framed_in_place_is_the_message_prost_encodes() {
        for len in [1, 127, 128, 16_383, 16_384, 300_000] {
            let ipc: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut written = vec![0; ANSWER_ROOM];
            written.extend_from_slice(&ipc);
            let encoded = Framed::encode(&mux::EmbedArrowResponse { arrow_ipc: Bytes::from(ipc.clone()) });
            let start = frame_in_place(&mut written);
            assert_eq!(&written[start..], &encoded.clone().into_framed()[..], "{len} bytes");
            let sparse = Framed::encode(&mux::EmbedSparseArrowResponse { arrow_ipc: Bytes::from(ipc) });
            assert_eq!(sparse.into_framed(), encoded.into_framed(), "the same field in both answers");
        }
    }

    #[test]
    fn an_answer_written_after_its_room_reads_back_as_its_rows() {
        let mut dense = Dense::with_rows(3);
        dense.push_ok(&[1.0, 2.0]).unwrap();
        dense.push_err(Some("too long".into()));
        dense.push_ok(&[3.0, 4.0]).unwrap();
        let batch = dense.batch(Dtype::F32, &|_| None).unwrap();
        for lz4 in [false, true] {
            let mut written = ipc::write_after(ANSWER_ROOM, batch.clone(), lz4).unwrap();
            let start = frame_in_place(&mut written);
            let answer = mux::EmbedArrowResponse::decode(&written[start + PREFIX..]).unwrap();
            let mut reader =
                arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(answer.arrow_ipc), None).unwrap();
            let read = reader.next().unwrap().unwrap();
            assert!(reader.next().is_none(), "one RecordBatch");
            assert_eq!(read, batch, "lz4 {lz4}");
        }
    }
}
