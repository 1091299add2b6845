//! Logs to stderr, filtered by `RUST_LOG` (default `info`): one JSON object per line for clusters,
//! or human-readable lines.
//!
//! In JSON every field carries its value: record fields with `%` (Display), e.g.
//! `tracing::info!(%addr, "listening")`, not `?` (Debug), which would log `"Some(127.0.0.1:80)"`;
//! numbers and booleans recorded plainly stay JSON numbers and booleans.

use std::io::IsTerminal as _;

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::Error;

/// The `--log-format` flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per event, fields at the top level: what log pipelines parse.
    #[default]
    Json,
    /// Human-readable lines, for terminals.
    Pretty,
}

/// Installs the process-wide subscriber (and routes the `log` crate's records into it). Fails if
/// one is installed already.
pub fn init(format: LogFormat) -> Result<(), Error> {
    // Colour codes only where a person reads them, not in files the logs are redirected to.
    let ansi = std::io::stderr().is_terminal();
    subscriber(format, default_filter(), std::io::stderr, ansi).try_init()?;
    Ok(())
}

/// `RUST_LOG` when set and valid, else `info`.
fn default_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

fn subscriber<W>(format: LogFormat, filter: EnvFilter, writer: W, ansi: bool) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(ansi);
    match format {
        // Flattened so a field is `addr`, not `fields.addr`, in every log query.
        LogFormat::Json => Box::new(builder.json().flatten_event(true).finish()),
        LogFormat::Pretty => Box::new(builder.finish()),
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().map_err(|_| io::Error::other("poisoned"))?.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Self;

        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }

    fn log_with(format: LogFormat, emit: impl FnOnce()) -> String {
        let captured = Captured::default();
        let subscriber = subscriber(format, EnvFilter::new("info"), captured.clone(), false);
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn json_lines_carry_values_at_the_top_level() {
        let addr: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let admin: Option<SocketAddr> = Some(addr);
        let text = log_with(LogFormat::Json, || {
            tracing::info!(%addr, admin = admin.map(tracing::field::display), in_flight = 3_u64, ready = true, "serving");
            tracing::debug!("filtered out");
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let event: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(event["message"], "serving");
        assert_eq!(event["addr"], "127.0.0.1:9090");
        assert_eq!(event["admin"], "127.0.0.1:9090");
        assert_eq!(event["in_flight"], 3);
        assert_eq!(event["ready"], true);
        assert_eq!(event["level"], "INFO");
    }

    #[test]
    fn pretty_lines_are_not_json() {
        let text = log_with(LogFormat::Pretty, || tracing::warn!(pool = "a", "shedding"));
        assert!(text.contains("shedding") && text.contains("pool"), "{text}");
        assert!(serde_json::from_str::<serde_json::Value>(text.trim()).is_err());
    }
}
