//! THE table: every surface the multiplexer serves to callers, each with how to build a valid
//! request of it and what its attacks send. `coverage` holds it to the product (every method
//! of every service the gRPC port serves, every HTTP route): a surface added to the product without
//! a row here fails the build, as does a row for a surface that is gone.

/// What a gRPC row's request message is (the builders are in `requests`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    Info,
    Embed,
    EmbedSparse,
    EmbedAll,
    Predict,
    PredictPair,
    Rerank,
    RerankStream,
    Encode,
    Decode,
    /// tei-manager's `EmbedArrowRequest`: an Arrow IPC batch and the call's options.
    Arrow,
    SparseArrow,
    HealthCheck,
    /// `ServerReflectionRequest`, the same on the wire in `v1` and `v1alpha`.
    Reflection,
}

/// One gRPC method.
#[derive(Debug)]
pub struct GrpcRow {
    /// `/package.Service/Method`.
    pub path: &'static str,
    pub message: Message,
    /// tei-manager's wrapper (`{target = 1, request = 2}`) around the tei.v1 message.
    pub wrapped: bool,
    /// The client sends a stream of messages (the proto's `stream` request).
    pub client_stream: bool,
    /// The server answers one request with a stream that ends only when the client goes (health's
    /// `Watch`): its call is taken as answered at its first message.
    pub endless: bool,
}

/// What a request of an HTTP route carries (the builders are in `bodies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// A GET: no body the route reads.
    None,
    /// TEI's `/embed` body (`/embed_sparse`, `/`, `/invocations` read it too).
    Embed,
    /// `/embed` 's body, for the route whose answer is a vector per token.
    EmbedAll,
    OpenAi,
    Rerank,
    Similarity,
    Predict,
    Tokenize,
    Decode,
}

#[derive(Debug)]
pub struct HttpRow {
    pub method: &'static str,
    pub path: &'static str,
    pub body: Body,
}

/// How big a request an attack sends (each builder makes it as the surface's fields allow).
#[derive(Clone, Copy, Debug)]
pub enum Size {
    /// The least a valid request carries: what a flood sends.
    Cheapest,
    /// About this many bytes, in as few inputs as the surface takes: the longest texts.
    Long(usize),
    /// About this many bytes in as many inputs as the surface takes, every field that is copied
    /// per input (`prompt_name`, a query) filled: per-input amplification.
    Many(usize),
    /// A small request whose answer is large, as far as the surface allows: what a client that
    /// never reads its answers asks for.
    BigAnswer,
}

const fn tei(path: &'static str, message: Message, client_stream: bool) -> GrpcRow {
    GrpcRow { path, message, wrapped: false, client_stream, endless: false }
}

const fn watch(path: &'static str, message: Message) -> GrpcRow {
    GrpcRow { path, message, wrapped: false, client_stream: false, endless: true }
}

const fn manager(path: &'static str, message: Message, client_stream: bool) -> GrpcRow {
    let wrapped = !matches!(message, Message::Arrow | Message::SparseArrow);
    GrpcRow { path, message, wrapped, client_stream, endless: false }
}

use Message::*;

/// Every method the gRPC port serves: tei.v1 (`vocab::rpc::RPCS`), tei-manager's
/// `tei_multiplexer.v1`, standard health, and reflection in both versions.
pub const GRPC: &[GrpcRow] = &[
    tei("/tei.v1.Info/Info", Info, false),
    tei("/tei.v1.Embed/Embed", Embed, false),
    tei("/tei.v1.Embed/EmbedStream", Embed, true),
    tei("/tei.v1.Embed/EmbedSparse", EmbedSparse, false),
    tei("/tei.v1.Embed/EmbedSparseStream", EmbedSparse, true),
    tei("/tei.v1.Embed/EmbedAll", EmbedAll, false),
    tei("/tei.v1.Embed/EmbedAllStream", EmbedAll, true),
    tei("/tei.v1.Predict/Predict", Predict, false),
    tei("/tei.v1.Predict/PredictPair", PredictPair, false),
    tei("/tei.v1.Predict/PredictStream", Predict, true),
    tei("/tei.v1.Predict/PredictPairStream", PredictPair, true),
    tei("/tei.v1.Rerank/Rerank", Rerank, false),
    tei("/tei.v1.Rerank/RerankStream", RerankStream, true),
    tei("/tei.v1.Tokenize/Tokenize", Encode, false),
    tei("/tei.v1.Tokenize/TokenizeStream", Encode, true),
    tei("/tei.v1.Tokenize/Decode", Decode, false),
    tei("/tei.v1.Tokenize/DecodeStream", Decode, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/Info", Info, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/Embed", Embed, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedStream", Embed, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedSparse", EmbedSparse, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedSparseStream", EmbedSparse, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedAll", EmbedAll, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedAllStream", EmbedAll, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedArrow", Arrow, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedArrowStream", Arrow, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/EmbedSparseArrow", SparseArrow, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/Predict", Predict, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/PredictPair", PredictPair, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/PredictStream", Predict, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/PredictPairStream", PredictPair, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/Rerank", Rerank, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/RerankStream", RerankStream, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/Tokenize", Encode, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/TokenizeStream", Encode, true),
    manager("/tei_multiplexer.v1.TeiMultiplexer/Decode", Decode, false),
    manager("/tei_multiplexer.v1.TeiMultiplexer/DecodeStream", Decode, true),
    tei("/grpc.health.v1.Health/Check", HealthCheck, false),
    watch("/grpc.health.v1.Health/Watch", HealthCheck),
    tei("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Reflection, true),
    tei("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Reflection, true),
];

const fn get(path: &'static str) -> HttpRow {
    HttpRow { method: "GET", path, body: Body::None }
}

const fn post(path: &'static str, body: Body) -> HttpRow {
    HttpRow { method: "POST", path, body }
}

/// Every route of the HTTP front (`front::http::ROUTES`).
pub const HTTP: &[HttpRow] = &[
    get("/"),
    post("/", Body::Embed),
    post("/invocations", Body::Embed),
    post("/embed", Body::Embed),
    post("/embed_sparse", Body::Embed),
    post("/embed_all", Body::EmbedAll),
    post("/predict", Body::Predict),
    post("/rerank", Body::Rerank),
    post("/similarity", Body::Similarity),
    post("/tokenize", Body::Tokenize),
    post("/decode", Body::Decode),
    get("/info"),
    get("/health"),
    get("/ping"),
    post("/v1/embeddings", Body::OpenAi),
    post("/embeddings", Body::OpenAi),
];
