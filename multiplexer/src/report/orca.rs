//! Load reports for clients that balance call by call: ORCA's `OrcaLoadReport` (gRPC A51), built
//! from a pool's admission state when a call ends and sent with its answer, so proxyless gRPC's
//! `weighted_round_robin` (A58) and Envoy's client-side weighted round robin (Envoy Gateway's
//! `BackendUtilization`) give each replica calls in proportion to what its budget can take.
//!
//! gRPC answers carry the serialized report in the trailer `endpoint-load-metrics-bin` (in the
//! headers of a trailers-only answer); HTTP answers carry `endpoint-load-metrics: TEXT ...`,
//! Envoy's text form. Refusals carry it too, beside `grpc-retry-pushback-ms` / `Retry-After`:
//! a replica that sheds is the one whose load a balancer most needs to see.
//!
//! Reading it from a tonic client: a unary call's trailers are merged into
//! `Response::metadata()`, a refused call's into `Status::metadata()`, a stream's come from
//! `Streaming::trailers()`; `get_bin(ENDPOINT_LOAD_METRICS_BIN)` and `to_bytes()` give the
//! message, which `OrcaLoadReport::decode` reads.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use prost::Message as _;
use teifleet_wire::headers;
use tokio::time::Instant;

use crate::admission::{Admission, Snapshot};
use crate::vocab::framing::GRPC_STATUS;

/// gRPC's per-call load report: `xds.data.orca.v3.OrcaLoadReport`, serialized.
pub const ENDPOINT_LOAD_METRICS_BIN: HeaderName = HeaderName::from_static(headers::ENDPOINT_LOAD_METRICS_BIN);
/// The same report for HTTP, in a format named by a prefix (`TEXT `).
pub const ENDPOINT_LOAD_METRICS: HeaderName = HeaderName::from_static(headers::ENDPOINT_LOAD_METRICS);

/// Key of the `utilization` entry: the share of the in-flight budget in use.
pub const BUDGET: &str = "budget";
/// Keys of the `named_metrics` entries, all counted in inputs as the budget is.
pub const IN_FLIGHT: &str = "in_flight";
pub const QUEUED: &str = "queued";
pub const LIMIT: &str = "limit";

/// `xds.data.orca.v3.OrcaLoadReport` (cncf/xds `xds/data/orca/v3/orca_load_report.proto`), field
/// for field. Derived here rather than generated: one message with no imports does not warrant
/// a vendored proto and its build step.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OrcaLoadReport {
    #[prost(double, tag = "1")]
    pub cpu_utilization: f64,
    #[prost(double, tag = "2")]
    pub mem_utilization: f64,
    /// Deprecated upstream for `rps_fractional`; never set here.
    #[prost(uint64, tag = "3")]
    pub rps: u64,
    #[prost(btree_map = "string, double", tag = "4")]
    pub request_cost: BTreeMap<String, f64>,
    /// Each value within [0, 1] (the proto's validation rules).
    #[prost(btree_map = "string, double", tag = "5")]
    pub utilization: BTreeMap<String, f64>,
    #[prost(double, tag = "6")]
    pub rps_fractional: f64,
    #[prost(double, tag = "7")]
    pub eps: f64,
    #[prost(btree_map = "string, double", tag = "8")]
    pub named_metrics: BTreeMap<String, f64>,
    /// May exceed 1.0 when load exceeds the reporter's soft limit (the proto's own words).
    #[prost(double, tag = "9")]
    pub application_utilization: f64,
}

impl OrcaLoadReport {
    /// The load on one pool's budget now.
    pub fn of(admission: &Admission) -> Option<Self> {
        Self::from_snapshot(&admission.snapshot(), admission.mean_service_time())
    }

    /// Both weighted round robins weigh a replica `rps_fractional / application_utilization` and
    /// ignore a report where either is zero. Utilization here is the inputs in flight and
    /// queued over the in-flight limit, and the rate is the inputs in flight over the mean time a
    /// permit is held (Little's law, so both move with the same in-flight count and a single
    /// sample is not noise): the weight comes out as the limit over the service time, the inputs
    /// a second this replica serves at full budget, lowered by the share of its work that waits
    /// in its queue. Utilization is not clamped at 1.0: a queue behind a full budget is load
    /// past the soft limit, and clamping would weigh a replica with a long queue like one without.
    /// An idle replica, or one that has not finished a call yet, reports nothing a balancer
    /// weighs; its last weight stands until the balancer's expiry period. `None` while the pool
    /// has no budget (not known yet): there is no load to speak of.
    pub fn from_snapshot(snapshot: &Snapshot, mean_service_time: Option<Duration>) -> Option<Self> {
        Figures::from_snapshot(snapshot, mean_service_time).map(|figures| figures.report())
    }

