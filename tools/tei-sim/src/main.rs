//! `tei-sim`: a stand-in for a TEI gRPC server, for local runs, end-to-end tests and, as an image,
//! for TEI's own container: it takes TEI's command line and environment.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::parser::ValueSource;
use clap::{Args as ClapArgs, CommandFactory as _, FromArgMatches as _, Parser};
use teifleet_runtime::duration::parse_flag;
use teifleet_runtime::logging::{self, LogFormat};
use teifleet_runtime::shutdown;
use teifleet_tei_sim::profile::Profile;
use teifleet_tei_sim::{Device, Fault, SimConfig};

/// The simulator's own defaults: loopback, so a test run never listens on the network.
const DEFAULT_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);
const DEFAULT_ADMIN_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9000);
/// TEI's defaults for `--hostname`, `--port` and `--prometheus-port`.
const TEI_HOSTNAME: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
const TEI_PORT: u16 = 3000;
const TEI_PROMETHEUS_PORT: u16 = 9000;

/// Simulates Hugging Face Text Embeddings Inference over TEI's gRPC API (tei.v1): admission,
/// batching on a simulated device, deterministic embeddings, faults and TEI-named metrics.
///
/// It accepts TEI's own flags and environment variables (MODEL_ID, PORT, HOSTNAME, ...), so an
/// image of it runs wherever TEI's container does, with the same arguments.
#[derive(Debug, Parser)]
#[command(name = "tei-sim", version)]
struct Args {
    /// gRPC listen address [default: 127.0.0.1:8080, or --hostname:--port when any of TEI's
    /// --hostname, --port, --prometheus-port is set].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Admin HTTP listen address: GET /stats, POST /stats/reset, POST /fault/{fail,stall,clear},
    /// GET /metrics, GET /healthz, GET /readyz [default: 127.0.0.1:9000, or the gRPC address's IP
    /// and --prometheus-port when any of TEI's --hostname, --port, --prometheus-port is set].
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// Requests admitted at once; a unary call beyond this fails with RESOURCE_EXHAUSTED.
    #[arg(long, env = "MAX_CONCURRENT_REQUESTS", default_value_t = 512, value_name = "N")]
    max_concurrent_requests: usize,
    /// Token budget of one device batch, and the longest input accepted without truncation.
    #[arg(long, env = "MAX_BATCH_TOKENS", default_value_t = 16384, value_name = "N")]
    max_batch_tokens: usize,
    /// Cap on requests per device batch (no cap when absent).
    #[arg(long, env = "MAX_BATCH_REQUESTS", value_name = "N")]
    max_batch_requests: Option<usize>,
    /// Most texts accepted in one Rerank call.
    #[arg(long, env = "MAX_CLIENT_BATCH_SIZE", default_value_t = 32, value_name = "N")]
    max_client_batch_size: usize,
    /// A profile measured on a real TEI (tools/tei-sim/profiles/*.json, written by
    /// teifleet-calibrate): its batch times, batch cap and device; the flags below override it.
    #[arg(long, value_name = "FILE")]
    profile: Option<std::path::PathBuf>,
    /// Device time of every batch, e.g. 2ms [default: 2ms, or the profile's].
    #[arg(long, value_parser = parse_flag, value_name = "DUR")]
    fixed_latency: Option<Duration>,
    /// Device time added per request in the batch, e.g. 300us [default: 0, or the profile's].
    #[arg(long, value_parser = parse_flag, value_name = "DUR")]
    per_request_latency: Option<Duration>,
    /// Device time added per token in the batch, e.g. 20us [default: 20us, or the profile's].
    #[arg(long, value_parser = parse_flag, value_name = "DUR")]
    per_token_latency: Option<Duration>,
    /// How a batch's device time is spent: sleep (a GPU: no CPU used) or spin (TEI on a CPU: the
    /// device time is burnt as CPU time of one thread, so a busy machine slows the device)
    /// [default: sleep, or the profile's].
    #[arg(long, value_name = "sleep|spin")]
    device: Option<Device>,
    /// Whether the batch prepared while the device runs stops taking requests once it has one,
    /// as TEI's does [default: false, or the profile's].
    #[arg(long, value_name = "BOOL")]
    freeze_next_batch: Option<bool>,
    /// A lock file shared with co-located simulators (a path on a volume their pods share, or in
    /// /tmp on one machine): their batches take turns on one device, as the TEIs of pods given
    /// replicas of one time-sliced GPU do. Unset: a device of its own.
    #[arg(long, value_name = "PATH")]
    shared_device: Option<std::path::PathBuf>,
    /// Length of the returned embeddings.
    #[arg(long, default_value_t = 384, value_name = "N")]
    dimensions: usize,
    /// Model id reported by Info (TEI's model to serve; nothing is downloaded).
    #[arg(long, env = "MODEL_ID", default_value = "teifleet/sim-embedding", value_name = "ID")]
    model_id: String,
    /// Fault to start with: none, fail or stall.
    #[arg(long, default_value = "none", value_name = "FAULT")]
    fault: Fault,
    /// Log lines as json or pretty (to stderr; RUST_LOG filters, default info).
    #[arg(long, value_enum, default_value = "pretty")]
    log_format: LogFormat,
    #[command(flatten)]
    tei: TeiArgs,
    #[command(flatten)]
    ignored: IgnoredTeiArgs,
}

