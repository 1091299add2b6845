//! When the tenant crowding the queue may take room while other tenants come: in the last part of
//! TEI's running batch, as ingest does beside queries (see `ingest_gate`).
//!
//! The fair queue puts a light tenant's call ahead of a flood's, but only among waiters: room
//! frees when one of TEI's batches ends, and a flood waiting in the queue takes all of it at once.
//! Its calls then fill TEI's next batch while the light tenant's next call, arriving a moment
//! later, finds every permit held: it waits for the running batch, then for the batch the flood
//! filled, then for its own, about three batch times against one alone (issue 45: a tenant at
//! 0.2× capacity beside one at 5×, p99 3.1–3.5× alone at four in flight).
//!
//! So while another tenant comes (called within the last [`OTHERS_COME_WITHIN`]), the tenant that
//! holds more than half of the queue's inputs at the head's priority leaves the room that frees
//! until the last part of TEI's running batch, and then takes all of it: a call of another tenant
//! arriving before that takes a permit at once and rides TEI's next batch, as it would alone but
//! for the running batch's rest, and the next batch still starts full. Other tenants' waiters may
//! take the room meanwhile (in the same priority; lower ones still never pass). The gate needs
//! what the ingest gate reads from TEI (its running batch's start and its batch time); without it,
//! or with nothing in flight, or no other tenant, the crowd goes at once.
//!
//! That alone leaves the light tenant only the places the running batch's end freed: at four in
//! flight (TEI batching 8) its calls still met a next batch the flood had filled (p99 1.53× alone,
//! issue 45's weighted row). A tenant configured to weigh more than the crowd is the user saying it
//! deserves more of the pool than the crowd, so while it comes (the same second) the crowd, in the
//! batch's last part too, fills TEI's next batch only up to its own weighted share
//! (`w_crowd ÷ (w_crowd + w_quiet)`), as ingest leaves a pool's `queryReserve` to queries
//! (`ingest_gate::reserved_places`): the quiet tenant's calls find a place in the next batch. Equal
//! weights (nothing configured, or configured alike) keep no share: the fair queue's order is all
//! they asked for.
//!
//! A place kept for a tenant that does not come would run empty: TEI's next batch starts short and
//! the pool idles part of the GPU for nobody (scenario 11's weighted row: total goodput 0.257×
//! capacity against 0.54× without weights). So the share is work-conserving: the places kept stay
//! the quiet tenant's until near the running batch's end ([`KEPT_UNTIL`] of its time: the rest is
//! the margin for the crowd's calls to reach TEI before its next batch starts), and from then
//! until the batch's expected end, unless another tenant's call waits, the crowd takes them and
//! TEI's next batch starts full. A quiet call arriving after that rides the batch after, no longer
//! than it waits alone at worst (the rest of a running batch and its own). Past the batch's
//! expected end without a call back marking the next batch's start (a start the permits did not
//! show, or a slow batch), the gate cannot say where TEI's batches are, and the crowd keeps to its
//! share until a batch ends: filling the next batch then would fill it at the start of a batch,
//! as the share exists to prevent. The crowd never takes more than its share while another tenant
//! waits.

use std::ops::Range;
use std::time::Duration;

use tokio::time::Instant;

use super::tenants::TenantId;

/// How recent another tenant's call must be for the crowd to wait for the batch's last part: long
/// enough to span the gaps of a light tenant (0.2× capacity is tens of calls a second).
pub(super) const OTHERS_COME_WITHIN: Duration = Duration::from_secs(1);
/// The share of TEI's batch time after its start until which the places kept for a quiet tenant
/// stay its own: the rest is the margin for the crowd's calls to reach TEI before its next batch
/// starts (scenario 11 measured a call sent at the last part reaching TEI 3 ms before the batch
/// start, of a 5.8 ms margin), and the window in which a quiet call arriving rides one batch
/// later.
pub(super) const KEPT_UNTIL: f64 = 0.8;
#[derive(Debug, Default)]
pub(super) struct TenantGate {
    /// The last call of the two tenants that called last, latest first: enough to say whether a
    /// tenant other than any one tenant came lately.
    latest: [Option<(TenantId, Instant)>; 2],
}

/// When the places of TEI's next batch kept for a quiet tenant go to the crowd: from
/// [`KEPT_UNTIL`] of the running batch's time after its start until its expected end, `at` giving
/// the moment a share of that time after the start (`IngestGate::running_batch_at`); `None`
/// before a batch was seen.
pub(super) fn handover(at: impl Fn(f64) -> Option<Instant>) -> Option<Range<Instant>> {
    Some(at(KEPT_UNTIL)?..at(1.0)?)
}

impl TenantGate {
    /// A call of `tenant` came at `now`.
    pub fn arrived(&mut self, tenant: TenantId, now: Instant) {
        if !matches!(self.latest[0], Some((last, _)) if last == tenant) {
            self.latest[1] = self.latest[0];
        }
        self.latest[0] = Some((tenant, now));
    }

    /// Whether a tenant other than `tenant` came within [`OTHERS_COME_WITHIN`] of `now`.
    pub fn others_come(&self, tenant: TenantId, now: Instant) -> bool {
        self.other_coming(tenant, now).is_some()
    }