    /// The value of `endpoint-load-metrics-bin`: the message in base64, padded. gRPC receivers
    /// must take padded and unpadded values alike; Envoy's ORCA parser took only padded ones
    /// until a recent runtime guard (`orca_accept_unpadded_base64`), and tonic's binary
    /// metadata writes unpadded.
    pub fn to_bin_header(&self) -> Option<HeaderValue> {
        bin_value(&self.encode_to_vec())
    }

    /// The value of `endpoint-load-metrics` in Envoy's text form: `TEXT key=value,...`. The
    /// `utilization` map is left out: Envoy releases that parse this form without knowing its
    /// `utilization.` keys refuse the whole report over one key, and `application_utilization`
    /// says the same.
    pub fn to_text_header(&self) -> Option<HeaderValue> {
        let mut text = format!(
            "TEXT application_utilization={},rps_fractional={}",
            self.application_utilization, self.rps_fractional
        );
        for (name, value) in &self.named_metrics {
            let _ = write!(text, ",named_metrics.{name}={value}");
        }
        HeaderValue::try_from(text).ok()
    }
}

fn bin_value(message: &[u8]) -> Option<HeaderValue> {
    HeaderValue::try_from(base64::engine::general_purpose::STANDARD.encode(message)).ok()
}

/// What a report says about a pool's budget: the figures the message is made of.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Figures {
    application_utilization: f64,
    rps_fractional: f64,
    /// `utilization[BUDGET]`.
    budget: f64,
    in_flight: f64,
    queued: f64,
    limit: f64,
}

impl Figures {
    /// See [`OrcaLoadReport::from_snapshot`].
    fn from_snapshot(snapshot: &Snapshot, mean_service_time: Option<Duration>) -> Option<Self> {
        if snapshot.effective_limit == 0 {
            return None;
        }
        let limit = snapshot.effective_limit as f64;
        let in_flight = snapshot.in_flight as f64;
        let queued = snapshot.queued_total() as f64;
        let rps_fractional = match mean_service_time {
            Some(mean) if !mean.is_zero() => in_flight / two_significant_digits(mean.as_secs_f64()),
            _ => 0.0,
        };
        Some(Self {
            application_utilization: (in_flight + queued) / limit,
            rps_fractional,
            budget: (in_flight / limit).min(1.0),
            in_flight,
            queued,
            limit,
        })
    }

    fn report(&self) -> OrcaLoadReport {
        OrcaLoadReport {
            application_utilization: self.application_utilization,
            rps_fractional: self.rps_fractional,
            utilization: BTreeMap::from([(BUDGET.to_owned(), self.budget)]),
            named_metrics: BTreeMap::from([
                (IN_FLIGHT.to_owned(), self.in_flight),
                (QUEUED.to_owned(), self.queued),
                (LIMIT.to_owned(), self.limit),
            ]),
            ..OrcaLoadReport::default()
        }
    }

    /// [`Self::report`]'s wire form, byte for byte what prost writes for it, written without
    /// building its maps and their keys: every gRPC answer carries one.
    fn encode(&self, buf: &mut Vec<u8>) {
        use prost::encoding::{WireType, double, encode_key, encode_varint, encoded_len_varint, key_len};
        // A map entry as prost writes one: the key (field 1) and, unless zero, the value (2).
        let entry = |tag: u32, key: &str, value: f64, buf: &mut Vec<u8>| {
            let key_field = key_len(1) + encoded_len_varint(key.len() as u64) + key.len();
            let value_field = if value == 0.0 { 0 } else { double::encoded_len(2, &value) };
            encode_key(tag, WireType::LengthDelimited, buf);
            encode_varint((key_field + value_field) as u64, buf);
            encode_key(1, WireType::LengthDelimited, buf);
            encode_varint(key.len() as u64, buf);
            buf.extend_from_slice(key.as_bytes());
            if value != 0.0 {
                double::encode(2, &value, buf);
            }
        };
        entry(5, BUDGET, self.budget, buf);
        if self.rps_fractional != 0.0 {
            double::encode(6, &self.rps_fractional, buf);
        }
        // In the map's (sorted) order.
        for (key, value) in [(IN_FLIGHT, self.in_flight), (LIMIT, self.limit), (QUEUED, self.queued)] {
            entry(8, key, value, buf);
        }
        if self.application_utilization != 0.0 {
            double::encode(9, &self.application_utilization, buf);
        }
    }
}

