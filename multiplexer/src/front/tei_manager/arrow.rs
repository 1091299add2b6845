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

use super::error::ManagerError;
use super::ipc::{self, Dense, Dtype, Sparse, Texts};
use super::{Context, target};
use crate::admission::Lane;
use crate::admission::memory::{Charge, Use};
use crate::error::Error;
use crate::forward::bulk::{self, Bulk, Exchanged};
use crate::forward::pools::Pool;
use crate::gate::request_meta::RequestMeta;
use crate::report::call::Call;
use crate::vocab::Protocol;
use crate::vocab::framing::{Framed, PREFIX};
use crate::vocab::outcome::ErrorKind;
use crate::vocab::rpc::{self, Rpc};

/// tei-manager's vector size in `noop` mode (BGE-small's).
const NOOP_DIM: usize = 384;
/// A null input row's reason, in tei-manager's words.
const NULL_INPUT: &str = "input text is null";

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
            prompt_name: request.prompt_name.clone(),
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
            prompt_name: request.prompt_name.clone(),
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
    /// them (`normalize` as the request says, unset meaning false).
    fn message(&self, text: &str) -> Framed {
        let (truncation_direction, prompt_name) = (self.truncation_direction, self.prompt_name.clone());
        match self.sparse {
            false => Framed::encode(&v1::EmbedRequest {
                inputs: text.to_owned(),
                truncate: self.truncate,
                normalize: Some(self.normalize),
                truncation_direction,
                prompt_name,
                dimensions: self.dimensions,
            }),
            true => Framed::encode(&v1::EmbedSparseRequest {
                inputs: text.to_owned(),
                truncate: self.truncate,
                truncation_direction,
                prompt_name,
            }),
        }
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
                Ok(Self { call, meta, pool, carried: crate::gate::request_meta::carried_to_peers(headers) })
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
            ManagerError::AnswerTooLarge { .. } => {
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

/// A batch's answer, framed, and the memory charged for it until it is sent.
pub struct Answer {
    pub framed: Framed,
    pub charge: Charge,
}

/// One batch: its IPC in, its answer framed out. `request` is the request body's memory charge
/// (a unary call's): set to what the decoded texts hold once the IPC they came from is dropped.
pub async fn batch(
    cx: &Context,
    routed: &mut Routed,
    options: &Options,
    ipc_in: Bytes,
    request: Option<&Charge>,
) -> Result<Answer, ManagerError> {
    let texts = ipc::texts(&ipc_in)?;
    drop(ipc_in);
    if let Some(request) = request {
        let decoded = match &texts {
            Texts::Utf8(a) => arrow_array::Array::get_buffer_memory_size(a),
            Texts::LargeUtf8(a) => arrow_array::Array::get_buffer_memory_size(a),
        };
        request.set(decoded as u64).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
    }
    let answer = cx.memory.charge(Use::Answers, 0).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
    let rows = texts.len();
    let batch = match (options.sparse, options.noop) {
        (false, true) => noop_dense(rows, options, &answer, cx.max_message)?,
        (true, true) => noop_sparse(rows)?,
        (sparse, false) => {
            let mut assembled = Assembled::new(sparse, rows);
            embed(cx, routed, options, &texts, &mut assembled, &answer).await?;
            assembled.into_batch(options.dtype)?
        }
    };
    drop(texts);
    let framed = framed_answer(ipc::write_after(ANSWER_ROOM, batch, options.lz4)?);
    if framed.len() > cx.max_message {
        return Err(ManagerError::AnswerTooLarge { bytes: framed.len(), limit: cx.max_message });
    }
    // The vectors are gone: what stays until it is sent is the framed answer.
    answer.set(framed.len() as u64).map_err(|over| ManagerError::Call(Error::Memory(over)))?;
    Ok(Answer { framed, charge: answer })
}

/// Room kept before an answer's IPC: the gRPC prefix, then the key of `arrow_ipc` (field 1 of both
/// EmbedArrowResponse and EmbedSparseArrowResponse) and its length, a varint of up to 10 bytes.
const ANSWER_ROOM: usize = PREFIX + 1 + 10;

/// `Embed[Sparse]ArrowResponse { arrow_ipc }` framed around the IPC written after [`ANSWER_ROOM`].
fn framed_answer(written: Vec<u8>) -> Framed {
    let mut head = Vec::with_capacity(ANSWER_ROOM - PREFIX);
    prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut head);
    prost::encoding::encode_varint((written.len() - ANSWER_ROOM) as u64, &mut head);
    Framed::in_place(written, ANSWER_ROOM, &head)
}

/// The rows sent upstream in sub-batches over the pool, their answers assembled in order.
async fn embed(
    cx: &Context,
    routed: &mut Routed,
    options: &Options,
    texts: &Texts,
    assembled: &mut Assembled,
    answer: &Charge,
) -> Result<(), ManagerError> {
    let rpc = options.rpc();
    let pool = &*routed.pool;
    let size = bulk::sub_batch(pool, cx.max_client_batch_size, routed.meta.lane);
    let window = bulk::window(pool, size);
    let messages = (0..texts.len()).filter_map(|row| texts.get(row).map(|text| options.message(text)));
    let chunks = Chunks { messages, size };
    let bulk = Bulk { forwarder: &cx.forwarder, pool, meta: &routed.meta, carried: &routed.carried, rpc };
    let sparse = options.sparse;
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
        Ok(Ok(match sparse {
            false => Vector::Dense(v1::EmbedResponse::decode(bytes).map_err(undecodable)?.embeddings),
            true => Vector::Sparse(v1::EmbedSparseResponse::decode(bytes).map_err(undecodable)?.sparse_embeddings),
        }))
    };
    let mut answers = pin!(bulk.run(chunks, window, keep));
    let (mut row, mut first, mut timing) = (0, true, None);
    while let Some(chunk) = answers.next().await {
        let chunk = chunk?;
        if std::mem::take(&mut first) {
            routed.call.admitted_at(chunk.admitted);
        }
        timing = chunk.timing.or(timing);
        for kept in chunk.answers {
            while texts.get(row).is_none() {
                assembled.push(Err(NULL_INPUT.to_owned()))?;
                row += 1;
            }
            assembled.push(kept)?;
            row += 1;
        }
        assembled.bound(texts.len(), options.dtype, answer, cx.max_message)?;
    }
    while row < texts.len() {
        assembled.push(Err(NULL_INPUT.to_owned()))?;
        row += 1;
    }
    routed.call.observe(timing);
    Ok(())
}

