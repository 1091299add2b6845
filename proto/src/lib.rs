//! TEI's `tei.v1` gRPC interface: messages, clients and server traits generated from
//! `tei/v1/tei.proto`, the descriptor set for server reflection, and the pass-through
//! [`BytesCodec`] proxies use to forward messages without decoding them. Beside it, tei-manager's
//! `tei_multiplexer.v1` (`tei_multiplexer/v1/multiplexer.proto`), which wraps `tei.v1`.
#![forbid(unsafe_code)]

/// Generated code for package `tei.v1`.
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms, missing_docs)]
pub mod tei {
    pub mod v1 {
        tonic::include_proto!("tei.v1");
    }
}

pub use tei::v1;

/// Generated code for tei-manager's package `tei_multiplexer.v1`.
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms, missing_docs)]
pub mod tei_multiplexer {
    pub mod v1 {
        tonic::include_proto!("tei_multiplexer.v1");
    }
}

pub mod bytes_codec;
pub use bytes_codec::BytesCodec;

/// Encoded `FileDescriptorSet` of `tei.v1`, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tei_v1_descriptor.bin"));

/// Encoded `FileDescriptorSet` of `tei_multiplexer.v1` (with `tei.v1`, which it imports), for
/// `tonic-reflection`.
pub const TEI_MULTIPLEXER_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tei_multiplexer_v1_descriptor.bin"));
