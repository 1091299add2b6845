//! The Info service.

use teifleet_proto::v1::info_server::Info;
use teifleet_proto::v1::{InfoRequest, InfoResponse, ModelType};
use tonic::{Request, Response, Status};

use super::{Sim, saturate};

#[tonic::async_trait]
impl Info for Sim {
    async fn info(&self, _request: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let config = &self.state.config;
        self.direct(|| {
            Ok(InfoResponse {
                version: format!("sim-{}", env!("CARGO_PKG_VERSION")),
                sha: None,
                docker_label: None,
                model_id: config.model_id.clone(),
                model_sha: None,
                model_dtype: "float16".to_owned(),
                model_type: ModelType::Embedding.into(),
                max_concurrent_requests: saturate(config.max_concurrent_requests),
                max_input_length: 512,
                max_batch_tokens: saturate(config.max_batch_tokens),
                max_batch_requests: config.max_batch_requests.map(saturate),
                max_client_batch_size: saturate(config.max_client_batch_size),
                tokenization_workers: 1,
            })
        })
    }
}
