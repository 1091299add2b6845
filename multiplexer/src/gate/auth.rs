//! API keys: the gate every call passes before anything else is read of it. With keys on, a call
//! must carry `authorization: Bearer <key>` (gRPC metadata and HTTP alike: the OpenAI SDKs send
//! their `api_key` that way), and the key names the call's tenant, replacing whatever tenant the
//! call named itself. A refused call never reaches routing or a queue; it is counted in
//! `teifleet_auth_failures_total{pool, protocol, reason}`.
//!
//! The keys come from a source (`sources::secret` in Kubernetes, `sources::file` otherwise) and
//! change live: the source swaps the whole [`KeyRing`] at once.
//!
//! An identified caller (by key, or by a mutual-TLS client certificate) also gets its tenant's
//! priority ceiling: a call asking for more than its tenant may is served at the ceiling, which is
//! `standard` unless the pool grants the tenant `critical` (`tenants[].maxPriority`). Without
//! identity there is nothing to hold a claim against, and the call's own priority stands.
//!
//! The gate guards the multiplexer a call enters, with that multiplexer's own pool's keys. A call
//! routed on to another pool carries its `authorization` header along, and that pool's sidecar
//! checks it against that pool's keys (routing between two pools with keys needs a key both
//! accept; pools may share one Secret).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{PoisonError, RwLock};

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use subtle::{ConditionallySelectable as _, ConstantTimeEq as _};
use teifleet_runtime::tls::ClientIdentity;

use crate::admission::{Lane, Priority};
use crate::gate::request_meta;
use crate::vocab::Protocol;
use crate::vocab::SetupError;

/// Shortest key accepted. A key is a password that clients keep in configuration files; sixteen
/// random characters are out of reach of guessing, shorter ones invite `changeme`.
pub const MIN_KEY_LEN: usize = 16;

/// The highest priority an identified tenant may ask for unless the pool grants it more.
pub const DEFAULT_CEILING: Priority = Priority::Standard;

/// A ceiling as the pool's spec (or the configuration file) spells it.
pub fn ceiling(spelled: teifleet_crds::PriorityCeiling) -> Priority {
    match spelled {
        teifleet_crds::PriorityCeiling::Critical => Priority::Critical,
        teifleet_crds::PriorityCeiling::Standard => Priority::Standard,
        teifleet_crds::PriorityCeiling::Sheddable => Priority::Sheddable,
    }
}

/// A lane as the pool's spec (or the configuration file) spells it.
pub fn lane(spelled: teifleet_crds::LaneName) -> Lane {
    match spelled {
        teifleet_crds::LaneName::Query => Lane::Query,
        teifleet_crds::LaneName::Ingest => Lane::Ingest,
    }
}

/// What the pool grants an identified tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// The highest priority its calls may ask for; none: [`DEFAULT_CEILING`].
    pub max_priority: Option<Priority>,
    /// The lane its calls take when they name none; none: the call's own default.
    pub lane: Option<Lane>,
}

/// The grants `tenants` make (tenants without any are left to the defaults).
pub fn grants_of(tenants: &[teifleet_crds::TenantWeight]) -> BTreeMap<String, Grant> {
    tenants
        .iter()
        .map(|t| (t.name.clone(), Grant { max_priority: t.max_priority.map(ceiling), lane: t.lane.map(lane) }))
        .filter(|(_, grant)| *grant != Grant::default())
        .collect()
}

/// Why a call was refused at the gate; `reason` label of the failures metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `authorization` header.
    Missing,
    /// An `authorization` header that is not `Bearer <key>`.
    Malformed,
    /// A key that is not one of the pool's.
    InvalidKey,
    /// Keys are on, but not read yet (or their Secret is gone): nobody can be told apart.
    KeysNotLoaded,
}

