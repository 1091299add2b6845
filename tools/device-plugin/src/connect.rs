//! gRPC over a Unix socket: tonic dials through a connector that opens the socket whatever the
//! URI says (the kubelet's API lives on sockets, not TCP ports).
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel to the gRPC server on the Unix socket `path`.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    // The authority is what the kubelet's own clients send; the socket decides where it goes.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}
