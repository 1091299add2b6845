//! Every `tei.v1` RPC as data: its path, its metric label, its shape, what its messages carry
//! and whether it needs a permit. The generic service serves every row of [`RPCS`]; a new RPC is
//! a new row here, not a new handler.

/// How messages flow in a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Unary,
    /// One request, a stream of answers (none in `tei.v1` today; served all the same).
    ServerStream,
    /// A stream of requests, one answer at the end (RerankStream).
    ClientStream,
    /// A stream each way; TEI answers stream messages in order, one answer per request message.
    Bidi,
}

/// Whether a call waits for a permit. Info alone passes without one: it is answered from what TEI
/// knows, costs nothing to compute and is what health checks call. Tokenization takes one, though
/// it never reaches TEI's model queue: unadmitted, a flood of it held unbounded memory and stalled
/// other callers (issue 31); admitted, it waits at the door and in the queue like the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Permit,
    Free,
}

/// How many of TEI's inputs one request message carries (TEI counts each input against its
/// `max-concurrent-requests`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inputs {
    /// Not an input at all (Info).
    None,
    One,
    /// One per occurrence of this repeated field (Rerank's `texts`).
    PerField(u32),
}

/// How TEI's answer to one input grows: what the memory budget must expect before TEI computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerSize {
    /// One vector, score or token list an input: bounded by the model.
    PerInput,
    /// A vector per token of the input (EmbedAll): a new call is refused before it reaches TEI
    /// when the share of the budget that large holders may fill has no room
    /// (`front::grpc::server::answer::room_for`).
    PerToken,
}

#[derive(Debug)]
pub struct Rpc {
    /// `/package.Service/Method`, as it appears on the wire.
    pub path: &'static str,
    /// The `rpc` label of metrics and spans.
    pub label: &'static str,
    pub shape: Shape,
    pub admit: Admit,
    pub inputs: Inputs,
    /// String fields of the request message whose length is the text TEI tokenizes.
    pub text_fields: &'static [u32],
    /// TEI's answer carries its timing `Metadata` in field 2.
    pub timed: bool,
    pub answer: AnswerSize,
}

impl Rpc {
    /// The gRPC service name, e.g. `tei.v1.Embed`.
    /// The unary row that takes one of this stream's messages and gives one of its answers
    /// (`EmbedStream`'s is `Embed`): TEI's streams are its unary calls, message by message.
    pub fn unary(&self) -> Option<&'static Rpc> {
        let path = self.path.strip_suffix("Stream")?;
        RPCS.iter().find(|rpc| rpc.path == path && rpc.shape == Shape::Unary)
    }

    pub fn service(&self) -> &'static str {
        let trimmed = &self.path[1..];
        &trimmed[..trimmed.find('/').unwrap_or(trimmed.len())]
    }
}

const fn inference(path: &'static str, label: &'static str, shape: Shape, inputs: Inputs, text: &'static [u32]) -> Rpc {
    Rpc { path, label, shape, admit: Admit::Permit, inputs, text_fields: text, timed: true, answer: PerInput }
}

/// An inference whose answer is a vector per token of its input.
const fn per_token(path: &'static str, label: &'static str, shape: Shape) -> Rpc {
    Rpc { answer: PerToken, ..inference(path, label, shape, One, &[1]) }
}

const fn free(path: &'static str, label: &'static str, shape: Shape, text: &'static [u32]) -> Rpc {
    Rpc {
        path,
        label,
        shape,
        admit: Admit::Free,
        inputs: Inputs::None,
        text_fields: text,
        timed: false,
        answer: PerInput,
    }
}

/// Tokenization: one input per message, as an inference call is charged (its text's tokens too
/// when the pool counts them), but TEI answers it without timing.
const fn tokenization(path: &'static str, label: &'static str, shape: Shape, text: &'static [u32]) -> Rpc {
    Rpc {
        path,
        label,
        shape,
        admit: Admit::Permit,
        inputs: Inputs::One,
        text_fields: text,
        timed: false,
        answer: PerInput,
    }
}