impl AuthFailure {
    /// What the caller is told. Nothing about which keys exist.
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "this pool needs an API key: send the header `authorization: Bearer <key>`",
            Self::Malformed => "the authorization header must be `Bearer <key>`",
            Self::InvalidKey => "invalid API key",
            Self::KeysNotLoaded => "this pool's API keys are not loaded yet; retry shortly",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::InvalidKey => "invalid_key",
            Self::KeysNotLoaded => "keys_not_loaded",
        }
    }
}

/// A pool's API keys, each naming its tenant.
pub struct KeyRing {
    /// Every key and the index of its tenant in `tenants`.
    keys: Vec<(Box<[u8]>, u32)>,
    /// Tenant names as the header value the gate writes.
    tenants: Vec<HeaderValue>,
}

impl KeyRing {
    /// Reads `(tenant, value)` entries, as a Secret's data holds them: the value is the tenant's
    /// key, or several separated by whitespace (one per line), so a rotation can run with old and
    /// new key both valid. Entries that cannot be used are skipped; the second value says why,
    /// for the log (never a key).
    pub fn parse<'a>(entries: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> (Self, Vec<String>) {
        let mut problems = Vec::new();
        let mut tenants = Vec::new();
        let mut owner_of: Vec<(&'a [u8], u32)> = Vec::new();
        let mut ambiguous: Vec<&'a [u8]> = Vec::new();
        for (tenant, value) in entries {
            let name = match HeaderValue::from_str(tenant) {
                Ok(name) if !tenant.is_empty() && tenant.len() <= request_meta::MAX_TENANT_LEN => name,
                _ => {
                    problems.push(format!(
                        "tenant {tenant:?}: a name must be 1 to {} printable characters",
                        request_meta::MAX_TENANT_LEN
                    ));
                    continue;
                }
            };
            let Ok(text) = std::str::from_utf8(value) else {
                problems.push(format!("tenant {tenant}: the value is not text"));
                continue;
            };
            let index = u32::try_from(tenants.len()).unwrap_or(u32::MAX);
            let mut usable = 0;
            for (position, key) in text.split_ascii_whitespace().enumerate() {
                let key = key.as_bytes();
                if key.len() < MIN_KEY_LEN || !key.iter().all(u8::is_ascii_graphic) {
                    problems.push(format!(
                        "tenant {tenant}: key {} is shorter than {MIN_KEY_LEN} characters or not printable ASCII",
                        position + 1
                    ));
                    continue;
                }
                match owner_of.iter().find(|(known, _)| *known == key) {
                    Some((_, owner)) if *owner == index => {}
                    Some(_) => ambiguous.push(key),
                    None => owner_of.push((key, index)),
                }
                usable += 1;
            }
            if usable == 0 {
                problems.push(format!("tenant {tenant}: no usable key"));
                continue;
            }
            tenants.push(name);
        }
        if !ambiguous.is_empty() {
            problems.push(format!("{} key(s) appear under two tenants; refused for both", ambiguous.len()));
        }
        let keys = owner_of
            .into_iter()
            .filter(|(key, _)| !ambiguous.contains(key))
            .map(|(key, tenant)| (Box::from(key), tenant))
            .collect();
        (Self { keys, tenants }, problems)
    }

    /// Keys in the ring.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tenant `presented` names. Every key is compared, each in constant time, so how long
    /// this takes says nothing about which key, or how much of one, matched.
    fn tenant_of(&self, presented: &[u8]) -> Option<&HeaderValue> {
        let mut found = u32::MAX;
        for (key, tenant) in &self.keys {
            found.conditional_assign(tenant, key.as_ref().ct_eq(presented));
        }
        self.tenants.get(found as usize)
    }
}

impl fmt::Debug for KeyRing {
    /// Counts only: a ring must never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing").field("keys", &self.keys.len()).field("tenants", &self.tenants.len()).finish()
    }
}

/// Whether calls must carry a key.
#[derive(Debug)]
pub enum Policy {
    /// No keys: every call passes, and `x-teifleet-tenant` names the tenant.
    Off,
    /// Keys are on but not read yet: every call is refused with [`AuthFailure::KeysNotLoaded`].
    Waiting,
    /// Only calls carrying one of these keys pass.
    Keys(KeyRing),
}

