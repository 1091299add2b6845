//! Label, annotation and name conventions shared by the operator and the multiplexer.

/// Label carrying the owning pool's name on every child object and pod.
pub const POOL_LABEL: &str = "teifleet.dev/pool";
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";

/// `app.kubernetes.io/managed-by` value, also the server-side apply field manager.
pub const MANAGER: &str = "teifleet-operator";

/// Environment variables the operator sets on the multiplexer sidecar.
pub const ENV_POOL: &str = "TEIFLEET_POOL";
pub const ENV_NAMESPACE: &str = "TEIFLEET_NAMESPACE";
pub const ENV_POD_NAME: &str = "TEIFLEET_POD_NAME";

/// What a pool's name takes to name its headless Service.
pub const PEERS_SUFFIX: &str = "-peers";

/// Name of the headless Service used for peer discovery and client-side balancing.
pub fn peers_service_name(pool: &str) -> String {
    format!("{pool}{PEERS_SUFFIX}")
}

/// Name of the ServiceAccount (and Role, RoleBinding) the pool's sidecars run as.
pub fn sidecar_account_name(pool: &str) -> String {
    format!("{pool}-multiplexer")
}

/// Name of the pool's peer Secret: the key its sidecars share to prove to each other that a
/// spilled or forwarded call comes from a sibling. The operator creates it (data key
/// [`PEER_SECRET_KEY`]) and never reads it; only the pool's sidecars may.
pub fn peer_secret_name(pool: &str) -> String {
    format!("{pool}-teifleet-peer")
}

/// The data key of the peer Secret holding the shared key: 32 random bytes, written as base64url
/// without padding (43 characters).
pub const PEER_SECRET_KEY: &str = "key";

/// Label selector string selecting a pool's pods.
pub fn pool_selector(pool: &str) -> String {
    format!("{POOL_LABEL}={pool}")
}

/// `app.kubernetes.io/part-of` value on everything teifleet runs.
pub const PART_OF: &str = "teifleet";

/// `app.kubernetes.io/component` value of a namespace's activator pods: they hold calls for pools
/// scaled to zero while a replica starts, and report them to the operator.
pub const ACTIVATOR_COMPONENT: &str = "activator";

/// Label selector string selecting the activator pods of a namespace.
pub fn activator_selector() -> String {
    format!("{COMPONENT_LABEL}={ACTIVATOR_COMPONENT},{PART_OF_LABEL}={PART_OF}")
}
