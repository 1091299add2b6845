//! Compiles the kubelet's device-plugin API (proto/v1beta1/api.proto, vendored) with protox, a
//! pure-Rust protobuf compiler, so no machine needs `protoc`. Both sides are generated: the plugin
//! serves `DevicePlugin` and calls the kubelet's `Registration`; the tests play the kubelet.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile(["v1beta1/api.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