/// The check both fronts run first, and its metrics.
pub struct Gate {
    pool: String,
    policy: RwLock<Policy>,
    /// The highest priority each identified tenant may ask for; others get [`DEFAULT_CEILING`].
    grants: RwLock<BTreeMap<String, Grant>>,
    failures: IntCounterVec,
    keys_in_force: IntGauge,
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate").field("pool", &self.pool).field("policy", &*self.read()).finish()
    }
}

impl Gate {
    /// A gate that lets everything through and reports nothing.
    pub fn off() -> Self {
        Self::unregistered("", Policy::Off)
    }

    /// A gate for `pool`, the multiplexer's own pool, whose metrics are exported in `registry`.
    pub fn new(pool: &str, registry: &Registry, policy: Policy) -> Result<Self, SetupError> {
        let gate = Self::unregistered(pool, policy);
        teifleet_runtime::metrics::register(registry, &[&gate.failures, &gate.keys_in_force])
            .map_err(|e| SetupError::Config(format!("API key metrics: {e}")))?;
        Ok(gate)
    }

    /// A gate for `pool` whose refusals are counted by whoever asks it: the activator's, one per
    /// pool it holds calls for, beside the pool's own sidecars' gates (which count).
    pub fn unmetered(pool: &str, policy: Policy) -> Self {
        Self::unregistered(pool, policy)
    }

