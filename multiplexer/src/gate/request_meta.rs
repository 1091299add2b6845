//! What a request asks of the multiplexer, read from its HTTP/2 headers (gRPC metadata) before
//! anything else of the request is read.

use std::time::Duration;

use http::{HeaderMap, HeaderName};
use teifleet_wire::headers::{
    FORWARDED_BY as FORWARDED_BY_HEADER, GRPC_TIMEOUT as TIMEOUT_HEADER, LANE as LANE_HEADER, MODEL as MODEL_HEADER,
    POOL as POOL_HEADER, PREFIX as TEIFLEET_PREFIX, PRIORITY as PRIORITY_HEADER, SPILLED_FROM as SPILLED_FROM_HEADER,
    TENANT as TENANT_HEADER,
};
use tokio::time::Instant;

use crate::admission::{Lane, Priority, UnknownPriority};

/// Which pool should serve a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// No routing header: the pool this multiplexer fronts.
    Own,
    Pool(String),
    Model(String),
}

#[derive(Clone, Debug)]
pub struct RequestMeta {
    pub priority: Priority,
    /// `x-teifleet-lane`: interactive queries (the default) or bulk ingest.
    pub lane: Lane,
    /// The call named its lane itself; otherwise a bulk call (a stream, an Arrow batch) is
    /// `ingest` (`Forwarder::route`).
    pub lane_named: bool,
    pub target: Target,
    /// The caller's time budget from `grpc-timeout`.
    pub timeout: Option<Duration>,
    /// When the multiplexer answers at the latest: a little before the caller's own clock runs
    /// out, so the caller hears why.
    pub deadline: Option<Instant>,
    /// When the caller's clock runs out: the deadline passed on upstream, so the multiplexer's
    /// own deadline always fires first and the call is counted as a deadline, not as whatever
    /// the upstream's timer would answer.
    pub caller_deadline: Option<Instant>,
    /// Who forwarded this request to us, if anyone.
    pub forwarded_by: Option<String>,
    /// The sibling replica that spilled this call here, if one did: admitted only if there is
    /// room at once, never spilled again.
    pub spilled_from: Option<String>,
    /// The tenant the call is accounted to; `None`: the default tenant.
    pub tenant: Option<String>,
    /// The call came in through its pool's door (`crate::gate::door`): it waits in the queue for room
    /// rather than being refused for a full or slow one.
    pub through_door: bool,
}

// Looked up as names, not as text: a `&str` key is parsed and validated on every lookup, and
// these are read on every call.
static PRIORITY: HeaderName = HeaderName::from_static(PRIORITY_HEADER);
static LANE: HeaderName = HeaderName::from_static(LANE_HEADER);
static POOL: HeaderName = HeaderName::from_static(POOL_HEADER);
static MODEL: HeaderName = HeaderName::from_static(MODEL_HEADER);
static TENANT: HeaderName = HeaderName::from_static(TENANT_HEADER);
pub static GRPC_TIMEOUT: HeaderName = HeaderName::from_static(TIMEOUT_HEADER);
static FORWARDED_BY: HeaderName = HeaderName::from_static(FORWARDED_BY_HEADER);
pub static SPILLED_FROM: HeaderName = HeaderName::from_static(SPILLED_FROM_HEADER);

/// Removes `names` from `headers`. A removal hashes its name whether or not it is there, and a
/// call carries few headers and few of these: comparing names finds the ones to remove.
pub fn remove_all(headers: &mut HeaderMap, names: &[HeaderName]) {
    for name in names {
        if headers.keys().any(|present| present == name) {
            headers.remove(name);
        }
    }
}

/// The caller's headers that go along when a call the sidecar makes on its behalf (an HTTP
/// request's, a tei-manager batch's sub-batches) reaches another sidecar (another pool's, or a
/// sibling replica's it spills to): its key, priority, lane, tenant and routing, so that sidecar
/// decides as it would for the caller itself. TEI never sees them (`strip_for_tei`).
pub fn carried_to_peers(headers: &HeaderMap) -> tonic::metadata::MetadataMap {
    let mut carried = HeaderMap::new();
    for name in teifleet_wire::headers::CARRIED_TO_PEERS {
        for value in headers.get_all(name) {
            carried.append(HeaderName::from_static(name), value.clone());
        }
    }
    tonic::metadata::MetadataMap::from_headers(carried)
}

/// Removes what the local TEI must not see: the caller's key and every teifleet header (routing,
/// tenant, hop and spill marks). Most calls carry none, and then nothing is allocated.
pub fn strip_for_tei(headers: &mut HeaderMap) {
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|name| *name == http::header::AUTHORIZATION || name.as_str().starts_with(TEIFLEET_PREFIX))
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// Longest tenant name accepted, as the CRD allows.
pub const MAX_TENANT_LEN: usize = 128;