/// TEI's flags that the simulator honours beyond those it shares with TEI by name.
#[derive(Debug, ClapArgs)]
#[command(next_help_heading = "TEI's addressing and logging flags")]
struct TeiArgs {
    /// IP address to listen on, as TEI: a value that is not an IP (a pod's host name in $HOSTNAME)
    /// means 0.0.0.0 [TEI's default: 0.0.0.0].
    #[arg(long, env = "HOSTNAME", value_name = "IP")]
    hostname: Option<String>,
    /// gRPC port [TEI's default: 3000].
    #[arg(long, short = 'p', env = "PORT", value_name = "PORT")]
    port: Option<u16>,
    /// Port of /metrics (and the admin routes), on the gRPC address's IP [TEI's default: 9000].
    #[arg(long, env = "PROMETHEUS_PORT", value_name = "PORT")]
    prometheus_port: Option<u16>,
    /// Log lines as JSON (the same as --log-format json).
    #[arg(long, env = "JSON_OUTPUT")]
    json_output: bool,
}

/// TEI's flags for what the simulator does not model: accepted with TEI's types, so a command
/// line TEI takes also starts the simulator, and otherwise ignored.
#[derive(Debug, ClapArgs)]
#[command(next_help_heading = "TEI's flags accepted and ignored")]
struct IgnoredTeiArgs {
    #[arg(long, env = "REVISION", value_name = "REV")]
    revision: Option<String>,
    #[arg(long, env = "TOKENIZATION_WORKERS", value_name = "N")]
    tokenization_workers: Option<usize>,
    #[arg(long, env = "DTYPE", value_name = "DTYPE")]
    dtype: Option<String>,
    #[arg(long, env = "SERVED_MODEL_NAME", value_name = "NAME")]
    served_model_name: Option<String>,
    #[arg(long, env = "POOLING", value_name = "POOLING")]
    pooling: Option<String>,
    #[arg(long, env = "AUTO_TRUNCATE")]
    auto_truncate: bool,
    #[arg(long, env = "DEFAULT_PROMPT_NAME", value_name = "NAME", conflicts_with = "default_prompt")]
    default_prompt_name: Option<String>,
    #[arg(long, env = "DEFAULT_PROMPT", value_name = "PROMPT")]
    default_prompt: Option<String>,
    #[arg(long, env = "DENSE_PATH", value_name = "PATH")]
    dense_path: Option<String>,
    #[arg(long, env = "DEVICE_ID", value_name = "N")]
    device_id: Option<usize>,
    #[arg(long, env = "HF_API_TOKEN", hide = true, hide_env_values = true)]
    hf_api_token: Option<String>,
    #[arg(long, env = "HF_TOKEN", value_name = "TOKEN", hide_env_values = true, conflicts_with = "hf_api_token")]
    hf_token: Option<String>,
    #[arg(long, env = "UDS_PATH", value_name = "PATH")]
    uds_path: Option<String>,
    #[arg(long, env = "HUGGINGFACE_HUB_CACHE", value_name = "PATH")]
    huggingface_hub_cache: Option<String>,
    #[arg(long, env = "PAYLOAD_LIMIT", value_name = "BYTES")]
    payload_limit: Option<usize>,
    #[arg(long, env = "API_KEY", value_name = "KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[arg(long, env = "DISABLE_SPANS")]
    disable_spans: bool,
    #[arg(long, env = "OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    #[arg(long, env = "OTLP_SERVICE_NAME", value_name = "NAME")]
    otlp_service_name: Option<String>,
    #[arg(long, env = "CORS_ALLOW_ORIGIN", value_name = "ORIGIN")]
    cors_allow_origin: Option<Vec<String>>,
}

