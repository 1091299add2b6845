//! Compiles tei/v1/tei.proto with protox (a pure-Rust protobuf compiler), so no machine needs
//! `protoc`, and keeps the encoded descriptor set for gRPC server reflection.
use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "tei/v1/tei.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["."])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("tei_v1_descriptor.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
