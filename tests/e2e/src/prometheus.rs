//! A real Prometheus server scraping the local cluster's pods through Kubernetes service
//! discovery, as an adopter runs it: upstream's, built by tools/prometheus.sh (Debian's has no
//! Kubernetes discovery), with the scrape jobs docs/operating.md shows (read from the page, so the
//! page is what is proven), narrowed to one test namespace, and the shipped
//! `deploy/prometheus/teifleet-rules.yaml`, unchanged. Its HTTP API says what it scraped, which
//! rules it loaded and evaluated, and which alerts fire.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use teifleet_testkit::poll::try_eventually;
use teifleet_testkit::process::{ChildGuard, OnDrop};

use crate::{free_port, kubeconfig_path, log_dir, loopback, repo_root};

/// How often the server scrapes and evaluates the rules: often, so the test waits seconds.
pub const INTERVAL: &str = "2s";
/// The page whose scrape configuration the server runs.
pub const DOCS: &str = "docs/operating.md";
/// The shipped alert rules.
pub const RULES: &str = "deploy/prometheus/teifleet-rules.yaml";
/// How long a state may take to show: service discovery, a scrape and an evaluation, on a busy
/// machine.
const WAIT: Duration = Duration::from_secs(90);

/// The Prometheus server to run: `TEIFLEET_PROMETHEUS_BIN` (`make test-cluster` sets it), else
/// what `tools/prometheus.sh` prints (the upstream build it caches, built now if it is not there).
/// Debian's `/usr/bin/prometheus` will not do: it is built without Kubernetes service discovery.
/// `Err` says why there is none.
pub fn binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("TEIFLEET_PROMETHEUS_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("TEIFLEET_PROMETHEUS_BIN={} is no file", path.display()))
        };
    }
    let script = repo_root().join("tools/prometheus.sh");
    let built =
        Command::new(&script).output().map_err(|error| format!("{} does not run: {error}", script.display()))?;
    if !built.status.success() {
        return Err(format!("tools/prometheus.sh failed: {}", String::from_utf8_lossy(&built.stderr).trim()));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim());
    if path.is_file() { Ok(path) } else { Err(format!("tools/prometheus.sh printed {}, no file", path.display())) }
}

/// The `scrape_configs:` block of docs/operating.md, as written there.
pub fn documented_scrape_configs() -> Value {
    let page = std::fs::read_to_string(repo_root().join(DOCS)).expect("docs/operating.md");
    let start =
        page.find("```yaml\nscrape_configs:").unwrap_or_else(|| panic!("{DOCS} shows no `scrape_configs:` block"));
    let block = &page[start + "```yaml\n".len()..];
    let block = &block[..block.find("```").expect("the block ends")];
    serde_norway::from_str(block).unwrap_or_else(|error| panic!("{DOCS}'s scrape_configs block: {error}"))
}

/// `documented` with each job's service discovery pointed at the local cluster (`kubeconfig`) and
/// narrowed to `namespace`; nothing else changed.
pub fn narrowed(mut documented: Value, kubeconfig: &Path, namespace: &str) -> Value {
    let jobs = documented["scrape_configs"].as_array_mut().expect("scrape_configs is a list");
    assert!(!jobs.is_empty(), "{DOCS} shows no scrape job");
    for job in jobs {
        let discovery = job["kubernetes_sd_configs"].as_array_mut().expect("each job discovers through Kubernetes");
        for sd in discovery {
            sd["kubeconfig_file"] = json!(kubeconfig);
            sd["namespaces"] = json!({ "names": [namespace] });
        }
    }
    documented
}

/// The group names of the shipped rule file, each with its alerts' names.
pub fn shipped_groups() -> Vec<(String, Vec<String>)> {
    let path = repo_root().join(RULES);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let file: Value = serde_norway::from_str(&text).expect("the rule file is YAML");
    let groups = file["groups"].as_array().expect("the rule file has groups");
    groups
        .iter()
        .map(|group| {
            let rules = group["rules"].as_array().expect("a group has rules");
            let names = rules.iter().filter_map(|r| r["alert"].as_str().or(r["record"].as_str()).map(str::to_owned));
            (group["name"].as_str().expect("a group has a name").to_owned(), names.collect())
        })
        .collect()
}

/// The server, as a child process killed when dropped, its configuration, TSDB and log in
/// `target/e2e-logs/prometheus-<name>`.
pub struct Prometheus {
    process: ChildGuard,
    dir: PathBuf,
    pub addr: SocketAddr,
}

