//! Compiles tei/v1/tei.proto and tei-manager's tei_multiplexer/v1/multiplexer.proto (which imports
//! it) with protox (a pure-Rust protobuf compiler), so no machine needs `protoc`, and keeps each
//! package's encoded descriptor set for gRPC server reflection: `tei.v1`'s alone (what TEI and its
//! simulator serve), and tei-manager's with `tei.v1` inside it (what the multiplexer serves besides).
use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (tei, manager) = ("tei/v1/tei.proto", "tei_multiplexer/v1/multiplexer.proto");
    println!("cargo:rerun-if-changed={tei}");
    println!("cargo:rerun-if-changed={manager}");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let tei_only = protox::compile([tei], ["."])?;
    std::fs::write(out.join("tei_v1_descriptor.bin"), tei_only.encode_to_vec())?;
    let both = protox::compile([manager], ["."])?;
    std::fs::write(out.join("tei_multiplexer_v1_descriptor.bin"), both.encode_to_vec())?;
    // Arrow payloads as `Bytes`: a 100,000-row batch is split off the received message, not copied.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".tei_multiplexer.v1")
        .compile_fds(both)?;
    Ok(())
}