    /// The tenant other than `tenant` that called last, if within [`OTHERS_COME_WITHIN`] of `now`.
    pub fn other_coming(&self, tenant: TenantId, now: Instant) -> Option<TenantId> {
        self.latest
            .iter()
            .flatten()
            .find(|(other, _)| *other != tenant)
            .filter(|(_, at)| now.saturating_duration_since(*at) < OTHERS_COME_WITHIN)
            .map(|(other, _)| *other)
    }

    /// When `crowd` (the tenant holding most of the queue) may take room, if not at `now`: from
    /// `last_part` on (see `IngestGate::last_part_from`), with `in_flight` inputs in flight.
    pub fn closed_until(
        &self,
        crowd: TenantId,
        last_part: Option<Instant>,
        in_flight: usize,
        now: Instant,
    ) -> Option<Instant> {
        if in_flight == 0 || !self.others_come(crowd, now) {
            return None;
        }
        let opens = last_part?;
        (now < opens).then_some(opens)
    }
}

/// The percent of TEI's next batch the crowd leaves to a quiet tenant that weighs `quiet` beside
/// the crowd's `crowd` (rounded down, so the crowd keeps at least its share): the quiet tenant's
/// weighted share when it outweighs the crowd, none otherwise.
pub(super) fn quiet_reserve(quiet: u32, crowd: u32) -> u8 {
    if quiet <= crowd {
        return 0;
    }
    let percent = u64::from(quiet) * 100 / (u64::from(quiet) + u64::from(crowd));
    u8::try_from(percent).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: TenantId = TenantId(2);
    const B: TenantId = TenantId(3);

    #[test]
    fn open_without_another_tenant() {
        let now = Instant::now();
        let mut gate = TenantGate::default();
        let opens = Some(now + Duration::from_millis(15));
        assert_eq!(gate.closed_until(A, opens, 8, now), None, "nobody called");
        gate.arrived(A, now);
        assert_eq!(gate.closed_until(A, opens, 8, now), None, "only the crowd itself");
        gate.arrived(B, now);
        assert_eq!(gate.closed_until(A, opens, 8, now), opens, "B came");
        assert_eq!(gate.closed_until(B, opens, 8, now), opens, "and A for B");
    }

    #[test]
    fn the_other_tenant_is_remembered_while_the_crowd_keeps_calling() {
        let start = Instant::now();
        let mut gate = TenantGate::default();
        gate.arrived(B, start);
        for ms in 1..100 {
            gate.arrived(A, start + Duration::from_millis(ms));
        }
        let now = start + Duration::from_millis(100);
        assert!(gate.others_come(A, now));
        assert!(!gate.others_come(A, start + OTHERS_COME_WITHIN), "a second later B is gone");
    }

    #[test]
    fn the_other_tenant_is_named_while_it_comes() {
        let now = Instant::now();
        let mut gate = TenantGate::default();
        gate.arrived(B, now);
        gate.arrived(A, now);
        assert_eq!(gate.other_coming(A, now), Some(B));
        assert_eq!(gate.other_coming(B, now), Some(A));
        assert_eq!(gate.other_coming(A, now + OTHERS_COME_WITHIN), None);
    }

    #[test]
    fn only_a_tenant_outweighing_the_crowd_keeps_a_share_of_the_next_batch() {
        assert_eq!(quiet_reserve(1, 1), 0, "nothing configured: the fair queue's order only");
        assert_eq!(quiet_reserve(3, 3), 0, "configured alike");
        assert_eq!(quiet_reserve(1, 3), 0, "the crowd weighs more");
        assert_eq!(quiet_reserve(3, 1), 75);
        assert_eq!(quiet_reserve(2, 1), 66, "rounded down: the crowd keeps its third");
        assert_eq!(quiet_reserve(u32::MAX, 1), 99);
        assert_eq!(
            super::super::ingest_gate::reserved_places(8, quiet_reserve(3, 1)),
            1,
            "four in flight, TEI's batch of 8"
        );
    }

    #[test]
    fn the_places_kept_go_to_the_crowd_near_the_running_batchs_end() {
        let start = Instant::now();
        let ms = |ms: u64| start + Duration::from_millis(ms);
        let batch_of_20_ms = |share: f64| Some(start + Duration::from_millis(20).mul_f64(share));
        assert_eq!(handover(batch_of_20_ms), Some(ms(16)..ms(20)), "from 80% of 20 ms to its end");
        assert_eq!(handover(|_| None), None, "no batch seen yet");
    }

    #[test]
    fn open_in_the_last_part_of_the_batch_or_with_tei_idle() {
        let now = Instant::now();
        let mut gate = TenantGate::default();
        gate.arrived(B, now);
        let opens = now + Duration::from_millis(15);
        assert_eq!(gate.closed_until(A, Some(opens), 8, opens), None, "the last part");
        assert_eq!(gate.closed_until(A, Some(opens), 0, now), None, "nothing in flight: TEI idles");
        assert_eq!(gate.closed_until(A, None, 8, now), None, "no batch seen yet");
    }
}
