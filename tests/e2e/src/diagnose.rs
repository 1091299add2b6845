//! What went wrong when pods on the real node never got where a test waited for them: the pods'
//! own reasons, the namespace's warnings and the kubelet's latest errors, in the failure message
//! (CI shows a failing test's output and nothing of the cluster's logs).

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams};
use teifleet_testkit::poll::try_eventually;

use crate::kubeconfig_path;

/// How many of the kubelet's error lines and the namespace's warnings a report shows.
const REPORT_LINES: usize = 6;

/// [`crate::eventually`] for a wait on pods in `pods`' namespace: a timeout panics with a report of
/// those pods, the namespace's warning events and the kubelet's latest errors.
pub async fn eventually_pods<T, F, Fut>(pods: &Api<Pod>, what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match try_eventually(what, timeout, check).await {
        Ok(value) => value,
        Err(error) => panic!("{error}\n{}", report(pods).await),
    }
}

/// The pods of `pods`' namespace (with the last log lines of each container not ready), the
/// namespace's latest warnings and the kubelet's latest errors.
pub async fn report(pods: &Api<Pod>) -> String {
    let mut out = String::new();
    match pods.list(&ListParams::default()).await {
        Ok(list) => {
            for pod in &list.items {
                describe(pod, &mut out);
                log_tails(pods, pod, &mut out).await;
            }
        }
        Err(error) => _ = writeln!(out, "pods could not be listed: {error}"),
    }
    let events: Api<Event> = Api::namespaced(pods.clone().into_client(), pods.namespace().unwrap_or("default"));
    if let Ok(list) = events.list(&ListParams::default().fields("type=Warning")).await {
        let mut warnings = list.items;
        warnings.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
        for event in warnings.iter().rev().take(REPORT_LINES).rev() {
            let object = event.involved_object.name.as_deref().unwrap_or("?");
            let reason = event.reason.as_deref().unwrap_or("?");
            let _ = writeln!(out, "warning {object}: {reason}: {}", event.message.as_deref().unwrap_or(""));
        }
    }
    let kubelet_log = kubeconfig_path().with_file_name("logs").join("kubelet.log");
    if let Ok(text) = std::fs::read_to_string(&kubelet_log) {
        let errors: Vec<&str> = text.lines().filter(|line| line.starts_with('E')).collect();
        let _ = writeln!(out, "{} (last {REPORT_LINES} errors):", kubelet_log.display());
        for line in &errors[errors.len().saturating_sub(REPORT_LINES)..] {
            let _ = writeln!(out, "  {}", line.chars().take(400).collect::<String>());
        }
    }
    out
}

/// The last lines each container that is not ready wrote (its previous run's, if it restarted):
/// why a process that runs never became ready is often only in its own log.
async fn log_tails(pods: &Api<Pod>, pod: &Pod, out: &mut String) {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let statuses = pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten());
    for container in statuses.filter(|c| !c.ready) {
        let params = LogParams {
            container: Some(container.name.clone()),
            previous: container.restart_count > 0,
            tail_lines: Some(REPORT_LINES as i64),
            ..LogParams::default()
        };
        match pods.logs(name, &params).await {
            Ok(text) => {
                let _ = writeln!(out, "  {} log (last {REPORT_LINES} lines):", container.name);
                for line in text.lines() {
                    let _ = writeln!(out, "    {}", line.chars().take(400).collect::<String>());
                }
            }
            Err(error) => _ = writeln!(out, "  {} log unreadable: {error}", container.name),
        }
    }
}

fn describe(pod: &Pod, out: &mut String) {
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let Some(status) = &pod.status else {
        let _ = writeln!(out, "pod {name}: no status");
        return;
    };
    let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("unscheduled");
    let _ = writeln!(out, "pod {name} on {node}: {}", status.phase.as_deref().unwrap_or("?"));
    for condition in status.conditions.iter().flatten().filter(|c| c.status != "True") {
        let _ = writeln!(
            out,
            "  {} {}: {}",
            condition.type_,
            condition.reason.as_deref().unwrap_or(""),
            condition.message.as_deref().unwrap_or("")
        );
    }
    let containers = status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
    for container in containers {
        let state = container.state.as_ref();
        if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
            let reason = waiting.reason.as_deref().unwrap_or("");
            let _ =
                writeln!(out, "  {} waiting: {reason}: {}", container.name, waiting.message.as_deref().unwrap_or(""));
        }
        let last = container.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()).or(last) {
            let _ = writeln!(
                out,
                "  {} terminated (exit {}, restarts {}): {}",
                container.name,
                terminated.exit_code,
                container.restart_count,
                terminated.message.as_deref().or(terminated.reason.as_deref()).unwrap_or("")
            );
        }
    }
}
