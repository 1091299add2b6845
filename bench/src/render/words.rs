//! The words every section shares: how a backend, the multiplexer's limits and a latency are
//! written. Below the section renderers, which all import it and none of each other.

use crate::procs::{Device, MuxLimits, SimModel};
use crate::targets::number;

/// A latency in ms, to three significant digits.
pub fn ms(v: f64) -> String {
    number(v)
}

/// An added latency in µs, signed (`+58 µs`), or `n/a`.
pub fn us(v: f64) -> String {
    if v.is_nan() { "n/a".into() } else { format!("{v:+.0} µs") }
}

/// `simulated TEI, device 20 ms + 20 µs/token per batch (sleeping), at most 8 requests per batch,
/// --max-concurrent-requests 512`
pub fn backend(m: &SimModel) -> String {
    let device = match m.device {
        Device::Sleep => "sleeping: a GPU, the CPU is free meanwhile; its timer ticks in ms",
        Device::Spin => "spinning: the CPU is busy for the whole time",
    };
    let batch = m.max_batch_requests.map(|n| format!(", at most {n} requests per batch")).unwrap_or_default();
    format!(
        "simulated TEI, device {} ms + {} µs/token per batch ({device}){batch}, `--max-concurrent-requests {}`",
        number(m.fixed_latency.as_secs_f64() * 1e3),
        number(m.per_token_latency.as_secs_f64() * 1e6),
        m.max_concurrent_requests
    )
}

/// `maxInFlight 16, maxQueued 128, queueTimeout 500 ms`
pub fn limits(l: &MuxLimits) -> String {
    let coalesce = if l.coalesce { ", --coalesce" } else { "" };
    format!(
        "maxInFlight {}, maxQueued {}, queueTimeout {} ms{coalesce}",
        l.max_in_flight,
        l.max_queued,
        l.queue_timeout.as_millis()
    )
}