    fn unregistered(pool: &str, policy: Policy) -> Self {
        let failures = IntCounterVec::new(
            Opts::new(
                "teifleet_auth_failures_total",
                "Calls refused for their API key, before routing or admission, by protocol and reason.",
            ),
            &["pool", "protocol", "reason"],
        )
        .expect("valid counter");
        let keys_in_force = IntGauge::with_opts(
            Opts::new("teifleet_auth_keys", "API keys in force (0 without spec.auth or before they are read).")
                .const_label("pool", pool),
        )
        .expect("valid gauge");
        let gate = Self {
            pool: pool.to_owned(),
            policy: RwLock::new(Policy::Off),
            grants: RwLock::default(),
            failures,
            keys_in_force,
        };
        gate.set(policy);
        gate
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Policy> {
        self.policy.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `policy` in force for every call from now on.
    pub fn set(&self, policy: Policy) {
        let keys = match &policy {
            Policy::Keys(ring) => ring.len(),
            Policy::Off | Policy::Waiting => 0,
        };
        self.keys_in_force.set(i64::try_from(keys).unwrap_or(i64::MAX));
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = policy;
    }

    /// Puts tenants' grants in force (tenants not named get [`DEFAULT_CEILING`] and the call's
    /// own lane).
    pub fn set_grants(&self, grants: BTreeMap<String, Grant>) {
        *self.grants.write().unwrap_or_else(PoisonError::into_inner) = grants;
    }

    /// Applies what the pool grants `tenant`: the call's priority lowered to its ceiling, and its
    /// lane, unless the call names one.
    fn apply_grant(&self, headers: &mut HeaderMap, tenant: &HeaderValue) {
        let grant = {
            let grants = self.grants.read().unwrap_or_else(PoisonError::into_inner);
            tenant.to_str().ok().and_then(|name| grants.get(name)).copied().unwrap_or_default()
        };
        if let Some(lane) = grant.lane
            && !headers.contains_key(teifleet_wire::headers::LANE)
        {
            headers.insert(teifleet_wire::headers::LANE, HeaderValue::from_static(lane.as_str()));
        }
        let Some(asked) = headers.get(teifleet_wire::headers::PRIORITY) else { return };
        // A priority that is no priority is refused later, by request_meta, as the caller's error.
        let Ok(asked) = asked.to_str().unwrap_or_default().parse::<Priority>() else { return };
        let ceiling = grant.max_priority.unwrap_or(DEFAULT_CEILING);
        if asked.rank() < ceiling.rank() {
            tracing::debug!(pool = %self.pool, ?tenant, %asked, %ceiling, "priority above the tenant's ceiling: lowered");
            headers.insert(teifleet_wire::headers::PRIORITY, HeaderValue::from_static(ceiling.as_str()));
        }
    }

    /// Whether a call carries one of the keys in force, changing nothing of it: the activator's
    /// check before it holds a call for a pool at zero (the pool's sidecar names the tenant).
    pub fn check(&self, headers: &HeaderMap) -> Result<(), AuthFailure> {
        match &*self.read() {
            Policy::Off => Ok(()),
            Policy::Waiting => Err(AuthFailure::KeysNotLoaded),
            Policy::Keys(ring) => {
                presented_key(headers).and_then(|key| ring.tenant_of(key).map(|_| ()).ok_or(AuthFailure::InvalidKey))
            }
        }
    }

    /// Lets a call through or says why not. A call let through with a key is stamped with the
    /// key's tenant, over any tenant it named itself; without keys, a call on a connection whose
    /// client certificate was checked (mutual TLS) is stamped with the certificate's name.
    pub fn admit(
        &self,
        headers: &mut HeaderMap,
        certified: Option<&ClientIdentity>,
        protocol: Protocol,
    ) -> Result<(), AuthFailure> {
        let verdict = match &*self.read() {
            Policy::Off => {
                // A sibling passing a call on carries the tenant (and priority) its own gate named.
                if let Some(client) = certified.filter(|client| !client.sibling)
                    && let Some(tenant) = name_certified_tenant(headers, client)
                {
                    self.apply_grant(headers, &tenant);
                }
                return Ok(());
            }
            Policy::Waiting => Err(AuthFailure::KeysNotLoaded),
            Policy::Keys(ring) => {
                presented_key(headers).and_then(|key| ring.tenant_of(key).cloned().ok_or(AuthFailure::InvalidKey))
            }
        };
        match verdict {
            Ok(tenant) => {
                self.apply_grant(headers, &tenant);
                request_meta::name_tenant(headers, tenant);
                Ok(())
            }
            Err(failure) => {
                self.failures.with_label_values(&[&self.pool, protocol.as_str(), failure.label()]).inc();
                Err(failure)
            }
        }
    }
}

/// The tenant a client certificate names. A name that cannot be a tenant leaves the call to the
/// default tenant, never to the one it named itself: the certificate is who the caller is.
fn name_certified_tenant(headers: &mut HeaderMap, client: &ClientIdentity) -> Option<HeaderValue> {
    match HeaderValue::from_str(&client.name) {
        Ok(tenant) if !client.name.is_empty() && client.name.len() <= request_meta::MAX_TENANT_LEN => {
            request_meta::name_tenant(headers, tenant.clone());
            Some(tenant)
        }
        _ => {
            tracing::debug!(name = %client.name, "a client certificate's name is no tenant name: the default tenant");
            headers.remove(teifleet_wire::headers::TENANT);
            None
        }
    }
}

/// Who a connection's client certificate names (mutual TLS), from a request's extensions, where
/// both fronts' servers put it.
pub fn certified(extensions: &http::Extensions) -> Option<&ClientIdentity> {
    extensions.get::<Option<ClientIdentity>>().and_then(Option::as_ref)
}

/// The key of `authorization: Bearer <key>` (the scheme in any case, as RFC 9110 has it).
fn presented_key(headers: &HeaderMap) -> Result<&[u8], AuthFailure> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthFailure::Missing)?;
    if values.next().is_some() {
        return Err(AuthFailure::Malformed);
    }
    let text = value.as_bytes().trim_ascii();
    let (scheme, key) = text.split_at(text.iter().position(|b| *b == b' ').unwrap_or(text.len()));
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(AuthFailure::Malformed);
    }
    match key.trim_ascii() {
        b"" => Err(AuthFailure::Missing),
        key => Ok(key),
    }
}