/// The mean service time a report's rate is computed from, to two significant digits (1.1 ms,
/// 95 ms): well within the noise of a moving mean, and it makes consecutive reports of a steady
/// replica the same bytes. Every gRPC answer carries one, and HPACK sends a value it has sent
/// before as an index of a byte or two; a value new at every call was a literal, Huffman-coded,
/// that also evicted the connection's other headers from HPACK's table. The rate and the
/// utilization still move with the same in-flight count, so a replica's weight stays the limit
/// over the (rounded) service time whatever its momentary load.
fn two_significant_digits(value: f64) -> f64 {
    if !value.is_normal() || value < 0.0 {
        return value;
    }
    let scale = 10f64.powi(1 - value.log10().floor() as i32);
    (value * scale).round() / scale
}

/// How long a gRPC answer's load report is reused before the next answer's is written anew.
/// Both weighted round robins weigh a replica by its latest report and rebuild their weights at
/// most every 100 ms (A58's `weight_update_period`: 1 s by default, 100 ms at least; Envoy's
/// client-side round robin copies it), so reports a few milliseconds apart weigh the same. Writing
/// one (a snapshot under the pool's lock, protobuf, base64, then an HPACK literal, Huffman-coded,
/// that evicts the connection's other headers from HPACK's table) was about 4% of a proxied call's
/// instructions (callgrind), and at 1,000 calls a second the figures moved at nine answers in ten.
/// Refusals and errors are reported as they happen (see [`with_load_report`]).
pub const REPORT_REUSED_FOR: Duration = Duration::from_millis(5);

/// The last gRPC load report one replica wrote, with its figures and when: one per replica, as
/// several replicas may share a process (and its threads) in tests.
#[derive(Default)]
pub struct LastReport(Mutex<Option<Written>>);

struct Written {
    at: Instant,
    figures: Figures,
    value: HeaderValue,
}

impl LastReport {
    /// `endpoint-load-metrics-bin` for a gRPC answer: `admission`'s load, as the last report
    /// written if that is younger than `reuse_for` or says the same, else written now.
    pub fn bin_header(&self, admission: &Admission, reuse_for: Duration) -> Option<HeaderValue> {
        let now = Instant::now();
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(written) = last.as_ref()
            && now.saturating_duration_since(written.at) < reuse_for
        {
            return Some(written.value.clone());
        }
        let figures = Figures::from_snapshot(&admission.snapshot(), admission.mean_service_time())?;
        if let Some(written) = last.as_mut()
            && written.figures == figures
        {
            written.at = now;
            return Some(written.value.clone());
        }
        let mut message = Vec::with_capacity(128);
        figures.encode(&mut message);
        let value = bin_value(&message)?;
        *last = Some(Written { at: now, figures, value: value.clone() });
        Some(value)
    }
}

/// `endpoint-load-metrics` for an HTTP answer: `admission`'s load now.
pub fn text_header(admission: &Admission) -> Option<HeaderValue> {
    OrcaLoadReport::of(admission)?.to_text_header()
}

/// `response` with `endpoint-load-metrics-bin` set to what `report` says when the call ends: in
/// the trailers, or in the headers of a trailers-only answer (a refusal or an error before any
/// message), which are its trailers. `report` is told how long a report already written may be
/// reused: [`REPORT_REUSED_FOR`] for answers, none for trailers-only answers, since a replica
/// that sheds is the one whose load a balancer most needs to see. A report already there is
/// replaced: it came from another replica this call was forwarded or spilled to, and the caller
/// balances over this one.
pub fn with_load_report<F>(
    mut response: http::Response<tonic::body::Body>,
    report: F,
) -> http::Response<tonic::body::Body>
where
    F: FnOnce(Duration) -> Option<HeaderValue> + Send + Unpin + 'static,
{
    if response.headers().contains_key(GRPC_STATUS) {
        if let Some(value) = report(Duration::ZERO) {
            response.headers_mut().insert(ENDPOINT_LOAD_METRICS_BIN, value);
        }
        return response;
    }
    let report = move || report(REPORT_REUSED_FOR);
    response.map(|body| tonic::body::Body::new(WithTrailer::new(body, ENDPOINT_LOAD_METRICS_BIN, report)))
}

/// A body that passes every frame through and sets one trailer, computed when the inner body
/// ends (by `value`, called once), so a trailer describes the moment the answer ends. Trailers
/// are added when the inner body ends without any.
pub struct WithTrailer<B, F> {
    inner: B,
    name: HeaderName,
    value: Option<F>,
    ended: bool,
}

