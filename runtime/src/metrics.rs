//! Registering metrics and writing them out in Prometheus' text format.

use prometheus::core::Collector;
use prometheus::{Encoder as _, IntCounterVec, Opts, Registry, TextEncoder};

/// A metric whose clones share its values (every `prometheus` metric type is one), so a clone can
/// go into a registry while the original keeps being updated.
pub trait SharedCollector {
    fn boxed_clone(&self) -> Box<dyn Collector>;
}

impl<C: Collector + Clone + 'static> SharedCollector for C {
    fn boxed_clone(&self) -> Box<dyn Collector> {
        Box::new(self.clone())
    }
}

/// Registers each collector, of whatever type: `register(&registry, &[&requests, &in_flight])`.
/// Stops at the first failure (a name registered twice, say).
pub fn register(registry: &Registry, collectors: &[&dyn SharedCollector]) -> Result<(), prometheus::Error> {
    collectors.iter().try_for_each(|collector| registry.register(collector.boxed_clone()))
}

/// The one definition of `teifleet_refused_input_total{port, reason}`: clients or requests a
/// port turned away at one of its bounds (`crate::http_server`, the sidecar's fronts). Each
/// binary registers it once and counts through it for every port it serves.
pub fn refused_input() -> IntCounterVec {
    let opts = Opts::new(
        "teifleet_refused_input_total",
        "Clients or requests turned away at a bound on input, by port (admin, grpc, http) and reason.",
    );
    IntCounterVec::new(opts, &["port", "reason"]).expect("a valid metric definition")
}

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// Every metric in `registry`, in Prometheus' text exposition format.
pub fn render(registry: &Registry) -> Result<String, prometheus::Error> {
    let mut buffer = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buffer)?;
    String::from_utf8(buffer).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

#[cfg(test)]
mod tests {
    use prometheus::{IntCounter, IntGaugeVec, Opts};

    use super::*;

    #[test]
    fn registers_mixed_collectors_and_renders_their_values() {
        let registry = Registry::new();
        let requests = IntCounter::new("requests_total", "Requests.").unwrap();
        let queued = IntGaugeVec::new(Opts::new("queued", "Waiting."), &["pool"]).unwrap();
        register(&registry, &[&requests, &queued]).unwrap();
        requests.inc_by(2);
        queued.with_label_values(&["a"]).set(5);
        let text = render(&registry).unwrap();
        assert!(text.contains("requests_total 2"), "{text}");
        assert!(text.contains("queued{pool=\"a\"} 5"), "{text}");
    }

    #[test]
    fn a_name_registered_twice_is_refused() {
        let registry = Registry::new();
        let first = IntCounter::new("requests_total", "Requests.").unwrap();
        let second = IntCounter::new("requests_total", "Requests.").unwrap();
        assert!(register(&registry, &[&first, &second]).is_err());
    }
}