impl Prometheus {
    /// Starts the server on a free loopback port with the documented scrape jobs narrowed to
    /// `namespace` and the shipped rules, and waits until it is ready. `None` when there is no
    /// server to run ([`binary`]) and this run does not require one; with `TEIFLEET_REAL_NODE=1`
    /// (tests/cluster/prereqs.sh builds it) its absence fails the test.
    pub async fn scraping(name: &str, namespace: &str) -> Option<Self> {
        let binary = match binary() {
            Ok(binary) => binary,
            Err(why) => {
                assert_ne!(
                    std::env::var("TEIFLEET_REAL_NODE").as_deref(),
                    Ok("1"),
                    "TEIFLEET_REAL_NODE=1 but there is no Prometheus server to run: {why} \
                     (tests/cluster/prereqs.sh builds it with tools/prometheus.sh)"
                );
                eprintln!("skipped the Prometheus check: {why} (tools/prometheus.sh builds it)");
                return None;
            }
        };
        let dir = log_dir().join(format!("prometheus-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the Prometheus directory");
        let mut config = narrowed(documented_scrape_configs(), &kubeconfig_path(), namespace);
        config["global"] = json!({ "scrape_interval": INTERVAL, "evaluation_interval": INTERVAL });
        config["rule_files"] = json!([repo_root().join(RULES)]);
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, serde_norway::to_string(&config).expect("the configuration serializes"))
            .expect("prometheus.yml written");
        let port = free_port().expect("a free port");
        let mut command = Command::new(&binary);
        command.arg(format!("--config.file={}", config_file.display()));
        command.arg(format!("--storage.tsdb.path={}", dir.join("data").display()));
        command.arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let mut process = ChildGuard::spawn_logged(format!("prometheus {name}"), command, dir.join("prometheus.log"))
            .expect("prometheus starts")
            .on_drop(OnDrop::Kill);
        let addr = loopback(port);
        let ready = process
            .wait_ready(WAIT, || async move {
                teifleet_testkit::http::request(addr, "GET", "/-/ready").await.is_some_and(|r| r.status == 200)
            })
            .await;
        if let Err(error) = ready {
            panic!("{error}\n--- {}:\n{}", config_file.display(), process.log_text());
        }
        Some(Self { process, dir, addr })
    }