/// Names the call's tenant, replacing any tenant the caller named: an API key's tenant
/// (`crate::gate::auth`) wins over the caller's own `x-teifleet-tenant`, and everything after the gate
/// (admission fairness, the pool a call is forwarded to) reads the tenant from this one header.
pub fn name_tenant(metadata: &mut HeaderMap, tenant: http::HeaderValue) {
    metadata.insert(&TENANT, tenant);
}

/// Why a call's headers could not be read: a header it cannot parse, or a priority it does not
/// know. Both are the caller's fault, refused as INVALID_ARGUMENT (`crate::error` wraps them).
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetaError {
    #[error(transparent)]
    Metadata(#[from] InvalidMetadata),
    #[error(transparent)]
    Priority(#[from] UnknownPriority),
}

/// A routing or deadline header the multiplexer cannot read: the caller's fault, refused as
/// INVALID_ARGUMENT before anything else of the call is read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid {header} metadata: {reason}")]
pub struct InvalidMetadata {
    pub header: &'static str,
    pub reason: String,
}

fn text<'a>(metadata: &'a HeaderMap, header: &'static HeaderName) -> Result<Option<&'a str>, InvalidMetadata> {
    match metadata.get(header) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.trim()))
            .map_err(|_| InvalidMetadata { header: header.as_str(), reason: "not printable ASCII".into() }),
    }
}

fn non_empty<'a>(metadata: &'a HeaderMap, header: &'static HeaderName) -> Result<Option<&'a str>, InvalidMetadata> {
    match text(metadata, header)? {
        Some("") => Err(InvalidMetadata { header: header.as_str(), reason: "empty value".into() }),
        other => Ok(other),
    }
}

/// Reads priority, routing, deadline and hop marker. `arrived` is when the request came in.
pub fn parse(metadata: &HeaderMap, arrived: Instant) -> Result<RequestMeta, MetaError> {
    // Most calls carry none of these headers: comparing the few names a call has is cheaper than
    // hashing each of these names to look it up.
    let carries_any = metadata.keys().any(|name| name == GRPC_TIMEOUT || name.as_str().starts_with(TEIFLEET_PREFIX));
    let text = |metadata, header| if carries_any { text(metadata, header) } else { Ok(None) };
    let non_empty = |metadata, header| if carries_any { non_empty(metadata, header) } else { Ok(None) };
    let priority = match text(metadata, &PRIORITY)? {
        Some(value) => value.parse()?,
        None => Priority::default(),
    };
    let lane_text = text(metadata, &LANE)?;
    let lane_named = lane_text.is_some();
    let lane = match lane_text {
        Some(value) => value.parse().map_err(|unknown: crate::admission::UnknownLane| InvalidMetadata {
            header: LANE_HEADER,
            reason: format!("must be query or ingest (got {:?})", unknown.0),
        })?,
        None => Lane::default(),
    };
    let target = match (non_empty(metadata, &POOL)?, non_empty(metadata, &MODEL)?) {
        (Some(_), Some(_)) => {
            return Err(MetaError::Metadata(InvalidMetadata {
                header: POOL_HEADER,
                reason: format!("give either {POOL_HEADER} or {MODEL_HEADER}, not both"),
            }));
        }
        (Some(pool), None) => Target::Pool(pool.to_owned()),
        (None, Some(model)) => Target::Model(model.to_owned()),
        (None, None) => Target::Own,
    };
    let timeout = text(metadata, &GRPC_TIMEOUT)?.map(parse_grpc_timeout).transpose()?;
    let mut meta = RequestMeta {
        priority,
        lane,
        lane_named,
        target,
        timeout: None,
        deadline: None,
        caller_deadline: None,
        forwarded_by: text(metadata, &FORWARDED_BY)?.map(str::to_owned),
        spilled_from: text(metadata, &SPILLED_FROM)?.map(str::to_owned),
        through_door: false,
        tenant: match non_empty(metadata, &TENANT)? {
            Some(tenant) if tenant.len() > MAX_TENANT_LEN => {
                return Err(MetaError::Metadata(InvalidMetadata {
                    header: TENANT_HEADER,
                    reason: format!("at most {MAX_TENANT_LEN} characters"),
                }));
            }
            tenant => tenant.map(str::to_owned),
        },
    };
    if let Some(timeout) = timeout {
        meta.set_timeout(timeout, arrived);
    }
    Ok(meta)
}

impl RequestMeta {
    /// The caller's time budget, counted from `arrived` (`grpc-timeout`, or the HTTP front's
    /// own header).
    pub fn set_timeout(&mut self, timeout: Duration, arrived: Instant) {
        self.timeout = Some(timeout);
        // Answer a little before the caller's own clock runs out, so it hears why.
        self.deadline = Some(arrived + timeout.saturating_sub(answer_margin(timeout)));
        self.caller_deadline = Some(arrived + timeout);
    }
}