use AnswerSize::{PerInput, PerToken};
use Inputs::{One, PerField};
use Shape::{Bidi, ClientStream, Unary};

/// The `tei.v1` interface, as TEI serves it (proto/tei/v1/tei.proto).
pub static RPCS: [Rpc; 17] = [
    free("/tei.v1.Info/Info", "Info", Unary, &[]),
    inference("/tei.v1.Embed/Embed", "Embed", Unary, One, &[1]),
    inference("/tei.v1.Embed/EmbedStream", "EmbedStream", Bidi, One, &[1]),
    inference("/tei.v1.Embed/EmbedSparse", "EmbedSparse", Unary, One, &[1]),
    inference("/tei.v1.Embed/EmbedSparseStream", "EmbedSparseStream", Bidi, One, &[1]),
    per_token("/tei.v1.Embed/EmbedAll", "EmbedAll", Unary),
    per_token("/tei.v1.Embed/EmbedAllStream", "EmbedAllStream", Bidi),
    inference("/tei.v1.Predict/Predict", "Predict", Unary, One, &[1]),
    inference("/tei.v1.Predict/PredictPair", "PredictPair", Unary, One, &[1]),
    inference("/tei.v1.Predict/PredictStream", "PredictStream", Bidi, One, &[1]),
    inference("/tei.v1.Predict/PredictPairStream", "PredictPairStream", Bidi, One, &[1]),
    inference("/tei.v1.Rerank/Rerank", "Rerank", Unary, PerField(2), &[1, 2]),
    inference("/tei.v1.Rerank/RerankStream", "RerankStream", ClientStream, One, &[1, 2]),
    tokenization("/tei.v1.Tokenize/Tokenize", "Tokenize", Unary, &[1]),
    tokenization("/tei.v1.Tokenize/TokenizeStream", "TokenizeStream", Bidi, &[1]),
    tokenization("/tei.v1.Tokenize/Decode", "Decode", Unary, &[]),
    tokenization("/tei.v1.Tokenize/DecodeStream", "DecodeStream", Bidi, &[]),
];

/// The row for a request path.
pub fn find(path: &str) -> Option<&'static Rpc> {
    RPCS.iter().find(|rpc| rpc.path == path)
}

/// The gRPC services of the table, each once, in table order (for health and logs).
pub fn services() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for rpc in &RPCS {
        if !names.contains(&rpc.service()) {
            names.push(rpc.service());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use teifleet_proto::FILE_DESCRIPTOR_SET;

    use super::*;

    /// The table and the proto agree: every method of `tei.v1` has exactly one row, with the
    /// streaming shape the proto declares.
    #[test]
    fn the_table_is_the_proto() {
        let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
        let mut declared = Vec::new();
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                    let shape = match (method.client_streaming(), method.server_streaming()) {
                        (false, false) => Shape::Unary,
                        (false, true) => Shape::ServerStream,
                        (true, false) => Shape::ClientStream,
                        (true, true) => Shape::Bidi,
                    };
                    declared.push((path, shape, method.name().to_owned()));
                }
            }
        }
        assert_eq!(declared.len(), RPCS.len());
        for (path, shape, name) in declared {
            let rpc = find(&path).unwrap_or_else(|| panic!("{path} has no row"));
            assert_eq!((rpc.shape, rpc.label), (shape, name.as_str()), "{path}");
        }
    }

    #[test]
    fn services_in_order() {
        assert_eq!(services(), ["tei.v1.Info", "tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Tokenize"]);
        assert_eq!(find("/tei.v1.Rerank/Rerank").unwrap().inputs, Inputs::PerField(2));
        let free: Vec<&str> = RPCS.iter().filter(|rpc| rpc.admit == Admit::Free).map(|rpc| rpc.label).collect();
        assert_eq!(free, ["Info"], "every other RPC waits for a permit");
        assert!(find("/tei.v1.Embed/Nope").is_none());
    }
}
