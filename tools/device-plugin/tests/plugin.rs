//! The plugin against a stand-in kubelet on Unix sockets in a scratch directory: registration,
//! the device list, allocations, registering again after a kubelet restart, and a clean stop.
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use teifleet_fake_gpu_plugin::api::device_plugin_client::DevicePluginClient;
use teifleet_fake_gpu_plugin::api::registration_server::{Registration, RegistrationServer};
use teifleet_fake_gpu_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty, PreferredAllocationRequest,
    RegisterRequest,
};
use teifleet_fake_gpu_plugin::{Config, HEALTHY, KUBELET_SOCKET, VISIBLE_DEVICES_ENV, run, unix_channel};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const WAIT: Duration = Duration::from_secs(10);

/// A directory for one test's sockets, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "teifleet-fgp-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The kubelet's registration service: passes each request on, answers with `answer`.
struct Kubelet {
    registrations: mpsc::UnboundedSender<RegisterRequest>,
    answer: Result<(), Status>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.registrations.send(request.into_inner());
        self.answer.clone().map(|()| Response::new(Empty {}))
    }
}

/// A stand-in kubelet serving `kubelet.sock` in `dir` until dropped.
struct FakeKubelet {
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeKubelet {
    fn start(dir: &Path, answer: Result<(), Status>) -> (Self, mpsc::UnboundedReceiver<RegisterRequest>) {
        let socket = dir.join(KUBELET_SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("kubelet socket");
        let (registrations, received) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let router =
            tonic::transport::Server::builder().add_service(RegistrationServer::new(Kubelet { registrations, answer }));
        let server = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("fake kubelet serves");
        });
        (Self { stop: Some(stop), server }, received)
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        let _ = tokio::time::timeout(WAIT, &mut self.server).await;
    }
}

fn config(dir: &Path) -> Config {
    let mut config = Config::new("nvidia.com/gpu", 3, "fake-gpu", dir, "fake-gpu.sock");
    config.check_interval = Duration::from_millis(50);
    config
}

async fn next_registration(received: &mut mpsc::UnboundedReceiver<RegisterRequest>) -> RegisterRequest {
    tokio::time::timeout(WAIT, received.recv()).await.expect("a registration in time").expect("kubelet running")
}

async fn plugin_client(socket: &Path) -> DevicePluginClient<tonic::transport::Channel> {
    DevicePluginClient::new(unix_channel(socket).await.expect("the plugin's socket answers"))
}

#[tokio::test]
async fn registers_lists_allocates_and_stops_cleanly() {
    let scratch = Scratch::new();
    let (kubelet, mut received) = FakeKubelet::start(&scratch.0, Ok(()));
    let config = config(&scratch.0);
    let socket = config.socket_path();
    let (stop, stopped) = oneshot::channel::<()>();
    let plugin = tokio::spawn(run(config, async {
        let _ = stopped.await;
    }));

    let registration = next_registration(&mut received).await;
    assert_eq!(registration.version, "v1beta1");
    assert_eq!(registration.resource_name, "nvidia.com/gpu");
    assert_eq!(registration.endpoint, "fake-gpu.sock");
    let options = registration.options.expect("options are sent");
    assert!(!options.pre_start_required);

    let mut client = plugin_client(&socket).await;
    let served_options = client.get_device_plugin_options(Empty {}).await.expect("options").into_inner();
    assert_eq!(served_options, options);

    let mut watch = client.list_and_watch(Empty {}).await.expect("ListAndWatch").into_inner();
    let list = watch.next().await.expect("a device list").expect("no error");
    let ids: Vec<&str> = list.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["fake-gpu-0", "fake-gpu-1", "fake-gpu-2"]);
    assert!(list.devices.iter().all(|d| d.health == HEALTHY));

    let allocated = client
        .allocate(AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest { devices_ids: vec!["fake-gpu-2".into(), "fake-gpu-0".into()] },
                ContainerAllocateRequest { devices_ids: vec!["fake-gpu-1".into()] },
            ],
        })
        .await
        .expect("Allocate")
        .into_inner();
    let visible: Vec<&str> =
        allocated.container_responses.iter().map(|c| c.envs[VISIBLE_DEVICES_ENV].as_str()).collect();
    assert_eq!(visible, ["fake-gpu-2,fake-gpu-0", "fake-gpu-1"]);

    let unknown = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: vec!["fake-gpu-9".into()] }],
        })
        .await
        .expect_err("an unknown device is refused");
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument, "{unknown}");

    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["fake-gpu-2".into(), "fake-gpu-1".into(), "fake-gpu-0".into()],
                must_include_device_i_ds: vec!["fake-gpu-2".into()],
                allocation_size: 2,
            }],
        })
        .await
        .expect("GetPreferredAllocation")
        .into_inner();
    assert_eq!(preferred.container_responses[0].device_i_ds, ["fake-gpu-2", "fake-gpu-0"]);

    // Stopping ends the kubelet's stream, stops the server and removes the socket.
    stop.send(()).expect("plugin running");
    tokio::time::timeout(WAIT, plugin).await.expect("the plugin stops in time").expect("no panic").expect("no error");
    let end = tokio::time::timeout(WAIT, watch.next()).await.expect("the stream ends in time");
    assert!(end.as_ref().is_none_or(|item| item.is_err()), "the stream ends: {end:?}");
    assert!(!socket.exists(), "the socket is removed");
    kubelet.stop().await;
}

