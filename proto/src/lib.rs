//! TEI's `tei.v1` gRPC interface: messages, clients and server traits generated from
//! `tei/v1/tei.proto`, the descriptor set for server reflection, and the pass-through
//! [`BytesCodec`] proxies use to forward messages without decoding them.
#![forbid(unsafe_code)]

/// Generated code for package `tei.v1`.
#[allow(clippy::all, clippy::pedantic, rust_2018_idioms, missing_docs)]
pub mod tei {
    pub mod v1 {
        tonic::include_proto!("tei.v1");
    }
}

pub use tei::v1;

pub mod bytes_codec;
pub use bytes_codec::BytesCodec;

/// Encoded `FileDescriptorSet` of `tei.v1`, for `tonic-reflection`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tei_v1_descriptor.bin"));