/// One row's answer.
enum Vector {
    Dense(Vec<f32>),
    Sparse(Vec<v1::SparseValue>),
}

/// The answer's rows so far.
enum Assembled {
    Dense(Dense),
    Sparse(Sparse),
}

impl Assembled {
    fn new(sparse: bool, rows: usize) -> Self {
        if sparse { Self::Sparse(Sparse::with_rows(rows)) } else { Self::Dense(Dense::with_rows(rows)) }
    }

    fn push(&mut self, row: Result<Vector, String>) -> Result<(), ManagerError> {
        match (self, row) {
            (Self::Dense(dense), Ok(Vector::Dense(vector))) => dense.push_ok(&vector),
            (Self::Sparse(sparse), Ok(Vector::Sparse(pairs))) => {
                sparse.push_ok(pairs.into_iter().map(|pair| (pair.index, pair.value)))
            }
            (Self::Dense(dense), Err(reason)) => {
                dense.push_err(reason);
                Ok(())
            }
            (Self::Sparse(sparse), Err(reason)) => {
                sparse.push_err(reason);
                Ok(())
            }
            (_, Ok(_)) => Err(ManagerError::Build("an answer of the other kind".into())),
        }
    }

    /// Keeps the answer within the largest message the port sends and charged to the memory
    /// budget: a dense answer's full size is known from its first vector, so a call whose answer
    /// could never be sent is refused before its other sub-batches are.
    fn bound(&mut self, rows: usize, dtype: Dtype, answer: &Charge, max_message: usize) -> Result<(), ManagerError> {
        let (sent, held) = match self {
            Self::Dense(dense) => {
                let Some(dim) = dense.dim else { return Ok(()) };
                if answer.bytes() == 0 {
                    dense.reserve(rows);
                }
                // The f32 values, then the IPC written from them (framed in place, no third copy).
                (rows * dim * dtype.bytes(), rows * dim * (4 + dtype.bytes()))
            }
            Self::Sparse(sparse) => (sparse.held_bytes(), 2 * sparse.held_bytes()),
        };
        if sent > max_message {
            return Err(ManagerError::AnswerTooLarge { bytes: sent, limit: max_message });
        }
        answer.set(held as u64).map_err(|over| ManagerError::Call(Error::Memory(over)))
    }

