//! The simulator as a drop-in for TEI's container: the `tei-sim` binary started the way a pod
//! starts TEI, with the arguments and environment the operator renders for a pool's `tei`
//! container (read from the operator's golden files, so a change there is tested here), probed as
//! the kubelet probes it (gRPC health) and called as the multiplexer calls it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_norway::Value;
use teifleet_proto::v1::InfoRequest;
use teifleet_proto::v1::info_client::InfoClient;
use teifleet_testkit::process::ChildGuard;
use teifleet_testkit::{http, prom};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::{bounded, embed_request};

/// What a container runtime puts in `$HOSTNAME`: the pod's name, which is not an IP.
const POD_NAME: &str = "bge-small-5d8f7c9b4-x2x7q";
/// The ports the operator renders for TEI; replaced by port 0 so tests can run side by side (the
/// ports bound are read from the simulator's log: [`bound_ports`]).
const RENDERED_PORT: &str = "--port=8080";
const RENDERED_PROMETHEUS_PORT: &str = "--prometheus-port=9000";

/// The `tei` container of a rendered Deployment.
struct TeiContainer {
    args: Vec<String>,
    env: Vec<(String, String)>,
}

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../operator/tests/golden")
}

fn read_yaml(file: &Path) -> Value {
    serde_norway::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

fn has_tei_container(deployment: &Value) -> bool {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .is_some_and(|containers| containers.iter().any(|c| c["name"] == "tei"))
}

fn tei_container(deployment: &Value) -> TeiContainer {
    let containers = deployment["spec"]["template"]["spec"]["containers"].as_sequence().unwrap();
    let tei = containers.iter().find(|c| c["name"] == "tei").expect("a tei container");
    let strings = |v: &Value| v.as_str().unwrap().to_owned();
    let args = tei["args"].as_sequence().unwrap().iter().map(strings).collect();
    let env = tei["env"]
        .as_sequence()
        .map(|env| env.iter().filter(|e| e["value"].is_string()).map(|e| (strings(&e["name"]), strings(&e["value"]))))
        .into_iter()
        .flatten()
        .collect();
    TeiContainer { args, env }
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
}

/// A `tei-sim` process with the environment a pod gives its container and nothing else.
fn spawn(name: &str, args: &[String], env: &[(String, String)]) -> ChildGuard {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tei-sim"));
    command.env_clear().env("HOSTNAME", POD_NAME).envs(env.iter().map(|(k, v)| (k, v))).args(args);
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tei-sim-as-tei-{name}-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    ChildGuard::spawn_logged(name, command, log).unwrap()
}

async fn connect(addr: SocketAddr) -> Option<Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_timeout(Duration::from_secs(1));
    endpoint.connect().await.ok()
}

/// The kubelet's gRPC probe: `grpc.health.v1.Health/Check` for the empty service name.
async fn serving(addr: SocketAddr) -> bool {
    let Some(channel) = connect(addr).await else { return false };
    let request = HealthCheckRequest { service: String::new() };
    HealthClient::new(channel).check(request).await.is_ok_and(|r| r.into_inner().status() == ServingStatus::Serving)
}