impl<B, F> WithTrailer<B, F> {
    pub fn new(inner: B, name: HeaderName, value: F) -> Self {
        Self { inner, name, value: Some(value), ended: false }
    }
}

impl<B, F> WithTrailer<B, F>
where
    F: FnOnce() -> Option<HeaderValue>,
{
    fn take(&mut self) -> Option<HeaderValue> {
        self.value.take().and_then(|value| value())
    }
}

impl<B, F> Body for WithTrailer<B, F>
where
    B: Body + Unpin,
    F: FnOnce() -> Option<HeaderValue> + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(error)) => return Poll::Ready(Some(Err(error))),
            None => {
                this.ended = true;
                let trailer = this.take().map(|value| HeaderMap::from_iter([(this.name.clone(), value)]));
                return Poll::Ready(trailer.map(|trailers| Ok(Frame::trailers(trailers))));
            }
        };
        match frame.into_trailers() {
            Ok(mut trailers) => {
                if let Some(value) = this.take() {
                    trailers.insert(this.name.clone(), value);
                }
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Err(frame) => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        // A trailer still owed is a frame still to come.
        self.ended || (self.value.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::{Buf, Bytes};
    use http_body_util::{BodyExt as _, Full, StreamBody};
    use prost::encoding::{WireType, decode_key, decode_varint};
    use tonic::{Code, Status};

    use super::*;
    use crate::admission::{Ask, Cost, Limits, Priority};

    fn snapshot(limit: usize, in_flight: usize, queued: [usize; 3]) -> Snapshot {
        Snapshot {
            limits: Limits::new(limit, 64, Duration::from_secs(2)),
            effective_limit: limit,
            in_flight,
            in_flight_tokens: 0,
            queued,
            chars_per_token: 4.0,
            standing_queue: false,
            device_time_cap: None,
            batch_line: None,
            ingest_places: 0,
            change: None,
        }
    }

    fn report(limit: usize, in_flight: usize, queued: [usize; 3], mean_ms: u64) -> OrcaLoadReport {
        OrcaLoadReport::from_snapshot(&snapshot(limit, in_flight, queued), Some(Duration::from_millis(mean_ms)))
            .expect("a budget")
    }

    /// The weight gRPC's and Envoy's weighted round robins give a report (error penalty aside).
    fn weight(report: &OrcaLoadReport) -> f64 {
        report.rps_fractional / report.application_utilization
    }

    #[test]
    fn the_report_says_how_full_the_budget_is() {
        let report = report(8, 4, [1, 2, 0], 100);
        assert_eq!(report.application_utilization, 7.0 / 8.0);
        assert_eq!(report.rps_fractional, 40.0, "4 inputs in flight, each for 100 ms");
        assert_eq!(report.utilization, BTreeMap::from([(BUDGET.to_owned(), 0.5)]));
        let named: Vec<(&str, f64)> = report.named_metrics.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(named, [(IN_FLIGHT, 4.0), (LIMIT, 8.0), (QUEUED, 3.0)]);
        assert_eq!((report.cpu_utilization, report.mem_utilization, report.eps, report.rps), (0.0, 0.0, 0.0, 0));
    }

    #[test]
    fn a_queue_behind_a_full_budget_reads_as_more_than_full() {
        let full = report(8, 8, [0; 3], 100);
        let queued = report(8, 8, [0, 8, 0], 100);
        assert_eq!(full.application_utilization, 1.0);
        assert_eq!(queued.application_utilization, 2.0, "not clamped");
        assert_eq!(queued.utilization[BUDGET], 1.0, "the map stays within [0, 1]");
        assert!(weight(&queued) < weight(&full));
    }

    #[test]
    fn the_weight_is_what_the_budget_serves_whatever_the_momentary_load() {
        // Replicas with the same budget and service time weigh the same however busy each is at
        // its report; a faster one, or one with a larger budget, weighs more in proportion.
        let (quiet, busy) = (report(8, 1, [0; 3], 100), report(8, 7, [0; 3], 100));
        assert!((weight(&quiet) - weight(&busy)).abs() < 1e-9);
        assert!((weight(&quiet) - 80.0).abs() < 1e-9, "8 inputs each 100 ms: 80 inputs a second");
        assert!((weight(&report(8, 3, [0; 3], 50)) - 2.0 * weight(&quiet)).abs() < 1e-9);
        assert!((weight(&report(16, 3, [0; 3], 100)) - 2.0 * weight(&quiet)).abs() < 1e-9);
    }

    #[test]
    fn no_report_without_a_budget_and_nothing_weighed_before_a_call_has_finished() {
        assert_eq!(OrcaLoadReport::from_snapshot(&snapshot(0, 0, [0; 3]), None), None);
        let report = OrcaLoadReport::from_snapshot(&snapshot(4, 2, [0; 3]), None).unwrap();
        assert_eq!(report.rps_fractional, 0.0, "balancers ignore a report without a rate");
        assert_eq!(report.application_utilization, 0.5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_report_of_a_live_pool() {
        let admission = Admission::new(Limits::new(4, 8, Duration::from_secs(1)));
        let first = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        drop(first);
        let two = Ask::new(Priority::Standard).cost(Cost { inputs: 2, tokens: 0 });
        let _held = admission.acquire(two).await.unwrap();
        let report = OrcaLoadReport::of(&admission).unwrap();
        assert_eq!(report.application_utilization, 0.5);
        assert!((report.rps_fractional - 20.0).abs() < 1e-9, "{}", report.rps_fractional);
        let last = LastReport::default();
        let decoded = decode_bin(&last.bin_header(&admission, Duration::ZERO).unwrap());
        assert_eq!(decoded, report);
        assert_eq!(decode_bin(&last.bin_header(&admission, Duration::ZERO).unwrap()), report, "the same load");
        // A load that changed is reported, not the last report written...
        let more = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
        let now = OrcaLoadReport::of(&admission).unwrap();
        assert_eq!(now.application_utilization, 0.75);
        assert_eq!(decode_bin(&last.bin_header(&admission, Duration::ZERO).unwrap()), now);
        // ...unless the last was written within the time it may be reused for.
        let in_flight = |value: HeaderValue| decode_bin(&value).named_metrics[IN_FLIGHT];
        drop(more);
        tokio::time::advance(REPORT_REUSED_FOR / 2).await;
        assert_eq!(in_flight(last.bin_header(&admission, REPORT_REUSED_FOR).unwrap()), 3.0, "reused");
        assert_eq!(in_flight(last.bin_header(&admission, Duration::ZERO).unwrap()), 2.0, "written now");
        let _more = admission.acquire(Ask::new(Priority::Standard)).await.unwrap();
        assert_eq!(in_flight(last.bin_header(&admission, REPORT_REUSED_FOR).unwrap()), 2.0, "reused");
        tokio::time::advance(REPORT_REUSED_FOR).await;
        assert_eq!(in_flight(last.bin_header(&admission, REPORT_REUSED_FOR).unwrap()), 3.0, "too old: written anew");
    }

    #[test]
    fn replicas_sharing_a_process_keep_their_own_reports() {
        let (small, large) = (
            Admission::new(Limits::new(2, 8, Duration::from_secs(1))),
            Admission::new(Limits::new(8, 8, Duration::from_secs(1))),
        );
        let (small_last, large_last) = (LastReport::default(), LastReport::default());
        let limit = |value: HeaderValue| decode_bin(&value).named_metrics[LIMIT];
        assert_eq!(limit(small_last.bin_header(&small, REPORT_REUSED_FOR).unwrap()), 2.0);
        assert_eq!(limit(large_last.bin_header(&large, REPORT_REUSED_FOR).unwrap()), 8.0);
        assert_eq!(limit(small_last.bin_header(&small, REPORT_REUSED_FOR).unwrap()), 2.0);
    }

    #[test]
    fn the_rate_is_computed_from_the_mean_to_two_significant_digits() {
        for (mean, rounded) in [(0.001_149, 0.0011), (0.000_951, 0.000_95), (0.0955, 0.096), (12.3, 12.0), (0.1, 0.1)] {
            assert!(
                (two_significant_digits(mean) - rounded).abs() < rounded * 1e-9,
                "{mean}: {}",
                two_significant_digits(mean)
            );
        }
        // A steady replica's reports are the same bytes, and its weight stays the limit over the
        // (rounded) service time whatever its momentary load.
        let at = |in_flight, micros| {
            OrcaLoadReport::from_snapshot(&snapshot(8, in_flight, [0; 3]), Some(Duration::from_micros(micros))).unwrap()
        };
        assert_eq!(at(3, 1_149).encode_to_vec(), at(3, 1_101).encode_to_vec(), "both 1.1 ms");
        assert!((weight(&at(1, 1_149)) - weight(&at(7, 1_149))).abs() < 1e-9);
        assert!((weight(&at(1, 1_149)) - 8.0 / 0.0011).abs() < 1e-6);
    }

    #[test]
    fn the_hand_written_encoding_is_prosts() {
        let mean = |ms| Some(Duration::from_millis(ms));
        for (snapshot, mean) in [
            (snapshot(8, 4, [1, 2, 0]), mean(100)),
            (snapshot(8, 0, [0; 3]), mean(100)),
            (snapshot(8, 8, [0, 8, 0]), mean(3)),
            (snapshot(200, 150, [0; 3]), None),
            (snapshot(1, 1, [400, 0, 0]), mean(0)),
        ] {
            let figures = Figures::from_snapshot(&snapshot, mean).unwrap();
            let mut written = Vec::new();
            figures.encode(&mut written);
            assert_eq!(written, figures.report().encode_to_vec(), "{figures:?}");
        }
    }

    fn decode_bin(value: &HeaderValue) -> OrcaLoadReport {
        // Strict: padding required, as Envoy's decoder without the unpadded guard.
        let bytes = base64::engine::general_purpose::STANDARD.decode(value.as_bytes()).expect("padded base64");
        OrcaLoadReport::decode(bytes.as_slice()).unwrap()
    }

    /// Every top-level field as (number, wire type, payload), read with prost's primitives only.
    fn fields(mut buf: &[u8]) -> Vec<(u32, WireType, Vec<u8>)> {
        let mut fields = Vec::new();
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf).unwrap();
            let payload = match wire_type {
                WireType::SixtyFourBit => buf.copy_to_bytes(8),
                WireType::LengthDelimited => {
                    let len = decode_varint(&mut buf).unwrap() as usize;
                    buf.copy_to_bytes(len)
                }
                other => panic!("unexpected wire type {other:?} for field {tag}"),
            };
            fields.push((tag, wire_type, payload.to_vec()));
        }
        fields
    }

    fn double(payload: &[u8]) -> f64 {
        f64::from_le_bytes(payload.try_into().unwrap())
    }

    /// A map entry: key string (field 1), value double (field 2).
    fn entry(payload: &[u8]) -> (String, f64) {
        let fields = fields(payload);
        assert_eq!(fields.len(), 2);
        assert_eq!((fields[0].0, fields[0].1), (1, WireType::LengthDelimited));
        assert_eq!((fields[1].0, fields[1].1), (2, WireType::SixtyFourBit));
        (String::from_utf8(fields[0].2.clone()).unwrap(), double(&fields[1].2))
    }

    #[test]
    fn the_bytes_carry_the_upstream_field_numbers() {
        let report = report(8, 4, [0, 2, 0], 100);
        let fields = fields(&report.encode_to_vec());
        let numbers: Vec<u32> = fields.iter().map(|field| field.0).collect();
        // utilization (5), rps_fractional (6), named_metrics (8) x3, application_utilization (9);
        // zeros are not written.
        assert_eq!(numbers, [5, 6, 8, 8, 8, 9]);
        assert_eq!(entry(&fields[0].2), (BUDGET.to_owned(), 0.5));
        assert_eq!((fields[1].1, double(&fields[1].2)), (WireType::SixtyFourBit, 40.0));
        let named: Vec<(String, f64)> = fields[2..5].iter().map(|field| entry(&field.2)).collect();
        assert_eq!(named, [(IN_FLIGHT.into(), 4.0), (LIMIT.into(), 8.0), (QUEUED.into(), 2.0)]);
        assert_eq!((fields[5].1, double(&fields[5].2)), (WireType::SixtyFourBit, 0.75));
    }

    #[test]
    fn decodes_bytes_written_from_the_proto_by_hand() {
        // cpu_utilization (1) 0.5, mem_utilization (2) 0.25, rps (3) 7, request_cost (4) {a: 1},
        // rps_fractional (6) 100, eps (7) 2, application_utilization (9) 0.75: keys are
        // number << 3 | wire type (1: 64-bit, 0: varint, 2: length-delimited).
        let mut bytes = vec![0x09];
        bytes.extend(0.5f64.to_le_bytes());
        bytes.push(0x11);
        bytes.extend(0.25f64.to_le_bytes());
        bytes.extend([0x18, 7]);
        bytes.extend([0x22, 12, 0x0a, 1, b'a', 0x11]);
        bytes.extend(1.0f64.to_le_bytes());
        bytes.push(0x31);
        bytes.extend(100.0f64.to_le_bytes());
        bytes.push(0x39);
        bytes.extend(2.0f64.to_le_bytes());
        bytes.push(0x49);
        bytes.extend(0.75f64.to_le_bytes());
        let report = OrcaLoadReport::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            report,
            OrcaLoadReport {
                cpu_utilization: 0.5,
                mem_utilization: 0.25,
                rps: 7,
                request_cost: BTreeMap::from([("a".to_owned(), 1.0)]),
                rps_fractional: 100.0,
                eps: 2.0,
                application_utilization: 0.75,
                ..OrcaLoadReport::default()
            }
        );
    }

    #[test]
    fn the_binary_header_is_padded_base64_that_tonic_reads_back() {
        let report = report(8, 4, [0, 2, 0], 100);
        let value = report.to_bin_header().unwrap();
        // Written out from the proto by hand, outside this crate.
        let expected = "KhEKBmJ1ZGdldBEAAAAAAADgPzEAAAAAAABEQEIUCglpbl9mbGlnaHQRAAAAAAAAEEBCEAoFbGltaXQRAAAAAAAAIEBC\
                        EQoGcXVldWVkEQAAAAAAAABASQAAAAAAAOg/";
        assert_eq!(value, expected);
        assert_eq!(decode_bin(&value), report);
        let mut headers = HeaderMap::new();
        headers.insert(ENDPOINT_LOAD_METRICS_BIN, value);
        let metadata = tonic::metadata::MetadataMap::from_headers(headers);
        let bytes = metadata.get_bin(ENDPOINT_LOAD_METRICS_BIN.as_str()).unwrap().to_bytes().unwrap();
        assert_eq!(OrcaLoadReport::decode(bytes).unwrap(), report);
    }

    /// Envoy's text form as its parser reads it: after `TEXT `, comma-separated `name=value`
    /// pairs, whitespace around them ignored; names are report fields or `named_metrics.<key>`;
    /// values finite, non-negative decimals; no name twice.
    fn parse_text(value: &HeaderValue) -> OrcaLoadReport {
        let text = value.to_str().unwrap().strip_prefix("TEXT ").expect("the TEXT prefix");
        let mut report = OrcaLoadReport::default();
        let mut seen = std::collections::BTreeSet::new();
        for pair in text.split(',').map(str::trim) {
            let (name, value) = pair.split_once('=').expect("name=value");
            assert!(seen.insert(name), "{name} twice");
            let value: f64 = value.parse().unwrap();
            assert!(value.is_finite() && value >= 0.0, "{name}={value}");
            match name {
                "application_utilization" => report.application_utilization = value,
                "rps_fractional" => report.rps_fractional = value,
                "cpu_utilization" => report.cpu_utilization = value,
                "mem_utilization" => report.mem_utilization = value,
                "eps" => report.eps = value,
                name => {
                    let key = name.strip_prefix("named_metrics.").unwrap_or_else(|| panic!("unknown metric {name}"));
                    assert!(!key.is_empty());
                    report.named_metrics.insert(key.to_owned(), value);
                }
            }
        }
        report
    }

    #[test]
    fn the_text_header_is_envoys_text_form() {
        let report = report(8, 4, [0, 2, 1], 100);
        let value = report.to_text_header().unwrap();
        assert_eq!(
            value,
            "TEXT application_utilization=0.875,rps_fractional=40,named_metrics.in_flight=4,\
             named_metrics.limit=8,named_metrics.queued=3"
        );
        assert_eq!(parse_text(&value), OrcaLoadReport { utilization: BTreeMap::new(), ..report });
    }

    fn trailer(value: &'static str) -> impl FnOnce() -> Option<HeaderValue> + Send + Unpin + 'static {
        move || Some(HeaderValue::from_static(value))
    }

    fn data_then_trailers(
        trailers: Option<HeaderMap>,
    ) -> impl Body<Data = Bytes, Error = Status> + Send + Unpin + 'static {
        let mut frames: Vec<Result<Frame<Bytes>, Status>> =
            vec![Ok(Frame::data(Bytes::from_static(b"one"))), Ok(Frame::data(Bytes::from_static(b"two")))];
        frames.extend(trailers.map(|trailers| Ok(Frame::trailers(trailers))));
        StreamBody::new(futures::stream::iter(frames))
    }

    async fn frames<B: Body<Data = Bytes> + Unpin>(mut body: B) -> (Vec<Bytes>, Vec<HeaderMap>)
    where
        B::Error: std::fmt::Debug,
    {
        let (mut data, mut trailers) = (Vec::new(), Vec::new());
        while let Some(frame) = body.frame().await {
            match frame.unwrap().into_data() {
                Ok(bytes) => data.push(bytes),
                Err(frame) => trailers.push(frame.into_trailers().unwrap()),
            }
        }
        assert!(body.frame().await.is_none(), "the body stays ended");
        (data, trailers)
    }

    #[tokio::test]
    async fn the_trailer_joins_the_bodys_own_trailers_after_its_data() {
        let own = HeaderMap::from_iter([(GRPC_STATUS, HeaderValue::from_static("0"))]);
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let body = WithTrailer::new(data_then_trailers(Some(own)), ENDPOINT_LOAD_METRICS_BIN, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Some(HeaderValue::from_static("report"))
        });
        let (data, trailers) = frames(body).await;
        assert_eq!(data, ["one", "two"]);
        assert_eq!(trailers.len(), 1);
        assert_eq!(trailers[0][GRPC_STATUS], "0");
        assert_eq!(trailers[0][ENDPOINT_LOAD_METRICS_BIN], "report");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "computed once, when the body ends");
    }

    #[tokio::test]
    async fn the_trailer_replaces_a_report_from_another_replica() {
        let own = HeaderMap::from_iter([(ENDPOINT_LOAD_METRICS_BIN, HeaderValue::from_static("theirs"))]);
        let body = WithTrailer::new(data_then_trailers(Some(own)), ENDPOINT_LOAD_METRICS_BIN, trailer("ours"));
        let (_, trailers) = frames(body).await;
        let values: Vec<_> = trailers[0].get_all(ENDPOINT_LOAD_METRICS_BIN).iter().collect();
        assert_eq!(values, ["ours"]);
    }

    #[tokio::test]
    async fn a_body_without_trailers_gets_them() {
        let body = WithTrailer::new(data_then_trailers(None), ENDPOINT_LOAD_METRICS_BIN, trailer("report"));
        let (data, trailers) = frames(body).await;
        assert_eq!(data.len(), 2);
        assert_eq!(trailers.len(), 1);
        assert_eq!(trailers[0][ENDPOINT_LOAD_METRICS_BIN], "report");

        let empty = WithTrailer::new(Full::new(Bytes::new()), ENDPOINT_LOAD_METRICS_BIN, trailer("report"));
        assert!(!empty.is_end_stream(), "a trailer is still owed");
        let (_, trailers) = frames(empty).await;
        assert_eq!(trailers.len(), 1);
    }

    #[tokio::test]
    async fn nothing_is_added_when_there_is_no_report() {
        let body = WithTrailer::new(data_then_trailers(None), ENDPOINT_LOAD_METRICS_BIN, || None);
        let (data, trailers) = frames(body).await;
        assert_eq!((data.len(), trailers.len()), (2, 0));
    }

    #[tokio::test]
    async fn a_grpc_answer_carries_the_report_in_its_trailers() {
        let own = HeaderMap::from_iter([(GRPC_STATUS, HeaderValue::from_static("0"))]);
        let response = http::Response::new(tonic::body::Body::new(data_then_trailers(Some(own))));
        let reuse = Arc::new(Mutex::new(None));
        let told = reuse.clone();
        let report = move |reuse_for| {
            *told.lock().unwrap() = Some(reuse_for);
            Some(HeaderValue::from_static("report"))
        };
        let response = with_load_report(response, report);
        assert!(!response.headers().contains_key(ENDPOINT_LOAD_METRICS_BIN));
        let collected = response.into_body().collect().await.unwrap();
        let trailers = collected.trailers().unwrap();
        assert_eq!(trailers[ENDPOINT_LOAD_METRICS_BIN], "report");
        assert_eq!(trailers[GRPC_STATUS], "0");
        assert_eq!(*reuse.lock().unwrap(), Some(REPORT_REUSED_FOR), "an answer may carry a recent report");
    }

    #[tokio::test]
    async fn a_trailers_only_answer_carries_it_in_its_headers_and_stays_trailers_only() {
        let mut status = Status::new(Code::ResourceExhausted, "the queue is full");
        status.metadata_mut().insert("grpc-retry-pushback-ms", "250".parse().unwrap());
        let response = with_load_report(status.into_http(), |reuse_for| {
            assert_eq!(reuse_for, Duration::ZERO, "a refusal reports the load as it is");
            Some(HeaderValue::from_static("report"))
        });
        assert_eq!(response.headers()[ENDPOINT_LOAD_METRICS_BIN], "report");
        assert_eq!(response.headers()["grpc-retry-pushback-ms"], "250", "the pushback stays");
        assert!(response.body().is_end_stream(), "headers with END_STREAM, as before");
        let status = Status::from_header_map(response.headers()).unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
    }
}
