//! The `DevicePlugin` service: a fixed set of healthy fake GPUs.
use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt as _, future, stream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::{HEALTHY, REPLICA_SEPARATOR, VISIBLE_DEVICES_ENV};

/// The options the plugin registers with and reports: no PreStartContainer call needed, and a
/// preferred allocation offered (the lowest-numbered free devices).
pub(crate) const OPTIONS: DevicePluginOptions =
    DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true };

/// Serves the device list and allocations; every `ListAndWatch` stream ends when `stop` is
/// cancelled, so the server can shut down gracefully.
#[derive(Clone, Debug)]
pub struct FakeGpus {
    resource_name: Arc<str>,
    device_ids: Arc<[String]>,
    stop: CancellationToken,
}

impl FakeGpus {
    pub fn new(resource_name: &str, device_ids: Vec<String>, stop: CancellationToken) -> Self {
        Self { resource_name: resource_name.into(), device_ids: device_ids.into(), stop }
    }

    fn devices(&self) -> Vec<Device> {
        self.device_ids.iter().map(|id| Device { id: id.clone(), health: HEALTHY.to_owned(), topology: None }).collect()
    }

    fn check_known<'a>(&self, ids: impl IntoIterator<Item = &'a String>) -> Result<(), Status> {
        match ids.into_iter().find(|id| !self.device_ids.contains(id)) {
            Some(unknown) => Err(Status::invalid_argument(format!(
                "{unknown} is not a {} device of this plugin",
                self.resource_name
            ))),
            None => Ok(()),
        }
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl DevicePlugin for FakeGpus {
    async fn get_device_plugin_options(&self, _: Request<Empty>) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(OPTIONS))
    }

    type ListAndWatchStream = ResponseStream<ListAndWatchResponse>;

    /// The device list once (the devices never change), then an open stream until the plugin
    /// stops: the kubelet marks a plugin's devices unhealthy when its stream ends.
    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Self::ListAndWatchStream>, Status> {
        tracing::info!(devices = self.device_ids.len(), "the kubelet is watching the devices");
        let list = ListAndWatchResponse { devices: self.devices() };
        let until_stopped = stream::once(self.stop.clone().cancelled_owned()).filter_map(|()| future::ready(None));
        Ok(Response::new(Box::pin(stream::once(future::ready(Ok(list))).chain(until_stopped))))
    }

    /// The lowest-numbered devices, after those the kubelet says must be included.
    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for wanted in request.into_inner().container_requests {
            self.check_known(wanted.available_device_i_ds.iter().chain(&wanted.must_include_device_i_ds))?;
            let size = usize::try_from(wanted.allocation_size).unwrap_or(0);
            let available: HashSet<&String> = wanted.available_device_i_ds.iter().collect();
            let mut device_ids: Vec<String> = wanted.must_include_device_i_ds.clone();
            for id in self.device_ids.iter() {
                if device_ids.len() >= size {
                    break;
                }
                if available.contains(id) && !device_ids.contains(id) {
                    device_ids.push(id.clone());
                }
            }
            container_responses.push(ContainerPreferredAllocationResponse { device_i_ds: device_ids });
        }
        Ok(Response::new(PreferredAllocationResponse { container_responses }))
    }

    /// Tells each container which GPUs it got, as NVIDIA's plugin does with
    /// `NVIDIA_VISIBLE_DEVICES`: the GPU behind each replica of a shared one, once, so pods
    /// sharing a GPU see the same device. There are no device files to mount.
    async fn allocate(&self, request: Request<AllocateRequest>) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            self.check_known(&container.devices_ids)?;
            if container.devices_ids.is_empty() {
                return Err(Status::invalid_argument("an allocation needs at least one device"));
            }
            tracing::info!(devices = %container.devices_ids.join(","), "allocated");
            let mut gpus: Vec<&str> = Vec::new();
            for id in &container.devices_ids {
                let gpu = id.split_once(REPLICA_SEPARATOR).map_or(id.as_str(), |(gpu, _)| gpu);
                if !gpus.contains(&gpu) {
                    gpus.push(gpu);
                }
            }
            container_responses.push(ContainerAllocateResponse {
                envs: [(VISIBLE_DEVICES_ENV.to_owned(), gpus.join(","))].into(),
                ..Default::default()
            });
        }
        Ok(Response::new(AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
