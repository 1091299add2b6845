//! Which front a call came in on: its metric label and how its refusals are written.

/// Which front a call came in on: the `protocol` label of the request metrics (two values, so
/// the label never multiplies the series by more than two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// tei.v1 gRPC on the gRPC port.
    Grpc,
    /// TEI's HTTP API or OpenAI's embeddings route, translated to tei.v1 calls.
    Http,
}

impl Protocol {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::Http => "http",
        }
    }
}