    /// The `data` of a successful answer of the HTTP API at `path` (with its query string).
    pub async fn api(&self, path: &str) -> Option<Value> {
        let response = teifleet_testkit::http::request(self.addr, "GET", path).await?;
        let answer: Value = serde_json::from_str(&response.body).ok()?;
        (response.status == 200 && answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// The instant vector of the PromQL `expr`, evaluated now.
    pub async fn query(&self, expr: &str) -> Option<Vec<Value>> {
        let data = self.api(&format!("/api/v1/query?query={}", percent_encode(expr))).await?;
        data["result"].as_array().cloned()
    }

    /// The active targets (`/api/v1/targets?state=active`).
    pub async fn targets(&self) -> Option<Vec<Value>> {
        self.api("/api/v1/targets?state=active").await?["activeTargets"].as_array().cloned()
    }

    /// The rule groups loaded (`/api/v1/rules`).
    pub async fn rule_groups(&self) -> Option<Vec<Value>> {
        self.api("/api/v1/rules").await?["groups"].as_array().cloned()
    }

    /// The alerts pending or firing (`/api/v1/alerts`).
    pub async fn alerts(&self) -> Option<Vec<Value>> {
        self.api("/api/v1/alerts").await?["alerts"].as_array().cloned()
    }

    /// What the server sees, for a failure message: its targets, rules and alerts, and the end of
    /// its log.
    pub async fn report(&self) -> String {
        let mut report = String::new();
        let _ = writeln!(report, "--- Prometheus targets:");
        for target in self.targets().await.unwrap_or_default() {
            let _ = writeln!(
                report,
                "{} {} {} {} {}",
                target["labels"]["job"],
                target["labels"]["pod"],
                target["scrapeUrl"],
                target["health"],
                target["lastError"]
            );
        }
        let _ = writeln!(report, "--- Prometheus rules:");
        for group in self.rule_groups().await.unwrap_or_default() {
            for rule in group["rules"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    report,
                    "{} {} {} {} {}",
                    group["name"], rule["name"], rule["health"], rule["state"], rule["lastError"]
                );
            }
        }
        let _ = writeln!(report, "--- Prometheus alerts: {:?}", self.alerts().await);
        let log = self.process.log_text();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let _ = writeln!(report, "--- Prometheus log ({}), last lines:", self.dir.display());
        for line in tail.into_iter().rev() {
            let _ = writeln!(report, "{line}");
        }
        report
    }

    /// Polls `check` until it yields a value, panicking with [`Self::report`] after a generous
    /// bound.
    pub async fn eventually<T, F, Fut>(&self, what: &str, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        match try_eventually(what, WAIT, check).await {
            Ok(value) => value,
            Err(error) => panic!("{error}\n{}", self.report().await),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.process.kill();
        // The TSDB is no use after the test; the configuration and the log stay for a look.
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}

/// `text` as a URL query value: every byte but the unreserved ones percent-encoded.
pub fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// The value of one sample of an instant vector (`[time, "value"]`).
pub fn sample_value(sample: &Value) -> Option<f64> {
    sample["value"][1].as_str()?.parse().ok()
}

/// A label of one series of an instant vector, or of a target.
pub fn label<'a>(series: &'a Value, name: &str) -> Option<&'a str> {
    series["metric"][name].as_str().or(series["labels"][name].as_str())
}

/// What a healthy pool looks like to Prometheus, checked once the pool serves: `operator_pod` (the
/// chart's) is a target of `teifleet-operator` and each of `pool_pods` a target of
/// `teifleet-sidecars` and `teifleet-tei`, every target `up == 1` with the `namespace` and `pod`
/// labels; the sidecars' series carry the pool and its namespace, the operator's
/// `teifleet_pool_*` the pool's own `namespace` (honored, not renamed); every group of the shipped
/// rules is loaded and every rule evaluated with health `ok` after those series were there; and
/// no teifleet alert fires.
pub async fn check_healthy_pool(
    prometheus: &Prometheus,
    namespace: &str,
    pool: &str,
    operator_pod: &str,
    pool_pods: &[String],
) {
    let expected: BTreeSet<(String, String)> = std::iter::once(("teifleet-operator", operator_pod))
        .chain(pool_pods.iter().flat_map(|pod| [("teifleet-sidecars", pod.as_str()), ("teifleet-tei", pod.as_str())]))
        .map(|(job, pod)| (job.to_owned(), pod.to_owned()))
        .collect();

    // Service discovery found every pod, and every scrape of it succeeded.
    let targets = prometheus
        .eventually("Prometheus scraping the operator and every sidecar, each target up", || async {
            let targets = prometheus.targets().await?;
            let up: BTreeSet<(String, String)> = targets
                .iter()
                .filter(|t| t["health"] == "up")
                .filter_map(|t| Some((label(t, "job")?.to_owned(), label(t, "pod")?.to_owned())))
                .collect();
            let all_up = targets.iter().all(|t| t["health"] == "up");
            (all_up && expected.is_subset(&up)).then_some(targets)
        })
        .await;
    for target in &targets {
        assert_eq!(label(target, "namespace"), Some(namespace), "the target's namespace label: {target}");
    }
    println!("Prometheus scrapes {} targets, all up: {expected:?}", targets.len());
    // The same as PromQL sees it: `up` is 1 for each.
    let up = prometheus
        .eventually("`up` for every target", || async {
            let up = prometheus.query(&format!("up{{namespace=\"{namespace}\"}}")).await?;
            let seen: BTreeSet<(String, String)> =
                up.iter().filter_map(|s| Some((label(s, "job")?.to_owned(), label(s, "pod")?.to_owned()))).collect();
            expected.is_subset(&seen).then_some(up)
        })
        .await;
    for series in &up {
        assert_eq!(sample_value(series), Some(1.0), "up == 1: {series}");
    }

    // A sidecar's series, with the pool's labels and the pod's target labels.
    let requests =
        format!("teifleet_requests_total{{job=\"teifleet-sidecars\",namespace=\"{namespace}\",pool=\"{pool}\"}}");
    let series = prometheus
        .eventually(&requests, || async { prometheus.query(&requests).await.filter(|r| !r.is_empty()) })
        .await;
    for s in &series {
        let pod = label(s, "pod").unwrap_or_default();
        assert!(pool_pods.iter().any(|p| p == pod), "a series of a pool pod's sidecar: {s}");
    }
    // The operator's view of the pool, with the pool's own namespace: honor_labels kept it.
    let demand = format!("teifleet_pool_in_flight{{job=\"teifleet-operator\",pool=\"{pool}\"}}");
    let series =
        prometheus.eventually(&demand, || async { prometheus.query(&demand).await.filter(|r| !r.is_empty()) }).await;
    for s in &series {
        assert_eq!(label(s, "namespace"), Some(namespace), "the pool's namespace: {s}");
        assert_eq!(label(s, "exported_namespace"), None, "honor_labels keeps the operator's namespace label: {s}");
        assert_eq!(label(s, "pod"), Some(operator_pod), "{s}");
    }
    // TEI's own series, relayed by the sidecars.
    let tei = format!("te_request_count{{job=\"teifleet-tei\",namespace=\"{namespace}\"}}");
    prometheus.eventually(&tei, || async { prometheus.query(&tei).await.filter(|r| !r.is_empty()) }).await;

    // Every shipped group loaded from the shipped file, every rule in it; then evaluated twice
    // more (each evaluation moves the group's `lastEvaluation`), so at least once wholly after
    // the series above were there, every rule with health ok.
    let shipped = shipped_groups();
    let loaded = |groups: Vec<Value>| -> Option<Vec<Value>> {
        shipped
            .iter()
            .map(|(name, rules)| {
                let group = groups.iter().find(|g| g["name"] == name.as_str())?;
                let names: Vec<&str> = group["rules"].as_array()?.iter().filter_map(|r| r["name"].as_str()).collect();
                (group["file"].as_str()?.ends_with(RULES) && names == *rules).then(|| group.clone())
            })
            .collect()
    };
    let deadline = Instant::now() + WAIT;
    let mut last: Option<Vec<Value>> = None;
    let mut evaluations = vec![0; shipped.len()];
    let groups = loop {
        if let Some(groups) = prometheus.rule_groups().await.and_then(loaded) {
            let stamps: Vec<Value> = groups.iter().map(|g| g["lastEvaluation"].clone()).collect();
            for (i, stamp) in stamps.iter().enumerate() {
                evaluations[i] += usize::from(last.as_ref().is_some_and(|last| last[i] != *stamp));
            }
            last = Some(stamps);
            let rules = || groups.iter().flat_map(|g| g["rules"].as_array().into_iter().flatten());
            if evaluations.iter().all(|n| *n >= 2) && rules().all(|r| r["health"] == "ok") {
                break groups;
            }
        }
        assert!(
            Instant::now() < deadline,
            "every group of {RULES} loaded and evaluated twice with health ok, within {WAIT:?} \
             (evaluations seen: {evaluations:?})\n{}",
            prometheus.report().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let rules: usize = groups.iter().map(|g| g["rules"].as_array().map_or(0, Vec::len)).sum();
    println!("Prometheus loaded {} rule group(s), {rules} rule(s), all evaluated with health ok", groups.len());

    // Nothing fires for a healthy pool.
    for group in &groups {
        for rule in group["rules"].as_array().into_iter().flatten() {
            assert_ne!(
                rule["state"],
                "firing",
                "a rule fires for a healthy pool: {rule}\n{}",
                prometheus.report().await
            );
        }
    }
    let alerts = prometheus.alerts().await.expect("Prometheus' alerts");
    let firing: Vec<&Value> = alerts
        .iter()
        .filter(|a| {
            a["state"] == "firing" && a["labels"]["alertname"].as_str().is_some_and(|n| n.starts_with("Teifleet"))
        })
        .collect();
    assert!(firing.is_empty(), "teifleet alerts fire for a healthy pool: {firing:?}");
    if !alerts.is_empty() {
        println!("Prometheus alerts pending, none firing: {alerts:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_jobs_scrape_the_admin_ports_of_teifleet_pods() {
        let config = narrowed(documented_scrape_configs(), Path::new("/k"), "ns");
        let jobs = config["scrape_configs"].as_array().unwrap();
        let names: Vec<&str> = jobs.iter().filter_map(|j| j["job_name"].as_str()).collect();
        assert_eq!(names, ["teifleet-operator", "teifleet-sidecars", "teifleet-tei"]);
        for job in jobs {
            assert_eq!(job["kubernetes_sd_configs"][0]["kubeconfig_file"], "/k");
            assert_eq!(job["kubernetes_sd_configs"][0]["namespaces"]["names"][0], "ns");
        }
        assert_eq!(jobs[0]["honor_labels"], true, "the operator's series keep the pool's namespace");
    }

    #[test]
    fn the_shipped_rules_have_groups_with_alerts() {
        let groups = shipped_groups();
        assert!(groups.iter().any(|(_, rules)| rules.iter().any(|r| r == "TeifleetShedding")), "{groups:?}");
    }

    #[test]
    fn a_query_is_percent_encoded() {
        assert_eq!(percent_encode(r#"up{a="b c"}"#), "up%7Ba%3D%22b%20c%22%7D");
    }
}