impl IgnoredTeiArgs {
    /// Names of the ignored flags that were set, for one log line; never their values, which
    /// may be tokens.
    fn set(&self) -> Vec<&'static str> {
        let flags = [
            ("revision", self.revision.is_some()),
            ("tokenization-workers", self.tokenization_workers.is_some()),
            ("dtype", self.dtype.is_some()),
            ("served-model-name", self.served_model_name.is_some()),
            ("pooling", self.pooling.is_some()),
            ("auto-truncate", self.auto_truncate),
            ("default-prompt-name", self.default_prompt_name.is_some()),
            ("default-prompt", self.default_prompt.is_some()),
            ("dense-path", self.dense_path.is_some()),
            ("device-id", self.device_id.is_some()),
            ("hf-api-token", self.hf_api_token.is_some()),
            ("hf-token", self.hf_token.is_some()),
            ("uds-path", self.uds_path.is_some()),
            ("huggingface-hub-cache", self.huggingface_hub_cache.is_some()),
            ("payload-limit", self.payload_limit.is_some()),
            ("api-key", self.api_key.is_some()),
            ("disable-spans", self.disable_spans),
            ("otlp-endpoint", self.otlp_endpoint.is_some()),
            ("otlp-service-name", self.otlp_service_name.is_some()),
            ("cors-allow-origin", self.cors_allow_origin.is_some()),
        ];
        flags.into_iter().filter(|(_, set)| *set).map(|(name, _)| name).collect()
    }
}

/// Where to listen: the simulator's own `--listen`/`--admin-listen` when given, else TEI's
/// addressing as soon as any of its flags is set, else loopback.
#[derive(Debug, PartialEq, Eq)]
struct Listen {
    grpc: SocketAddr,
    admin: SocketAddr,
    /// Set when `--hostname` was not an IP and TEI's fallback to 0.0.0.0 applied.
    hostname_not_an_ip: Option<String>,
}

fn listen_addresses(listen: Option<SocketAddr>, admin_listen: Option<SocketAddr>, tei: &TeiArgs) -> Listen {
    let tei_addressing = tei.hostname.is_some() || tei.port.is_some() || tei.prometheus_port.is_some();
    let mut hostname_not_an_ip = None;
    let grpc = listen.unwrap_or_else(|| {
        if !tei_addressing {
            return DEFAULT_LISTEN;
        }
        // TEI parses --hostname as an IP and falls back to 0.0.0.0 otherwise; in Kubernetes
        // $HOSTNAME is the pod's name, so that fallback is what makes TEI listen on every
        // interface there, and the simulator must do the same.
        let ip = match tei.hostname.as_deref().map(str::parse::<IpAddr>) {
            None => TEI_HOSTNAME,
            Some(Ok(ip)) => ip,
            Some(Err(_)) => {
                hostname_not_an_ip = tei.hostname.clone();
                TEI_HOSTNAME
            }
        };
        SocketAddr::new(ip, tei.port.unwrap_or(TEI_PORT))
    });
    let admin = admin_listen.unwrap_or_else(|| {
        if tei_addressing {
            // TEI serves /metrics on the gRPC address's IP.
            SocketAddr::new(grpc.ip(), tei.prometheus_port.unwrap_or(TEI_PROMETHEUS_PORT))
        } else {
            DEFAULT_ADMIN_LISTEN
        }
    });
    Listen { grpc, admin, hostname_not_an_ip }
}

