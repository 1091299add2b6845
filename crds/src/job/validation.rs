//! What an EmbeddingJob's creator may not ask of the operator: labels and annotations that would
//! make the worker pods look like something else (a pool's sidecar, the activator, another Job's
//! pod), and a worker image of their own beside the claims and Secrets the operator mounts.
//!
//! Each refusal is written once here, as data: the CRD's CEL rule is printed from it and the
//! operator's rendering strips the same keys ([`reserved_label`], [`reserved_annotation`]), so the
//! two cannot drift apart.

/// Keys a creator's `template.labels` or `template.annotations` may not carry.
pub struct Reserved {
    /// Domains whose keys, and their subdomains' keys, are reserved (`teifleet.dev/pool`,
    /// `x.teifleet.dev/y`).
    pub domains: &'static [&'static str],
    /// Key prefixes reserved as a whole.
    pub prefixes: &'static [&'static str],
    /// Whole keys.
    pub keys: &'static [&'static str],
}

/// The pod labels the operator's selectors and Kubernetes' Job controller read:
/// - every `teifleet.dev` key: `teifleet.dev/pool` selects a pool's pods for its Services (so its
///   EndpointSlices: the sidecars' siblings, to whom they spill calls with the peer key and the
///   callers' `authorization`), its NetworkPolicy and its PodDisruptionBudget; `teifleet.dev/job`
///   is the job's own;
/// - the `app.kubernetes.io` labels the operator sets: `component` and `part-of` select the
///   activator's pods, and the pools' pods in the activator's egress policy;
/// - the Job controller's own: `batch.kubernetes.io/*`, and the legacy `job-name` and
///   `controller-uid` its selector matches.
pub const RESERVED_LABELS: Reserved = Reserved {
    domains: &[crate::GROUP],
    prefixes: &["batch.kubernetes.io/"],
    keys: &[
        crate::labels::NAME_LABEL,
        crate::labels::INSTANCE_LABEL,
        crate::labels::COMPONENT_LABEL,
        crate::labels::PART_OF_LABEL,
        crate::labels::MANAGED_BY_LABEL,
        "job-name",
        "controller-uid",
    ],
};

/// The pod annotations that say what a pod is or how it is confined: every `teifleet.dev` key,
/// the Job controller's (`batch.kubernetes.io/job-completion-index` is how the operator tells a
/// worker's index), and the AppArmor and seccomp annotations, which would loosen the confinement
/// the operator renders.
pub const RESERVED_ANNOTATIONS: Reserved = Reserved {
    domains: &[crate::GROUP],
    prefixes: &[
        "batch.kubernetes.io/",
        "container.apparmor.security.beta.kubernetes.io/",
        "seccomp.security.alpha.kubernetes.io/",
        "container.seccomp.security.alpha.kubernetes.io/",
    ],
    keys: &[],
};

impl Reserved {
    /// Whether `key` is reserved.
    pub fn contains(&self, key: &str) -> bool {
        let prefix = key.split_once('/').map(|(prefix, _)| prefix);
        let in_domain = |domain: &&str| {
            prefix.is_some_and(|prefix| {
                prefix == *domain || prefix.strip_suffix(*domain).is_some_and(|rest| rest.ends_with('.'))
            })
        };
        self.domains.iter().any(in_domain)
            || self.prefixes.iter().any(|reserved| key.starts_with(reserved))
            || self.keys.contains(&key)
    }

    /// The CEL rule of a map whose keys must not be reserved. Without regular expressions: a key
    /// holds at most one `/`, so `.teifleet.dev/` found in it can only end its prefix.
    pub fn rule(&self) -> String {
        let mut refused: Vec<String> = Vec::new();
        for domain in self.domains {
            refused.push(format!("k.startsWith('{domain}/')"));
            refused.push(format!("k.contains('.{domain}/')"));
        }
        refused.extend(self.prefixes.iter().map(|prefix| format!("k.startsWith('{prefix}')")));
        if !self.keys.is_empty() {
            let keys: Vec<String> = self.keys.iter().map(|key| format!("'{key}'")).collect();
            refused.push(format!("k in [{}]", keys.join(", ")));
        }
        format!("self.all(k, !({}))", refused.join(" || "))
    }

    /// The reserved keys as a person reads them.
    fn described(&self) -> String {
        let domains = self.domains.iter().map(|domain| format!("{domain}/ (and its subdomains')"));
        let prefixes = self.prefixes.iter().map(|prefix| format!("{prefix}*"));
        domains.chain(prefixes).chain(self.keys.iter().map(|key| (*key).to_owned())).collect::<Vec<_>>().join(", ")
    }
}

