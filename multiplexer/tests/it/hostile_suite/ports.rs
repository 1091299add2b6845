//! Once per port (gRPC, HTTP, admin): one client opens more idle connections than the port
//! takes, then a new caller from another address and the kubelet's `/readyz` on the admin port
//! are still served.

use std::net::{IpAddr, SocketAddr};

use super::client::{connect_from, h2, http_call_from, http_request};
use super::report::Report;
use super::sidecar::Sidecar;
use super::sim;
use super::steady::grpc_embed;
use crate::support::sim as start_sim;

/// More than each port's connection cap (`--max-connections`' 1,024; the admin port's 256, of
/// which one address may hold 32).
const IDLE_GRPC_HTTP: usize = 1100;
const IDLE_ADMIN: usize = 300;

const ATTACKER: [u8; 4] = [127, 0, 0, 1];
const NEW_CALLER: [u8; 4] = [127, 0, 0, 2];
const KUBELET: [u8; 4] = [127, 0, 0, 3];

/// What keeps an idle connection open: an HTTP/2 connection's handle (it said its preface and
/// SETTINGS), or a TCP connection that said nothing.
type Idle = Box<dyn std::any::Any + Send>;

async fn idle(addr: SocketAddr, n: usize, speak_h2: bool) -> Vec<Idle> {
    let mut idle: Vec<Idle> = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(tcp) = connect_from(IpAddr::from(ATTACKER), addr).await else { continue };
        match speak_h2 {
            true => {
                if let Ok(client) = h2(tcp, None).await {
                    idle.push(Box::new(client));
                }
            }
            false => idle.push(Box::new(tcp)),
        }
    }
    idle
}

async fn readyz(sidecar: &Sidecar) -> Result<(), String> {
    let request = http_request("GET", "/readyz", &[], b"");
    let answer = http_call_from(IpAddr::from(KUBELET), sidecar.admin, &request).await?;
    match answer.status {
        200 => Ok(()),
        status => Err(format!("/readyz {status}")),
    }
}

async fn new_caller(port: &str, sidecar: &Sidecar) -> Result<(), String> {
    let from = IpAddr::from(NEW_CALLER);
    match port {
        "grpc" => {
            let tcp = connect_from(from, sidecar.grpc).await.map_err(|e| e.to_string())?;
            grpc_embed(&h2(tcp, None).await?).await
        }
        "http" => {
            let request = http_request("POST", "/embed", &[], br#"{"inputs": "a new caller"}"#);
            let answer = http_call_from(from, sidecar.http, &request).await?;
            (answer.status == 200).then_some(()).ok_or_else(|| format!("/embed {}", answer.status))
        }
        _ => {
            let answer = http_call_from(from, sidecar.admin, &http_request("GET", "/metrics", &[], b"")).await?;
            (answer.status == 200).then_some(()).ok_or_else(|| format!("/metrics {}", answer.status))
        }
    }
}

#[tokio::test]
async fn idle_connections_from_one_client_leave_every_port_to_others() {
    let sim = start_sim(sim).await;
    let mut sidecar = Sidecar::start(sim.addr()).await;
    let mut report = Report::new("idle connections");
    let ports = [
        ("grpc", sidecar.grpc, IDLE_GRPC_HTTP, true),
        ("http", sidecar.http, IDLE_GRPC_HTTP, true),
        ("admin", sidecar.admin, IDLE_ADMIN, false),
    ];
    for (port, addr, n, speak_h2) in ports {
        let held = idle(addr, n, speak_h2).await;
        let served = new_caller(port, &sidecar).await;
        let ready = readyz(&sidecar).await;
        let figure =
            format!("{} idle connections from one client; a new caller: {served:?}; /readyz: {ready:?}", held.len());
        report.check(port, served.is_ok() && ready.is_ok(), figure);
        drop(held);
        report.after_row(port, &mut sidecar).await;
    }
    report.finish();
    sim.shutdown().await;
}
