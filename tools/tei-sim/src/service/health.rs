//! The standard `grpc.health.v1.Health` service. Its status is read straight from the fault
//! watch rather than kept in tonic-health's `HealthReporter`, whose async setters would let a
//! check made right after [`crate::SimHandle::set_fault`] still see the old status.

use futures::StreamExt;
use tokio_stream::wrappers::WatchStream;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::Sim;
use super::stream::ResponseStream;
use crate::config::Fault;
use teifleet_proto::v1::{embed_server, info_server, predict_server, rerank_server, tokenize_server};

const SERVICES: [&str; 6] = [
    "",
    <info_server::InfoServer<Sim> as NamedService>::NAME,
    <embed_server::EmbedServer<Sim> as NamedService>::NAME,
    <predict_server::PredictServer<Sim> as NamedService>::NAME,
    <rerank_server::RerankServer<Sim> as NamedService>::NAME,
    <tokenize_server::TokenizeServer<Sim> as NamedService>::NAME,
];

#[derive(Clone, Debug)]
pub(crate) struct SimHealth {
    sim: Sim,
}

pub(crate) fn health_service(sim: Sim) -> HealthServer<SimHealth> {
    HealthServer::new(SimHealth { sim })
}

fn status_of(fault: Fault) -> HealthCheckResponse {
    let status = match fault {
        Fault::Fail => ServingStatus::NotServing,
        Fault::None | Fault::Stall => ServingStatus::Serving,
    };
    HealthCheckResponse { status: status.into() }
}

fn known(service: &str) -> Result<(), Status> {
    if SERVICES.contains(&service) { Ok(()) } else { Err(Status::not_found("service not registered")) }
}

#[tonic::async_trait]
impl Health for SimHealth {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        known(&request.get_ref().service)?;
        Ok(Response::new(status_of(self.sim.state.fault())))
    }

    type WatchStream = ResponseStream<HealthCheckResponse>;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        known(&request.get_ref().service)?;
        let state = &self.sim.state;
        // Stall and none both read SERVING, so collapse repeats as the standard watch does.
        let mut last = None;
        let updates = WatchStream::new(state.fault.subscribe())
            .map(status_of)
            .filter(move |status| {
                let changed = last != Some(status.status);
                last = Some(status.status);
                std::future::ready(changed)
            })
            .map(Ok)
            .take_until(state.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(updates)))
    }
}