/// The ports of the addresses on the simulator's "serving" line, gRPC's and the admin (metrics)
/// port's, once it is logged: it binds port 0 when told so, and says which ports it got.
async fn bound_ports(sim: &mut ChildGuard) -> (u16, u16) {
    let logged = |sim: &ChildGuard| {
        let log = sim.log_text();
        let line = log.lines().find(|line| line.contains("TEI simulator serving"))?;
        Some((port_of(line, "addr")?, port_of(line, "admin")?))
    };
    for _ in 0..300 {
        if let Some(ports) = logged(sim) {
            return ports;
        }
        assert!(sim.exit_status().is_none(), "{} exited before serving:\n{}", sim.name(), sim.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} logged no serving line in 15 s:\n{}", sim.name(), sim.log_text());
}

/// The port of the address in `field` on a log line, pretty (`addr=0.0.0.0:1234`) or JSON
/// (`"addr":"0.0.0.0:1234"`).
fn port_of(line: &str, field: &str) -> Option<u16> {
    let (_, rest) = line.split_once(&format!(" {field}=")).or_else(|| line.split_once(&format!("\"{field}\":\"")))?;
    let addr: String = rest.chars().take_while(|c| !c.is_whitespace() && *c != '"').collect();
    addr.parse::<SocketAddr>().ok().map(|addr| addr.port())
}

async fn wait_serving(sim: &mut ChildGuard, addr: SocketAddr) {
    if let Err(error) = sim.wait_ready(Duration::from_secs(15), || serving(addr)).await {
        panic!("{error}\n{}", sim.log_text());
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// Starts the simulator with a golden file's `tei` container and checks it serves as TEI would.
async fn run_rendered(file: &Path, deployment: &Value) {
    let name = file.file_stem().unwrap().to_string_lossy().into_owned();
    let container = tei_container(deployment);
    assert!(container.args.iter().any(|a| a == RENDERED_PORT), "{name}: TEI's gRPC port moved; update this test");
    assert!(container.args.iter().any(|a| a == RENDERED_PROMETHEUS_PORT), "{name}: TEI's metrics port moved");
    let args: Vec<String> = container
        .args
        .iter()
        .map(|a| match a.as_str() {
            RENDERED_PORT => "--port=0".to_owned(),
            RENDERED_PROMETHEUS_PORT => "--prometheus-port=0".to_owned(),
            _ => a.clone(),
        })
        .collect();
    let mut sim = spawn(&name, &args, &container.env);
    let (grpc, metrics) = bound_ports(&mut sim).await;
    let grpc = loopback(grpc);
    wait_serving(&mut sim, grpc).await;

    let channel = connect(grpc).await.expect("connects");
    let info = InfoClient::new(channel.clone()).info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(Some(info.model_id.as_str()), flag(&args, "--model-id"), "{name}");
    let number = |flag_name, default: u32| flag(&args, flag_name).map_or(default, |v| v.parse().unwrap());
    assert_eq!(info.max_concurrent_requests, number("--max-concurrent-requests", 512), "{name}");
    assert_eq!(info.max_batch_tokens, number("--max-batch-tokens", 16384), "{name}");
    assert_eq!(info.max_client_batch_size, number("--max-client-batch-size", 32), "{name}");
    let mut embed = teifleet_proto::v1::embed_client::EmbedClient::new(channel);
    let answer = embed.embed(embed_request("what the multiplexer sends")).await.unwrap().into_inner();
    assert_eq!(answer.embeddings.len(), 384, "{name}");

    // TEI listens where the operator puts it (`--hostname`, the pod's loopback), its metrics
    // port too: the sidecar relays those.
    let text = http::get(loopback(metrics), "/metrics").await.expect("metrics answer");
    assert_eq!(prom::value(&text, "te_request_count"), Some(1.0), "{name}:\n{text}");
    let host = flag(&args, "--hostname").unwrap_or("0.0.0.0");
    assert!(sim.log_text().contains(&format!("addr={host}:")), "{name} should listen on {host}:\n{}", sim.log_text());

    // The kubelet stops a container with SIGTERM; TEI exits cleanly and so must its stand-in.
    let status = sim.terminate(Duration::from_secs(10)).expect("exits on SIGTERM");
    assert!(status.success(), "{name} exited with {status}:\n{}", sim.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_as_tei_with_the_operators_rendered_arguments() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let deployments: Vec<(PathBuf, Value)> = files
        .into_iter()
        .map(|file| {
            let yaml = read_yaml(&file);
            (file, yaml)
        })
        // A pool's Deployments; the activator's is one too, with no `tei` container.
        .filter(|(_, yaml)| yaml["kind"] == "Deployment" && has_tei_container(yaml))
        .collect();
    assert!(deployments.len() >= 2, "no rendered Deployments found in {}", golden_dir().display());
    for (file, deployment) in &deployments {
        bounded(run_rendered(file, deployment)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_teis_environment_variables() {
    bounded(async {
        let env: Vec<(String, String)> = [
            ("MODEL_ID", "acme/from-env"),
            ("HOSTNAME", "127.0.0.1"),
            ("PORT", "0"),
            ("PROMETHEUS_PORT", "0"),
            ("MAX_CONCURRENT_REQUESTS", "7"),
            ("MAX_BATCH_TOKENS", "1024"),
            ("JSON_OUTPUT", "true"),
            ("DTYPE", "float16"),
            ("AUTO_TRUNCATE", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut sim = spawn("env", &[], &env);
        let (grpc, metrics) = bound_ports(&mut sim).await;
        wait_serving(&mut sim, loopback(grpc)).await;
        let info = InfoClient::new(connect(loopback(grpc)).await.unwrap()).info(InfoRequest {}).await.unwrap();
        let info = info.into_inner();
        assert_eq!(
            (info.model_id.as_str(), info.max_concurrent_requests, info.max_batch_tokens),
            ("acme/from-env", 7, 1024)
        );
        assert!(http::get(loopback(metrics), "/metrics").await.is_some());
        let log = sim.log_text();
        let lines: Vec<&str> = log.lines().collect();
        assert!(!lines.is_empty() && lines.iter().all(|l| l.starts_with('{')), "JSON_OUTPUT gives JSON lines:\n{log}");
        assert!(log.contains("127.0.0.1:") && !log.contains("0.0.0.0"), "HOSTNAME=127.0.0.1 is honoured:\n{log}");
        assert!(log.contains("dtype,auto-truncate"), "ignored flags are named:\n{log}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_listen_flags_win_over_teis_environment() {
    bounded(async {
        let args = ["--listen=127.0.0.1:0".to_owned(), "--admin-listen=127.0.0.1:0".to_owned()];
        // $HOSTNAME is set as in any container, and a stray $PORT must not move the simulator.
        let env = [("PORT".to_owned(), "1".to_owned())];
        let mut sim = spawn("own-flags", &args, &env);
        let (grpc, admin) = bound_ports(&mut sim).await;
        assert_ne!(grpc, 1, "$PORT does not move it");
        wait_serving(&mut sim, loopback(grpc)).await;
        assert!(http::get(loopback(admin), "/healthz").await.is_some(), "admin port on --admin-listen");
    })
    .await;
}