#[cfg(test)]
mod tests {
    use teifleet_wire::headers::TENANT;

    use super::*;

    const SEARCH_KEY: &str = "search-key-0123456789";
    const BATCH_KEY: &str = "batch-key-0123456789";

    fn ring(entries: &[(&str, &str)]) -> (KeyRing, Vec<String>) {
        KeyRing::parse(entries.iter().map(|(tenant, value)| (*tenant, value.as_bytes())))
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        map
    }

    fn gate(entries: &[(&str, &str)]) -> (Gate, Registry) {
        let registry = Registry::new();
        let gate = Gate::new("bge", &registry, Policy::Keys(ring(entries).0)).unwrap();
        (gate, registry)
    }

    #[test]
    fn a_key_names_its_tenant_over_the_callers_own() {
        let (gate, _) = gate(&[("search", SEARCH_KEY), ("batch", BATCH_KEY)]);
        let mut call = headers(&[("authorization", &format!("Bearer {SEARCH_KEY}")), (TENANT, "batch")]);
        assert_eq!(gate.admit(&mut call, None, Protocol::Grpc), Ok(()));
        assert_eq!(call[TENANT], "search");
        let mut call = headers(&[("authorization", &format!("bearer  {BATCH_KEY} "))]);
        assert_eq!(gate.admit(&mut call, None, Protocol::Http), Ok(()));
        assert_eq!(call[TENANT], "batch", "the scheme in any case, spaces around the key");
    }

    #[test]
    fn refusals_say_why_and_are_counted() {
        let (gate, registry) = gate(&[("search", SEARCH_KEY)]);
        let basic = format!("Basic {SEARCH_KEY}");
        let cases = [
            (vec![], AuthFailure::Missing),
            (vec![("authorization", "Bearer ")], AuthFailure::Missing),
            (vec![("authorization", SEARCH_KEY)], AuthFailure::Malformed),
            (vec![("authorization", basic.as_str())], AuthFailure::Malformed),
            (vec![("authorization", "Bearer a"), ("authorization", "Bearer b")], AuthFailure::Malformed),
            (vec![("authorization", "Bearer search-key-0123456780")], AuthFailure::InvalidKey),
            (vec![("authorization", "Bearer search-key-012345678")], AuthFailure::InvalidKey),
        ];
        for (pairs, failure) in cases {
            let mut call = headers(&pairs);
            assert_eq!(gate.admit(&mut call, None, Protocol::Grpc), Err(failure), "{pairs:?}");
            assert!(call.get(TENANT).is_none());
        }
        let text = teifleet_runtime::metrics::render(&registry).unwrap();
        let count = |reason: &str| {
            let series = format!("teifleet_auth_failures_total{{pool=\"bge\",protocol=\"grpc\",reason=\"{reason}\"}}");
            text.lines().find_map(|line| line.strip_prefix(&series)?.trim().parse::<u32>().ok())
        };
        assert_eq!((count("missing"), count("malformed"), count("invalid_key")), (Some(2), Some(3), Some(2)));
        assert!(text.contains("teifleet_auth_keys{pool=\"bge\"} 1"), "{text}");
    }