/// The rule of `template.labels`.
pub fn labels_rule() -> String {
    RESERVED_LABELS.rule()
}

pub fn labels_message() -> String {
    format!(
        "template.labels must not set the labels that make a pod a pool's, the activator's or the Job's own: {}",
        RESERVED_LABELS.described()
    )
}

/// The rule of `template.annotations`.
pub fn annotations_rule() -> String {
    RESERVED_ANNOTATIONS.rule()
}

pub fn annotations_message() -> String {
    format!(
        "template.annotations must not set teifleet's, the Job controller's or the pods' confinement annotations: {}",
        RESERVED_ANNOTATIONS.described()
    )
}

/// Whether a creator's pod label is one the operator leaves out (the CRD refuses it; a job made
/// before that rule keeps running without it).
pub fn reserved_label(key: &str) -> bool {
    RESERVED_LABELS.contains(key)
}

/// Whether a creator's pod annotation is one the operator leaves out.
pub fn reserved_annotation(key: &str) -> bool {
    RESERVED_ANNOTATIONS.contains(key)
}

/// `spec.image` only where the workers mount nothing of the namespace: a creator's image would
/// run with the claims, the S3 credentials and the API key mounted, reading every key and file of
/// them. Every store is a claim or a bucket with its credentials, so today this refuses every
/// image: the operator's `--job-image` runs the jobs. Written as the combination, so a store that
/// mounts nothing (a public bucket, a workload identity) would take an image again.
pub const IMAGE_RULE: &str = "!has(self.image) || (!has(self.apiKeySecret) \
    && !has(self.input.store.pvc) && !has(self.input.store.s3) \
    && !has(self.output.store.pvc) && !has(self.output.store.s3))";

pub const IMAGE_MESSAGE: &str = "image cannot be set on a job whose workers mount a claim or a Secret \
    (pvc, s3.credentialsSecret, apiKeySecret): an image of the job's own would read all of them; \
    leave it out to run the operator's worker image (its --job-image)";

/// What [`IMAGE_RULE`] says, for the operator: whether `spec` has its workers mount a claim or a
/// Secret of the namespace.
pub fn mounts_namespace_data(spec: &super::EmbeddingJobSpec) -> bool {
    let store = |store: &super::StoreSpec| store.pvc.is_some() || store.s3.is_some();
    spec.api_key_secret.is_some() || store(&spec.input.store) || store(&spec.output.store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_teifleet_key_and_each_selector_key_is_reserved_on_pods() {
        for key in [
            "teifleet.dev/pool",
            "teifleet.dev/job",
            "teifleet.dev/anything",
            "sub.teifleet.dev/x",
            "app.kubernetes.io/component",
            "app.kubernetes.io/part-of",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "batch.kubernetes.io/job-name",
            "batch.kubernetes.io/controller-uid",
            "job-name",
            "controller-uid",
        ] {
            assert!(reserved_label(key), "{key}");
        }
        for key in ["team", "app.kubernetes.io/version", "example.com/teifleet.dev", "notteifleet.dev/pool", "pool"] {
            assert!(!reserved_label(key), "{key}");
        }
    }

    #[test]
    fn confinement_and_teifleet_annotations_are_reserved() {
        for key in [
            "teifleet.dev/pool",
            "batch.kubernetes.io/job-completion-index",
            "container.apparmor.security.beta.kubernetes.io/worker",
            "seccomp.security.alpha.kubernetes.io/pod",
            "container.seccomp.security.alpha.kubernetes.io/worker",
        ] {
            assert!(reserved_annotation(key), "{key}");
        }
        for key in ["example.com/team", "prometheus.io/scrape", "kubectl.kubernetes.io/default-container"] {
            assert!(!reserved_annotation(key), "{key}");
        }
    }

    #[test]
    fn the_cel_rules_name_what_the_operator_strips() {
        assert_eq!(
            labels_rule(),
            "self.all(k, !(k.startsWith('teifleet.dev/') || k.contains('.teifleet.dev/') \
             || k.startsWith('batch.kubernetes.io/') || k in ['app.kubernetes.io/name', \
             'app.kubernetes.io/instance', 'app.kubernetes.io/component', 'app.kubernetes.io/part-of', \
             'app.kubernetes.io/managed-by', 'job-name', 'controller-uid']))"
        );
        assert!(annotations_rule().contains("k.startsWith('container.apparmor.security.beta.kubernetes.io/')"));
        assert!(!annotations_rule().contains(" in ["), "no whole keys");
        assert!(labels_message().contains("teifleet.dev/ (and its subdomains')"), "{}", labels_message());
        assert!(labels_message().contains("app.kubernetes.io/part-of"));
    }
}
