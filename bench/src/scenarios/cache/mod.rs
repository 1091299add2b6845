//! Scenario 22, cache (issue 46: the embedding cache): the multiplexer in `file` mode with a
//! pool's `cache:` block, in front of tei-sim at 384 dimensions, in four parts, each a ratio
//! measured side by side in the run:
//!
//! 1. **Zipf queries** (s = 1.1 over a million distinct texts of 20 to 60 words): the pool's
//!    capacity (closed loop through a multiplexer with the cache off), then open-loop unary
//!    `Embed`s at 2× that through a multiplexer with the cache on (cold at the start) in front of
//!    the same simulator: goodput ÷ capacity; the p99 of calls answered `x-teifleet-cache: hit`;
//!    every vector checked against the simulator's for its text (and that vector checked against
//!    direct calls to the simulator). The same schedule with the cache off and a phase of only
//!    the hottest texts are reported beside.
//! 2. **Re-index**: a corpus (200,000 rows; quick: 50,000) through EmbedArrow as the job worker
//!    sends it, then again with a tenth of the rows changed: the second pass's TEI work (the
//!    simulator's admitted inputs) ÷ the first's, and every row of both equal to a fresh
//!    embedding of its text.
//! 3. **Shared tier**: two replicas sharing one Redis: texts embedded through replica 1, then
//!    through replica 2: its hits ÷ the texts.
//! 4. **Redis killed under load**: one replica with a small local tier, open loop at half the
//!    capacity; Redis killed (SIGKILL) a third of the way and started again (empty, same port)
//!    at two thirds: failed calls, the p99 with the store down against up + the store timeout,
//!    and store hits after the restart.
//!
//! Parts 3 and 4 need Debian's `redis-server`; without it they are skipped with the reason.

pub mod drive;
pub mod hits;
pub mod procs;
pub mod reindex;
pub mod shared;
pub mod texts;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Context, Measurement, Scenario};
use crate::Result;
use crate::targets::{Target, ratio};

pub use hits::Hits;
pub use reindex::Reindex;
pub use shared::{Outage, SharedTier};

/// The simulators' vector length (`tei-sim --dimensions`).
pub const DIMENSIONS: usize = 384;
/// Every unary call's deadline.
pub const DEADLINE: Duration = Duration::from_secs(1);
/// Part 1's goodput with the cache on, at least this × capacity.
pub const GOODPUT_LIMIT: f64 = 1.8;
/// Part 1's hit p99, at most (ms).
pub const HIT_P99_LIMIT_MS: f64 = 1.0;
/// Part 1's hit p99 ÷ the memo floor's p99 in the same seconds, at most: what the cache adds to
/// an answer from memory, judged on any machine.
pub const HIT_FLOOR_LIMIT: f64 = 1.25;

/// The sum of `name` over the series with `labels` at a multiplexer's admin port (NaN when the
/// metrics cannot be read).
pub async fn metric(server: &procs::Server, name: &str, labels: &[(&str, &str)]) -> f64 {
    crate::admin::metric_sum_matching(server.admin_addr(), name, labels).await.unwrap_or(f64::NAN)
}

/// A part measured, or why not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part<T> {
    Measured(T),
    NotMeasured(String),
}

impl<T> Part<T> {
    pub fn of(result: Result<T>) -> Self {
        match result {
            Ok(value) => Self::Measured(value),
            Err(error) => Self::NotMeasured(error.to_string()),
        }
    }

    pub fn get(&self) -> Option<&T> {
        match self {
            Self::Measured(value) => Some(value),
            Self::NotMeasured(_) => None,
        }
    }

