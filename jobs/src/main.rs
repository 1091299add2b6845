//! `teifleet-job run`: one worker of an EmbeddingJob. Exits 0 once all of its shards are done,
//! after printing one summary line; on failure, prints one line saying what failed (naming the
//! file or pool) and exits 1. A rerun resumes after the shards already written.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use teifleet_job::cli::RunArgs;
use teifleet_job::progress_config_map::{ConfigMapSink, Sinks};
use teifleet_runtime::logging::{self, LogFormat};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(version, about = "Embeds a corpus through a teifleet pool into Parquet vectors, in resumable shards.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one worker of an EmbeddingJob.
    Run {
        #[command(flatten)]
        args: Box<RunArgs>,
        #[arg(long, env = "TEIFLEET_LOG_FORMAT", value_enum, default_value = "json")]
        log_format: LogFormat,
    },
}

fn main() -> ExitCode {
    let Command::Run { args, log_format } = Cli::parse().command;
    match run(*args, log_format) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("teifleet-job: {}", one_line(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line. Many errors' messages already quote their cause (ours
/// name the file, then say what the store or parser said), so a cause is added only where the
/// line does not say it yet: usually just the root, such as the operating system's reason.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line.replace('\n', " ")
}

fn run(args: RunArgs, log_format: LogFormat) -> anyhow::Result<teifleet_job::worker::Summary> {
    logging::init(log_format)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(async {
        // A pod being deleted (a suspended job, a cancelled batch, a drained node) gets SIGTERM;
        // as PID 1 the worker would otherwise ignore it and run on until the SIGKILL, writing
        // shards after the job was stopped.
        let signal = teifleet_runtime::shutdown::signal()?;
        let stop = CancellationToken::new();
        let stopping = stop.clone();
        tokio::spawn(async move {
            let which = signal.await;
            tracing::info!(signal = %which, "stopping: no new shard, the one out dropped");
            stopping.cancel();
        });
        let config_map = match (args.progress_config_map.clone(), args.pod_namespace.clone()) {
            (Some(name), Some(namespace)) => Some(ConfigMapSink::in_cluster(&namespace, &name).await?),
            (Some(name), None) => {
                anyhow::bail!("--progress-configmap {name} needs the pod's namespace (POD_NAMESPACE)")
            }
            (None, _) => None,
        };
        let (worker, file) = args.into_worker(|name| std::env::var(name).ok())?;
        Ok(worker.run_until(&Sinks { file, config_map }, &stop).await?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_already_quoted_are_not_repeated() {
        let root = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let error =
            anyhow::Error::new(root).context("client error (Connect)").context("s3://b/x: client error (Connect)");
        assert_eq!(one_line(&error), "s3://b/x: client error (Connect): connection refused");
        let multi_line = anyhow::anyhow!("first\nsecond");
        assert_eq!(one_line(&multi_line), "first second");
    }
}