/// The device model: the simulator's defaults, then the profile's measurements, then the flags
/// given, which win over the profile.
fn device_model(args: &Args, tokens_given: bool, config: &mut SimConfig) -> anyhow::Result<()> {
    if let Some(path) = &args.profile {
        Profile::load(path)?.sim.apply(config);
        tracing::info!(profile = %path.display(), "device model from a measured profile");
    }
    if tokens_given {
        config.max_batch_tokens = args.max_batch_tokens;
    }
    config.max_batch_requests = args.max_batch_requests.or(config.max_batch_requests);
    config.fixed_latency = args.fixed_latency.unwrap_or(config.fixed_latency);
    config.per_request_latency = args.per_request_latency.unwrap_or(config.per_request_latency);
    config.per_token_latency = args.per_token_latency.unwrap_or(config.per_token_latency);
    config.device = args.device.unwrap_or(config.device);
    config.freeze_next_batch = args.freeze_next_batch.unwrap_or(config.freeze_next_batch);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let matches = Args::command().get_matches();
    let args = Args::from_arg_matches(&matches)?;
    logging::init(if args.tei.json_output { LogFormat::Json } else { args.log_format })?;
    let stop_signal = shutdown::signal()?;
    let listen = listen_addresses(args.listen, args.admin_listen, &args.tei);
    if let Some(hostname) = &listen.hostname_not_an_ip {
        tracing::warn!(%hostname, "--hostname is not an IP address; listening on 0.0.0.0, as TEI does");
    }
    let ignored = args.ignored.set();
    if !ignored.is_empty() {
        tracing::info!(flags = %ignored.join(","), "TEI flags accepted but not modelled by the simulator");
    }
    let mut config = SimConfig {
        listen: listen.grpc,
        admin_listen: Some(listen.admin),
        max_concurrent_requests: args.max_concurrent_requests,
        max_batch_tokens: args.max_batch_tokens,
        max_client_batch_size: args.max_client_batch_size,
        dimensions: args.dimensions,
        model_id: args.model_id.clone(),
        shared_device: args.shared_device.clone(),
        ..SimConfig::default()
    };
    let tokens_given = matches.value_source("max_batch_tokens") != Some(ValueSource::DefaultValue);
    device_model(&args, tokens_given, &mut config)?;
    let sim = teifleet_tei_sim::start(config).await.context("starting the simulator")?;
    sim.set_fault(args.fault);
    let signal = stop_signal.await;
    tracing::info!(%signal, "shutting down");
    sim.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tei(hostname: Option<&str>, port: Option<u16>, prometheus_port: Option<u16>) -> TeiArgs {
        TeiArgs { hostname: hostname.map(str::to_owned), port, prometheus_port, json_output: false }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn own_defaults_stay_on_loopback() {
        let listen = listen_addresses(None, None, &tei(None, None, None));
        assert_eq!((listen.grpc, listen.admin), (addr("127.0.0.1:8080"), addr("127.0.0.1:9000")));
    }

    #[test]
    fn tei_ports_listen_where_tei_would() {
        // TEI's ports without --hostname: every interface, as TEI.
        let listen = listen_addresses(None, None, &tei(None, Some(8080), Some(9000)));
        assert_eq!((listen.grpc, listen.admin), (addr("0.0.0.0:8080"), addr("0.0.0.0:9000")));
        // What the operator renders: loopback only, metrics included, so only the sidecar
        // reaches the simulator, as it reaches TEI.
        let listen = listen_addresses(None, None, &tei(Some("127.0.0.1"), Some(8080), Some(9000)));
        assert_eq!((listen.grpc, listen.admin), (addr("127.0.0.1:8080"), addr("127.0.0.1:9000")));
        let listen = listen_addresses(None, None, &tei(Some("127.0.0.1"), Some(8081), None));
        assert_eq!((listen.grpc, listen.admin), (addr("127.0.0.1:8081"), addr("127.0.0.1:9000")));
        let listen = listen_addresses(None, None, &tei(Some("::1"), None, Some(9001)));
        assert_eq!((listen.grpc, listen.admin), (addr("[::1]:3000"), addr("[::1]:9001")));
        assert_eq!(listen.hostname_not_an_ip, None);
    }

    #[test]
    fn a_pod_name_in_hostname_means_every_interface() {
        let listen = listen_addresses(None, None, &tei(Some("bge-small-5d8f7c9b4-x2x7q"), Some(8080), None));
        assert_eq!((listen.grpc, listen.admin), (addr("0.0.0.0:8080"), addr("0.0.0.0:9000")));
        assert_eq!(listen.hostname_not_an_ip.as_deref(), Some("bge-small-5d8f7c9b4-x2x7q"));
    }

    #[test]
    fn own_flags_win_over_tei_addressing() {
        let grpc = addr("127.0.0.1:5000");
        let admin = addr("127.0.0.1:5001");
        let listen = listen_addresses(Some(grpc), Some(admin), &tei(Some("pod"), Some(80), Some(9000)));
        assert_eq!((listen.grpc, listen.admin), (grpc, admin));
        // A metrics port without --admin-listen goes on the gRPC address's IP, as TEI's does.
        let listen = listen_addresses(Some(grpc), None, &tei(None, None, Some(9001)));
        assert_eq!(listen.admin, addr("127.0.0.1:9001"));
    }

    #[test]
    fn a_profile_sets_the_device_and_flags_override_it() {
        let path = std::env::temp_dir().join(format!("tei-sim-main-profile-{}.json", std::process::id()));
        std::fs::write(
            &path,
            r#"{"format": 1, "sim": {"fixed_latency_us": 3000, "per_request_latency_us": 500,
                "per_token_latency_us": 40, "max_batch_requests": 4, "max_batch_tokens": 8192,
                "device": "spin", "freeze_next_batch": true}}"#,
        )
        .unwrap();
        let model = |flags: &[&str]| {
            let profile = format!("--profile={}", path.display());
            let argv = ["tei-sim", profile.as_str()].into_iter().chain(flags.iter().copied());
            let matches = Args::command().try_get_matches_from(argv).unwrap();
            let args = Args::from_arg_matches(&matches).unwrap();
            let tokens_given = matches.value_source("max_batch_tokens") != Some(ValueSource::DefaultValue);
            let mut config = SimConfig::default();
            device_model(&args, tokens_given, &mut config).map(|()| config)
        };
        let config = model(&[]).unwrap();
        assert_eq!(
            (config.fixed_latency, config.per_request_latency),
            (Duration::from_millis(3), Duration::from_micros(500))
        );
        assert_eq!((config.per_token_latency, config.device), (Duration::from_micros(40), Device::Spin));
        assert_eq!((config.max_batch_requests, config.max_batch_tokens), (Some(4), 8192));
        assert!(config.freeze_next_batch);
        let config =
            model(&["--fixed-latency=1ms", "--device=sleep", "--max-batch-requests=8", "--max-batch-tokens=100"])
                .unwrap();
        assert_eq!((config.fixed_latency, config.device), (Duration::from_millis(1), Device::Sleep));
        assert_eq!((config.max_batch_requests, config.max_batch_tokens), (Some(8), 100));
        assert_eq!(config.per_token_latency, Duration::from_micros(40));
        assert!(!model(&["--freeze-next-batch=false"]).unwrap().freeze_next_batch);
        std::fs::write(&path, "{\"format\": 1}").unwrap();
        let refused = format!("{:#}", model(&[]).unwrap_err());
        assert!(refused.contains("profile") && refused.contains("missing field `sim`"), "{refused}");
        std::fs::remove_file(&path).unwrap();
        // Without a profile, the simulator's defaults, which tests depend on.
        let args = Args::try_parse_from(["tei-sim"]).unwrap();
        let mut config = SimConfig::default();
        device_model(&args, false, &mut config).unwrap();
        assert_eq!(config, SimConfig::default());
    }

    #[test]
    fn tei_command_lines_parse() {
        let args = Args::try_parse_from([
            "text-embeddings-router",
            "--model-id=thenlper/gte-large",
            "--port=8080",
            "--prometheus-port=9000",
            "--hostname=0.0.0.0",
            "--max-concurrent-requests=2048",
            "--revision=v1.2",
            "--dtype=float16",
            "--pooling=mean",
            "--max-batch-tokens=32768",
            "--max-client-batch-size=64",
            "--max-batch-requests=8",
            "--auto-truncate",
            "--tokenization-workers=2",
            "--payload-limit=2000000",
            "--json-output",
            "--otlp-endpoint=http://127.0.0.1:4317",
            "--huggingface-hub-cache=/data",
            "--hf-token=secret",
            "--api-key=secret",
            "--cors-allow-origin=https://a.example",
        ])
        .unwrap();
        assert_eq!(args.model_id, "thenlper/gte-large");
        assert_eq!((args.max_concurrent_requests, args.max_batch_tokens), (2048, 32768));
        assert_eq!((args.max_client_batch_size, args.max_batch_requests), (64, Some(8)));
        assert!(args.tei.json_output);
        let ignored = args.ignored.set();
        for flag in ["revision", "dtype", "pooling", "auto-truncate", "hf-token", "api-key", "otlp-endpoint"] {
            assert!(ignored.contains(&flag), "{flag} not reported in {ignored:?}");
        }
        // Typed as TEI types them, so what TEI refuses the simulator refuses too.
        assert!(Args::try_parse_from(["tei-sim", "--port=http"]).is_err());
        assert!(Args::try_parse_from(["tei-sim", "--tokenization-workers=many"]).is_err());
        assert!(Args::try_parse_from(["tei-sim", "--no-such-flag"]).is_err());
    }
}