    pub fn why(&self) -> Option<&str> {
        match self {
            Self::Measured(_) => None,
            Self::NotMeasured(why) => Some(why),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cache {
    pub hits: Part<Hits>,
    pub reindex: Part<Reindex>,
    pub shared: Part<SharedTier>,
    pub outage: Part<Outage>,
}

pub const GOODPUT: &str = "Zipf 1.1 at 2× capacity: goodput with the cache on ÷ capacity";
pub const HIT_P99: &str = "Zipf at 2× capacity: p99 of calls answered from the cache";
pub const WRONG: &str = "vectors not equal to the simulator's (every answer of parts 1 and 2)";
pub const WORK: &str = "re-index with 10% of rows changed: TEI's inputs ÷ the first pass's";
pub const SHARED: &str = "two replicas, one Redis: replica 2's hits ÷ texts replica 1 embedded";
pub const FAILED: &str = "Redis killed under load: failed calls";
pub const DOWN_P99: &str = "Redis killed: p99 with the store down − (p99 up + store timeout)";
pub const RESUMED: &str = "Redis started again: store hits after the restart";
pub const WARM_P99: &str = "Zipf at 2× capacity, after the first 2 s: p99 of hits";
pub const HOT_P99: &str = "only the 100 hottest texts at capacity: p99";
pub const OFF: &str = "Zipf at 2× capacity, the cache off: goodput ÷ capacity";
pub const HIT_FLOOR: &str = "Zipf at 2× capacity: p99 of hits ÷ p99 of a bare tonic memo, calls interleaved";
pub const FLOOR_P99: &str = "Zipf at 2× capacity: p99 of a bare tonic memo's answers, interleaved";
pub const HOT_FLOOR_P99: &str = "only the hottest texts: p99 of the bare tonic memo, interleaved";

impl Measurement for Cache {
    const KEY: &'static str = "cache";
    const TITLE: &'static str =
        "Embedding cache: Zipf queries at twice capacity, a re-index, two replicas on one Redis, Redis killed";

    async fn run(ctx: &Context) -> Result<Self> {
        let hits = Part::of(hits::run(ctx).await);
        let reindex = Part::of(reindex::run(ctx).await);
        let (shared, outage) = match shared::start_redis(ctx).await {
            Err(error) => (Part::NotMeasured(error.to_string()), Part::NotMeasured(error.to_string())),
            Ok(redis) => {
                let peer_key = crate::procs::write_peer_key(&ctx.bins, "cache")?;
                let shared = Part::of(shared::shared(ctx, &redis, &peer_key).await);
                let outage = match hits.get() {
                    Some(h) => Part::of(shared::outage(ctx, redis, &peer_key, h.capacity_rps()).await),
                    None => Part::NotMeasured("part 1 measured no capacity".into()),
                };
                (shared, outage)
            }
        };
        Ok(Self { hits, reindex, shared, outage })
    }

    fn targets(&self) -> Vec<Target> {
        let scenario = Scenario::Cache.label();
        let s = scenario.as_str();
        let mut out = Vec::new();
        // A part that did not measure: its targets are unmeasured (SKIP), with the reason.
        let skip = |t: Target, why: Option<&str>| match why {
            Some(why) if !why.is_empty() => t.note_if_not_passed(format!("not measured: {why}")),
            _ => t,
        };
        match self.hits.get() {
            Some(h) => {
                out.push(Target::at_least(s, GOODPUT, h.goodput_ratio(), GOODPUT_LIMIT, "×").note_if_not_passed(
                    format!(
                        "offered {:.0}/s against a capacity of {:.0}/s: {} ({} hits, {} misses); the misses the \
                         cache leaves must fit the pool's capacity, and the hits must be served beside them",
                        h.offered_rps,
                        h.capacity_rps(),
                        h.on.codes(),
                        h.on.hits,
                        h.on.misses
                    ),
                ));
                out.push(hit_p99(s, h));
                if let Some(floor) = &h.floor_on {
                    let ratio = ratio(h.on.hit_p99_ms, floor.p99_ms);
                    out.push(Target::at_most(s, HIT_FLOOR, ratio, HIT_FLOOR_LIMIT, "×").note_if_not_passed(format!(
                        "hits p99 {:.3} ms, the memo's {:.3} ms over {} of its calls ({})",
                        h.on.hit_p99_ms,
                        floor.p99_ms,
                        floor.sent,
                        floor.codes()
                    )));
                    out.push(Target::info(s, FLOOR_P99, Some(floor.p99_ms), "ms"));
                }
                out.push(Target::info(s, WARM_P99, Some(h.warm.hit_p99_ms), "ms"));
                out.push(Target::info(s, HOT_P99, Some(h.hot.p99_ms), "ms"));
                if let Some(floor) = &h.floor_hot {
                    out.push(Target::info(s, HOT_FLOOR_P99, Some(floor.p99_ms), "ms"));
                }
                out.push(Target::info(s, OFF, Some(h.off_ratio()), "×"));
            }
            None => {
                let why = self.hits.why();
                out.push(skip(Target::new(s, GOODPUT, None, crate::targets::Rule::AtLeast, GOODPUT_LIMIT, "×"), why));
                out.push(skip(
                    Target::new(s, HIT_P99, None, crate::targets::Rule::AtMost, HIT_P99_LIMIT_MS, "ms"),
                    why,
                ));
                out.push(skip(
                    Target::new(s, HIT_FLOOR, None, crate::targets::Rule::AtMost, HIT_FLOOR_LIMIT, "×"),
                    why,
                ));
            }
        }
        let wrong = [
            self.hits.get().map(|h| h.on.wrong + h.hot.wrong + h.direct_wrong),
            self.reindex.get().map(|r| r.first.wrong + r.second.wrong + r.first.failed_rows + r.second.failed_rows),
        ];
        let measured: Vec<u64> = wrong.iter().flatten().copied().collect();
        let wrong_target = match measured.is_empty() {
            true => skip(Target::new(s, WRONG, None, crate::targets::Rule::AtMost, 0.0, "vectors"), self.hits.why()),
            false => Target::at_most(s, WRONG, measured.iter().sum::<u64>() as f64, 0.0, "vectors"),
        };
        out.push(wrong_target.note_if_not_passed(self.wrong_note()));
        out.push(match self.reindex.get() {
            Some(r) => Target::at_most(s, WORK, r.work_ratio(), reindex::WORK_LIMIT, "×").note_if_not_passed(format!(
                "TEI embedded {} inputs in the first pass and {} in the second ({} of {} rows changed; calls' \
                 headers {:?}); {}; after the first pass the local tier held {:.0} entries, {:.0} MB, {:.0} \
                 evicted, {:.0} answers not kept",
                r.first.tei_inputs,
                r.second.tei_inputs,
                r.changed,
                r.rows,
                r.second.headers,
                r.tier,
                r.first.local[0],
                r.first.local[1] / 1e6,
                r.first.local[2],
                r.first.local[3]
            )),
            None => skip(
                Target::new(s, WORK, None, crate::targets::Rule::AtMost, reindex::WORK_LIMIT, "×"),
                self.reindex.why(),
            ),
        });
        out.push(match self.shared.get() {
            Some(t) => {
                Target::at_least(s, SHARED, t.hit_ratio(), shared::SHARED_LIMIT, "×").note_if_not_passed(format!(
                    "replica 2: {} ({} hits, {} from the store by its metrics); a write to the store that took \
                     longer than its {} ms timeout is not there for replica 2",
                    t.second.codes(),
                    t.second.hits,
                    t.second_store_hits,
                    shared::STORE_TIMEOUT_MS
                ))
            }
            None => skip(
                Target::new(s, SHARED, None, crate::targets::Rule::AtLeast, shared::SHARED_LIMIT, "×"),
                self.shared.why(),
            ),
        });
        match self.outage.get() {
            Some(o) => {
                out.push(Target::at_most(s, FAILED, o.failed() as f64, 0.0, "calls").note_if_not_passed(format!(
                    "up: {}; down: {}; after: {}",
                    o.up.codes(),
                    o.down.codes(),
                    o.after.codes()
                )));
                out.push(
                    Target::at_most(s, DOWN_P99, o.down.p99_ms - o.p99_allowed_ms(), 0.0, "ms").note_if_not_passed(
                        format!(
                            "p99 {:.1} ms with the store down, {:.1} ms with it up, the store timeout {} ms",
                            o.down.p99_ms, o.up.p99_ms, o.store_timeout_ms
                        ),
                    ),
                );
                out.push(Target::at_least(s, RESUMED, o.store_hits[2], 1.0, "hits").note_if_not_passed(format!(
                    "store hits {:?} (up, down, after); teifleet_cache_store_up at the end {}; store errors {}",
                    o.store_hits, o.store_up_at_end, o.store_errors
                )));
            }
            None => {
                let why = self.outage.why();
                out.push(skip(Target::new(s, FAILED, None, crate::targets::Rule::AtMost, 0.0, "calls"), why));
                out.push(skip(Target::new(s, DOWN_P99, None, crate::targets::Rule::AtMost, 0.0, "ms"), why));
                out.push(skip(Target::new(s, RESUMED, None, crate::targets::Rule::AtLeast, 1.0, "hits"), why));
            }
        }
        out
    }

    fn planned_targets() -> Vec<Target> {
        Self {
            hits: Part::NotMeasured(String::new()),
            reindex: Part::NotMeasured(String::new()),
            shared: Part::NotMeasured(String::new()),
            outage: Part::NotMeasured(String::new()),
        }
        .targets()
    }
}

/// The hit p99 against the absolute limit. Where a bare tonic server answering the same kind of
/// calls from memory, in the same seconds, is itself over the limit, no server meets it on this
/// machine: the row is SKIP with both figures, and [`HIT_FLOOR`] judges what the cache adds.
fn hit_p99(s: &str, h: &Hits) -> Target {
    let target = Target::at_most(s, HIT_P99, h.on.hit_p99_ms, HIT_P99_LIMIT_MS, "ms");
    match &h.floor_on {
        Some(floor) if target.verdict == crate::targets::Verdict::Fail && floor.p99_ms > HIT_P99_LIMIT_MS => target
            .skip_because(format!(
                "this machine's floor is over the limit: a bare tonic server answering from memory, its calls \
                 interleaved with these, had p99 {:.3} ms (the hits {:.3} ms, p50 {:.3} ms); see the row \
                 \"{HIT_FLOOR}\"",
                floor.p99_ms, h.on.hit_p99_ms, h.on.hit_p50_ms
            )),
        _ => target.note_if_not_passed(format!(
            "{} hits, p50 {:.3} ms; the hot phase's p99 {:.3} ms; no memo floor was measured beside them",
            h.on.hits, h.on.hit_p50_ms, h.hot.p99_ms
        )),
    }
}

impl Cache {
    fn wrong_note(&self) -> String {
        let mut parts = Vec::new();
        if let Some(h) = self.hits.get() {
            parts.push(format!(
                "part 1: {} of {} answers differ, {} of {} direct calls to the simulator differ from the vector \
                 checked against",
                h.on.wrong + h.hot.wrong,
                h.on.checked + h.hot.checked,
                h.direct_wrong,
                h.direct_checked
            ));
        }
        if let Some(r) = self.reindex.get() {
            parts.push(format!(
                "part 2: first pass {} wrong and {} failed rows, second pass {} wrong and {} failed rows (calls \
                 failed: {:?} / {:?})",
                r.first.wrong,
                r.first.failed_rows,
                r.second.wrong,
                r.second.failed_rows,
                r.first.failed_calls,
                r.second.failed_calls
            ));
        }
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::drive::Phase;
    use super::*;
    use crate::targets::Verdict;

    fn hits(hit_p99_ms: f64, floor_p99_ms: Option<f64>) -> Hits {
        let phase = |p99_ms, hit_p99_ms| Phase { p99_ms, hit_p99_ms, seconds: 1.0, ..Phase::default() };
        Hits {
            backend: hits::backend(),
            limits: hits::limits(),
            local_size: hits::LOCAL_SIZE.into(),
            capacity: Phase { ok: 100, ..phase(1.0, f64::NAN) },
            capacity_callers: 64,
            offered_rps: 200.0,
            on: Phase { ok: 200, ..phase(hit_p99_ms, hit_p99_ms) },
            off: Phase::default(),
            warm: Phase::default(),
            hot: Phase::default(),
            floor_on: floor_p99_ms.map(|p99| phase(p99, f64::NAN)),
            floor_hot: None,
            direct_checked: 0,
            direct_wrong: 0,
            inputs: vec![],
        }
    }

    fn verdicts(h: Hits) -> Vec<(String, Verdict)> {
        let cache = Cache {
            hits: Part::Measured(h),
            reindex: Part::NotMeasured("-".into()),
            shared: Part::NotMeasured("-".into()),
            outage: Part::NotMeasured("-".into()),
        };
        cache.targets().into_iter().map(|t| (t.name, t.verdict)).collect()
    }

    fn verdict_of(all: &[(String, Verdict)], name: &str) -> Option<Verdict> {
        all.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    #[test]
    fn a_slow_hit_is_skipped_only_where_the_floor_itself_is_over_the_limit() {
        // The floor over 1 ms: the absolute row cannot be met here; the ratio judges.
        let all = verdicts(hits(3.0, Some(2.8)));
        assert_eq!(verdict_of(&all, HIT_P99), Some(Verdict::Skip));
        assert_eq!(verdict_of(&all, HIT_FLOOR), Some(Verdict::Pass));
        // The floor within 1 ms: a slow hit fails both.
        let all = verdicts(hits(3.0, Some(0.6)));
        assert_eq!(verdict_of(&all, HIT_P99), Some(Verdict::Fail));
        assert_eq!(verdict_of(&all, HIT_FLOOR), Some(Verdict::Fail));
        // No floor measured: the absolute row alone, failing.
        let all = verdicts(hits(3.0, None));
        assert_eq!(verdict_of(&all, HIT_P99), Some(Verdict::Fail));
        assert_eq!(verdict_of(&all, HIT_FLOOR), None);
        // A fast hit passes whatever the floor.
        let all = verdicts(hits(0.8, Some(2.0)));
        assert_eq!(verdict_of(&all, HIT_P99), Some(Verdict::Pass));
    }
}