fn answer_margin(timeout: Duration) -> Duration {
    (timeout / 20).clamp(Duration::from_millis(2), Duration::from_millis(20))
}

/// `grpc-timeout`: up to 8 digits and a unit (H, M, S, m, u, n), per the gRPC HTTP/2 spec.
pub fn parse_grpc_timeout(value: &str) -> Result<Duration, InvalidMetadata> {
    let invalid =
        || InvalidMetadata { header: TIMEOUT_HEADER, reason: format!("{value:?} is not <digits><H|M|S|m|u|n>") };
    // ASCII only, so the unit is the last byte (a split inside a character would panic).
    if value.len() < 2 || value.len() > 9 || !value.is_ascii() {
        return Err(invalid());
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    // Digits only: `u64::from_str` also takes a leading `+`.
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let amount: u64 = digits.parse().map_err(|_| invalid())?;
    Ok(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return Err(invalid()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (key, value) in pairs {
            map.insert(*key, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn defaults_to_standard_priority_and_own_pool() {
        let meta = parse(&HeaderMap::new(), Instant::now()).unwrap();
        assert_eq!((meta.priority, meta.target, meta.deadline), (Priority::Standard, Target::Own, None));
        assert_eq!(meta.lane, Lane::Query);
    }

    #[test]
    fn reads_the_lane() {
        let meta = parse(&metadata(&[(LANE_HEADER, "Ingest")]), Instant::now()).unwrap();
        assert_eq!(meta.lane, Lane::Ingest);
        let error = parse(&metadata(&[(LANE_HEADER, "bulk")]), Instant::now()).unwrap_err();
        assert!(
            error.to_string().contains("x-teifleet-lane") && error.to_string().contains("query or ingest"),
            "{error}"
        );
    }

    #[test]
    fn reads_priority_routing_and_deadline() {
        let now = Instant::now();
        let meta =
            parse(&metadata(&[(PRIORITY_HEADER, "critical"), (POOL_HEADER, "gte"), (TIMEOUT_HEADER, "1500m")]), now)
                .unwrap();
        assert_eq!(meta.priority, Priority::Critical);
        assert_eq!(meta.target, Target::Pool("gte".into()));
        assert_eq!(meta.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(meta.deadline, Some(now + Duration::from_millis(1480)), "20 ms before the caller's clock runs out");
    }

    #[test]
    fn refuses_bad_metadata_clearly() {
        let error = parse(&metadata(&[(PRIORITY_HEADER, "urgent")]), Instant::now()).unwrap_err();
        assert!(error.to_string().contains("critical, standard, sheddable"), "{error}");
        let error = parse(&metadata(&[(POOL_HEADER, "a"), (MODEL_HEADER, "b")]), Instant::now()).unwrap_err();
        assert!(error.to_string().contains("not both"), "{error}");
        assert!(parse(&metadata(&[(POOL_HEADER, "")]), Instant::now()).is_err());
        assert!(parse(&metadata(&[(TIMEOUT_HEADER, "10x")]), Instant::now()).is_err());
        let long = "t".repeat(129);
        let error = parse(&metadata(&[(TENANT_HEADER, &long)]), Instant::now()).unwrap_err();
        assert!(error.to_string().contains("x-teifleet-tenant"), "{error}");
        let meta = parse(&metadata(&[(TENANT_HEADER, "search")]), Instant::now()).unwrap();
        assert_eq!(meta.tenant.as_deref(), Some("search"));
    }

    #[test]
    fn a_named_tenant_replaces_the_callers() {
        let mut headers = metadata(&[(TENANT_HEADER, "batch")]);
        name_tenant(&mut headers, http::HeaderValue::from_static("search"));
        assert_eq!(parse(&headers, Instant::now()).unwrap().tenant.as_deref(), Some("search"));
        assert_eq!(headers.get_all(TENANT_HEADER).iter().count(), 1, "replaced, not added beside");
    }

    #[test]
    fn tei_sees_neither_the_key_nor_teifleets_headers() {
        let mut headers = metadata(&[
            ("authorization", "Bearer secret-key-0123456789"),
            (TENANT_HEADER, "search"),
            (PRIORITY_HEADER, "critical"),
            (SPILLED_FROM_HEADER, "pod-a"),
            ("x-custom", "kept"),
            ("grpc-accept-encoding", "gzip"),
        ]);
        strip_for_tei(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["grpc-accept-encoding", "x-custom"]);
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("2S").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_grpc_timeout("1M").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_grpc_timeout("1H").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_grpc_timeout("250u").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_grpc_timeout("99999999n").unwrap(), Duration::from_nanos(99_999_999));
        assert!(parse_grpc_timeout("123456789S").is_err(), "at most 8 digits");
        assert!(parse_grpc_timeout("S").is_err());
    }
}