    #[test]
    fn an_identified_tenant_asks_for_at_most_its_ceiling() {
        let (gate, _) = gate(&[("search", SEARCH_KEY), ("batch", BATCH_KEY)]);
        gate.set_grants(BTreeMap::from([(
            "search".to_owned(),
            Grant { max_priority: Some(Priority::Critical), lane: None },
        )]));
        let priority = |key: &str, asked: &str| {
            let mut call = headers(&[("authorization", &format!("Bearer {key}")), ("x-teifleet-priority", asked)]);
            gate.admit(&mut call, None, Protocol::Grpc).unwrap();
            call["x-teifleet-priority"].to_str().unwrap().to_owned()
        };
        assert_eq!(priority(SEARCH_KEY, "critical"), "critical", "granted");
        assert_eq!(priority(BATCH_KEY, "critical"), "standard", "not granted: the default ceiling");
        assert_eq!(priority(BATCH_KEY, "sheddable"), "sheddable", "lower than the ceiling stands");
        assert_eq!(priority(BATCH_KEY, "urgent"), "urgent", "left for request_meta to refuse");

        let open = Gate::off();
        let certified = ClientIdentity { name: "batch".to_owned(), sibling: false, served: None };
        let mut call = headers(&[("x-teifleet-priority", "critical")]);
        open.admit(&mut call, Some(&certified), Protocol::Grpc).unwrap();
        assert_eq!(call["x-teifleet-priority"], "standard", "a certificate is an identity too");
        let mut anonymous = headers(&[("x-teifleet-priority", "critical")]);
        open.admit(&mut anonymous, None, Protocol::Grpc).unwrap();
        assert_eq!(anonymous["x-teifleet-priority"], "critical", "no identity: nothing to hold it against");
        let sibling = ClientIdentity { name: "bge".to_owned(), sibling: true, served: None };
        let mut passed_on = headers(&[("x-teifleet-priority", "critical")]);
        open.admit(&mut passed_on, Some(&sibling), Protocol::Grpc).unwrap();
        assert_eq!(passed_on["x-teifleet-priority"], "critical", "a sibling's gate held it already");
    }

    #[test]
    fn a_key_sets_its_tenants_lane_unless_the_call_names_one() {
        let (gate, _) = gate(&[("search", SEARCH_KEY), ("batch", BATCH_KEY)]);
        let tenants: Vec<teifleet_crds::TenantWeight> = serde_json::from_value(serde_json::json!([
            { "name": "batch", "lane": "ingest" },
            { "name": "search", "weight": 3 },
        ]))
        .unwrap();
        gate.set_grants(grants_of(&tenants));
        let lane = |key: &str, named: Option<&str>| {
            let authorization = format!("Bearer {key}");
            let mut pairs = vec![("authorization", authorization.as_str())];
            pairs.extend(named.map(|lane| ("x-teifleet-lane", lane)));
            let mut call = headers(&pairs);
            gate.admit(&mut call, None, Protocol::Grpc).unwrap();
            call.get("x-teifleet-lane").map(|lane| lane.to_str().unwrap().to_owned())
        };
        assert_eq!(lane(BATCH_KEY, None).as_deref(), Some("ingest"), "the key's lane");
        assert_eq!(lane(BATCH_KEY, Some("query")).as_deref(), Some("query"), "the call's own lane wins");
        assert_eq!(lane(SEARCH_KEY, None), None, "no lane granted: the call's default");
        assert_eq!(grants_of(&tenants).len(), 1, "a tenant with a weight only grants nothing");
    }

    #[test]
    fn a_check_says_whether_the_key_is_one_of_the_pools_and_changes_nothing() {
        let (gate, _) = gate(&[("search", SEARCH_KEY)]);
        let call = headers(&[("authorization", &format!("Bearer {SEARCH_KEY}")), (TENANT, "batch")]);
        assert_eq!(gate.check(&call), Ok(()));
        assert_eq!(call[TENANT], "batch", "the pool's sidecar names the tenant");
        assert_eq!(gate.check(&headers(&[])), Err(AuthFailure::Missing));
        assert_eq!(
            gate.check(&headers(&[("authorization", "Bearer search-key-0123456780")])),
            Err(AuthFailure::InvalidKey)
        );
        assert_eq!(Gate::unmetered("bge", Policy::Waiting).check(&call), Err(AuthFailure::KeysNotLoaded));
    }