#[tokio::test]
async fn waits_for_the_kubelet_and_registers_again_when_it_restarts() {
    let scratch = Scratch::new();
    let config = config(&scratch.0);
    let socket = config.socket_path();
    let (stop, stopped) = oneshot::channel::<()>();
    // The plugin starts first, as it may on a node: it serves and waits for the kubelet.
    let plugin = tokio::spawn(run(config, async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (kubelet, mut received) = FakeKubelet::start(&scratch.0, Ok(()));
    next_registration(&mut received).await;

    // A restarting kubelet removes every plugin socket and serves a new kubelet.sock.
    kubelet.stop().await;
    std::fs::remove_file(&socket).expect("the plugin's socket exists");
    let (kubelet, mut received) = FakeKubelet::start(&scratch.0, Ok(()));
    let again = next_registration(&mut received).await;
    assert_eq!(again.endpoint, "fake-gpu.sock");
    let mut client = plugin_client(&socket).await;
    let list = client.list_and_watch(Empty {}).await.expect("ListAndWatch").into_inner().next().await;
    assert_eq!(list.expect("a list").expect("no error").devices.len(), 3);

    stop.send(()).expect("plugin running");
    tokio::time::timeout(WAIT, plugin).await.expect("the plugin stops in time").expect("no panic").expect("no error");
    kubelet.stop().await;
}

/// A kubelet that restarts and binds `kubelet.sock` again, leaving the plugin's socket where it
/// was. On ext4 the new socket gets the old one's inode number (the freed number is reused at
/// once), so a plugin watching the inode alone never registered again: the node lost its GPUs
/// (`make demo`: "timed out waiting for 2 nvidia.com/gpu").
#[tokio::test]
async fn registers_again_when_the_kubelet_socket_is_recreated_in_place() {
    let scratch = Scratch::new();
    let kubelet_socket = scratch.0.join(KUBELET_SOCKET);
    let (mut kubelet, mut received) = FakeKubelet::start(&scratch.0, Ok(()));
    let (stop, stopped) = oneshot::channel::<()>();
    let plugin = tokio::spawn(run(config(&scratch.0), async {
        let _ = stopped.await;
    }));
    next_registration(&mut received).await;
    for _ in 0..3 {
        let before = std::fs::metadata(&kubelet_socket).expect("kubelet.sock").ino();
        kubelet.stop().await;
        (kubelet, received) = FakeKubelet::start(&scratch.0, Ok(()));
        let after = std::fs::metadata(&kubelet_socket).expect("kubelet.sock").ino();
        eprintln!("kubelet.sock inode {before} -> {after}");
        let again = next_registration(&mut received).await;
        assert_eq!(again.endpoint, "fake-gpu.sock", "registered with the restarted kubelet");
    }
    stop.send(()).expect("plugin running");
    tokio::time::timeout(WAIT, plugin).await.expect("the plugin stops in time").expect("no panic").expect("no error");
    kubelet.stop().await;
}

#[tokio::test]
async fn stops_when_the_kubelet_refuses_it() {
    let scratch = Scratch::new();
    let (kubelet, mut received) =
        FakeKubelet::start(&scratch.0, Err(Status::invalid_argument("nvidia.com/gpu is registered already")));
    let plugin = tokio::spawn(run(config(&scratch.0), std::future::pending()));
    next_registration(&mut received).await;
    let error =
        tokio::time::timeout(WAIT, plugin).await.expect("the plugin stops").expect("no panic").expect_err("refused");
    assert!(error.to_string().contains("registered already"), "{error}");
    assert!(!scratch.0.join("fake-gpu.sock").exists(), "the socket is removed");
    kubelet.stop().await;
}

#[tokio::test]
async fn refuses_a_configuration_that_cannot_work() {
    let scratch = Scratch::new();
    let mut no_devices = config(&scratch.0);
    no_devices.device_ids.clear();
    let mut bad_resource = config(&scratch.0);
    bad_resource.resource_name = "gpu".into();
    let mut kubelet_socket = config(&scratch.0);
    kubelet_socket.socket_name = KUBELET_SOCKET.into();
    for config in [no_devices, bad_resource, kubelet_socket] {
        let error = run(config, std::future::pending()).await.expect_err("invalid");
        assert!(error.to_string().starts_with("invalid configuration"), "{error}");
    }
}

#[tokio::test]
async fn a_shared_gpu_is_advertised_as_its_replicas_and_allocated_as_the_gpu_behind_them() {
    let scratch = Scratch::new();
    let (kubelet, mut received) = FakeKubelet::start(&scratch.0, Ok(()));
    let mut config = Config::shared("nvidia.com/gpu.shared", 2, 3, "fake-l4", &scratch.0, "shared.sock");
    config.check_interval = Duration::from_millis(50);
    let socket = config.socket_path();
    let (stop, stopped) = oneshot::channel::<()>();
    let plugin = tokio::spawn(run(config, async {
        let _ = stopped.await;
    }));
    assert_eq!(next_registration(&mut received).await.resource_name, "nvidia.com/gpu.shared");

    let mut client = plugin_client(&socket).await;
    let mut watch = client.list_and_watch(Empty {}).await.expect("ListAndWatch").into_inner();
    let list = watch.next().await.expect("a device list").expect("no error");
    let ids: Vec<&str> = list.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["fake-l4-0::0", "fake-l4-0::1", "fake-l4-0::2", "fake-l4-1::0", "fake-l4-1::1", "fake-l4-1::2"]);

    // Two pods given replicas of GPU 0 both see GPU 0; replicas of both GPUs show both, once each.
    let allocated = client
        .allocate(AllocateRequest {
            container_requests: vec![
                ContainerAllocateRequest { devices_ids: vec!["fake-l4-0::2".into()] },
                ContainerAllocateRequest { devices_ids: vec!["fake-l4-0::0".into()] },
                ContainerAllocateRequest {
                    devices_ids: vec!["fake-l4-1::0".into(), "fake-l4-0::1".into(), "fake-l4-1::1".into()],
                },
            ],
        })
        .await
        .expect("Allocate")
        .into_inner();
    let visible: Vec<&str> =
        allocated.container_responses.iter().map(|c| c.envs[VISIBLE_DEVICES_ENV].as_str()).collect();
    assert_eq!(visible, ["fake-l4-0", "fake-l4-0", "fake-l4-1,fake-l4-0"]);

    stop.send(()).expect("plugin running");
    tokio::time::timeout(WAIT, plugin).await.expect("the plugin stops in time").expect("no panic").expect("no error");
    kubelet.stop().await;
}
