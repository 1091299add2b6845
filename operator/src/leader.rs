//! Leader election on a `coordination.k8s.io` Lease, so two operator replicas never both act.
//!
//! The holder renews the lease every third of its duration. A candidate takes the lease over only
//! once it has gone unrenewed for a full duration. Every write carries the resourceVersion it
//! read, so two candidates racing for an expired lease cannot both win: one gets a conflict.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::{Error, Result};

#[derive(Clone)]
pub struct LeaseElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseElector {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self { api: Api::namespaced(client, namespace), name: name.into(), identity: identity.into(), duration }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn renew_interval(&self) -> Duration {
        self.duration / 3
    }

    /// Takes or renews the lease. `Ok(false)` means someone else holds it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let duration_seconds = i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return ignore_conflict(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.get_or_insert_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let held_by_me = holder == self.identity;
        if !held_by_me && !holder.is_empty() && !expired(spec, now) {
            return Ok(false);
        }
        if !held_by_me {
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(duration_seconds);
        // `lease` still carries the resourceVersion we read: a concurrent writer makes this fail.
        ignore_conflict(self.api.replace(&self.name, &PostParams::default(), &lease).await)
    }

    /// Waits until this replica holds the lease, or `shutdown` fires (then `Ok(false)`).
    pub async fn acquire(&self, shutdown: &CancellationToken) -> Result<bool> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return Ok(true),
                Ok(false) => tracing::debug!(lease = %self.name, "another replica leads; standing by"),
                Err(error) => tracing::warn!(%error, "leader election attempt failed"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(false),
                () = tokio::time::sleep(self.renew_interval()) => {}
            }
        }
    }

    /// Renews until `shutdown` fires. Returns an error once the lease could not be renewed for a
    /// whole lease duration, when another replica may already have taken over.
    pub async fn keep_renewing(&self, shutdown: &CancellationToken) -> Result<()> {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.renew_interval()) => {}
            }
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return Err(Error::LostLease(format!("{} is now held by another replica", self.name))),
                Err(error) => tracing::warn!(%error, "renewing the leader lease failed"),
            }
            if last_renewal.elapsed() >= self.duration {
                return Err(Error::LostLease(format!("{} not renewed for {:?}", self.name, self.duration)));
            }
        }
    }

    /// Gives the lease up so a successor need not wait for it to expire.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else { return Ok(()) };
        let spec = lease.spec.get_or_insert_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        ignore_conflict(self.api.replace(&self.name, &PostParams::default(), &lease).await).map(|_| ())
    }
}

fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(MicroTime(renewed)) = spec.renew_time else { return true };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    renewed.as_second().saturating_add(duration) < now.as_second()
}

/// A 409 is a lost race, not an error: someone else wrote the lease first.
fn ignore_conflict(result: kube::Result<Lease>) -> Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error.into()),
    }
}