    #[test]
    fn without_keys_the_callers_tenant_stands_and_while_waiting_nobody_passes() {
        let gate = Gate::off();
        let mut call = headers(&[(TENANT, "batch")]);
        assert_eq!(gate.admit(&mut call, None, Protocol::Grpc), Ok(()));
        assert_eq!(call[TENANT], "batch");
        gate.set(Policy::Waiting);
        let mut call = headers(&[("authorization", &format!("Bearer {SEARCH_KEY}"))]);
        assert_eq!(gate.admit(&mut call, None, Protocol::Grpc), Err(AuthFailure::KeysNotLoaded));
        gate.set(Policy::Keys(ring(&[("search", SEARCH_KEY)]).0));
        assert_eq!(gate.admit(&mut call, None, Protocol::Grpc), Ok(()));
    }

    #[test]
    fn a_tenant_may_hold_two_keys_while_one_rotates() {
        let (gate, _) = gate(&[("search", &format!("{SEARCH_KEY}\nsearch-key-new-0123456789\n"))]);
        for key in [SEARCH_KEY, "search-key-new-0123456789"] {
            let mut call = headers(&[("authorization", &format!("Bearer {key}"))]);
            assert_eq!(gate.admit(&mut call, None, Protocol::Http), Ok(()));
            assert_eq!(call[TENANT], "search");
        }
    }

    #[test]
    fn unusable_entries_are_skipped_with_a_reason_that_shows_no_key() {
        let (ring, problems) = ring(&[
            ("short", "tooshort"),
            ("twice-a", "shared-key-0123456789"),
            ("twice-b", "shared-key-0123456789"),
            ("", SEARCH_KEY),
            ("search", SEARCH_KEY),
        ]);
        assert_eq!(ring.len(), 1, "only search's key: {ring:?}");
        let all = problems.join("\n");
        assert!(all.contains("tenant short: key 1 is shorter than 16"), "{all}");
        assert!(all.contains("1 key(s) appear under two tenants"), "{all}");
        assert!(all.contains("tenant \"\""), "{all}");
        assert!(!all.contains("shared-key") && !all.contains(SEARCH_KEY), "no key in the log: {all}");
        assert!(!format!("{ring:?}").contains(SEARCH_KEY));
        let mut call = headers(&[("authorization", "Bearer shared-key-0123456789")]);
        let (gate, _) = gate(&[("twice-a", "shared-key-0123456789"), ("twice-b", "shared-key-0123456789")]);
        assert_eq!(gate.admit(&mut call, None, Protocol::Grpc), Err(AuthFailure::InvalidKey), "ambiguous: refused");
    }

    #[test]
    fn a_client_certificate_names_the_tenant_unless_keys_do_or_a_sibling_passes_a_call_on() {
        let gate = Gate::off();
        let certified = |name: &str, sibling| ClientIdentity { name: name.to_owned(), sibling, served: None };
        let tenant = |call: &HeaderMap| call.get(TENANT).map(|v| v.to_str().unwrap().to_owned());
        let mut call = headers(&[(TENANT, "batch")]);
        gate.admit(&mut call, Some(&certified("search", false)), Protocol::Grpc).unwrap();
        assert_eq!(tenant(&call), Some("search".into()), "the certificate over the tenant the call named");
        let mut passed_on = headers(&[(TENANT, "batch")]);
        gate.admit(&mut passed_on, Some(&certified("bge.ml.svc", true)), Protocol::Grpc).unwrap();
        assert_eq!(tenant(&passed_on), Some("batch".into()), "a sibling carries the tenant its gate named");
        let mut unnamable = headers(&[(TENANT, "batch")]);
        gate.admit(&mut unnamable, Some(&certified(&"x".repeat(500), false)), Protocol::Http).unwrap();
        assert_eq!(tenant(&unnamable), None, "a name that cannot be a tenant: the default tenant");

        let keyed = Gate::off();
        keyed.set(Policy::Keys(ring(&[("search", SEARCH_KEY)]).0));
        let mut call = headers(&[("authorization", &format!("Bearer {SEARCH_KEY}"))]);
        keyed.admit(&mut call, Some(&certified("batch", false)), Protocol::Grpc).unwrap();
        assert_eq!(tenant(&call), Some("search".into()), "with keys, the key decides");
    }
}