    fn into_batch(self, dtype: Dtype) -> Result<arrow_array::RecordBatch, ManagerError> {
        match self {
            Self::Dense(dense) => dense.batch(dtype),
            Self::Sparse(sparse) => sparse.batch(),
        }
    }
}

/// tei-manager's `noop`: zero vectors of its noop size for every row, no TEI call.
fn noop_dense(
    rows: usize,
    options: &Options,
    answer: &Charge,
    max_message: usize,
) -> Result<arrow_array::RecordBatch, ManagerError> {
    let mut assembled = Assembled::new(false, rows);
    for _ in 0..rows {
        assembled.push(Ok(Vector::Dense(vec![0.0; NOOP_DIM])))?;
        if answer.bytes() == 0 {
            assembled.bound(rows, options.dtype, answer, max_message)?;
        }
    }
    assembled.into_batch(options.dtype)
}

/// tei-manager's sparse `noop`: three values per row.
fn noop_sparse(rows: usize) -> Result<arrow_array::RecordBatch, ManagerError> {
    let mut sparse = Sparse::with_rows(rows);
    for row in 0..rows {
        let i = u32::try_from(row).unwrap_or(u32::MAX);
        sparse.push_ok([(i, 1.0), (i.saturating_add(100), 0.5), (i.saturating_add(200), 0.25)])?;
    }
    sparse.batch()
}

/// Messages in sub-batches of `size`, made as the bulk runner asks for them.
struct Chunks<I> {
    messages: I,
    size: usize,
}

impl<I: Iterator<Item = Framed>> Iterator for Chunks<I> {
    type Item = Vec<Framed>;

    fn next(&mut self) -> Option<Vec<Framed>> {
        let chunk: Vec<Framed> = self.messages.by_ref().take(self.size).collect();
        (!chunk.is_empty()).then_some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_framed_in_place_is_the_message_prost_encodes() {
        for len in [1, 127, 128, 16_383, 16_384, 300_000] {
            let ipc: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut written = vec![0; ANSWER_ROOM];
            written.extend_from_slice(&ipc);
            let encoded = Framed::encode(&mux::EmbedArrowResponse { arrow_ipc: Bytes::from(ipc.clone()) });
            assert_eq!(framed_answer(written).into_framed(), encoded.clone().into_framed(), "{len} bytes");
            let sparse = Framed::encode(&mux::EmbedSparseArrowResponse { arrow_ipc: Bytes::from(ipc) });
            assert_eq!(sparse.into_framed(), encoded.into_framed(), "the same field in both answers");
        }
    }

    #[test]
    fn an_answer_written_after_its_room_reads_back_as_its_rows() {
        let mut dense = Dense::with_rows(3);
        dense.push_ok(&[1.0, 2.0]).unwrap();
        dense.push_err("too long".into());
        dense.push_ok(&[3.0, 4.0]).unwrap();
        let batch = dense.batch(Dtype::F32).unwrap();
        for lz4 in [false, true] {
            let framed = framed_answer(ipc::write_after(ANSWER_ROOM, batch.clone(), lz4).unwrap());
            let answer = mux::EmbedArrowResponse::decode(framed.into_message()).unwrap();
            let mut reader =
                arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(answer.arrow_ipc), None).unwrap();
            let read = reader.next().unwrap().unwrap();
            assert!(reader.next().is_none(), "one RecordBatch");
            assert_eq!(read, batch, "lz4 {lz4}");
        }
    }
}
