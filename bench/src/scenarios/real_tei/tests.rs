use super::*;
use crate::scenarios::Sample;
use crate::targets::Verdict;

fn run(sent: u64, ok_in_time: u64, ok_per_s: f64, p99_ms: f64) -> Run {
    Run {
        sent,
        ok: ok_in_time,
        ok_in_time,
        ok_per_s,
        goodput_per_s: ok_per_s,
        p99_ms,
        p99_all_ms: p99_ms,
        ..Run::default()
    }
}

fn side(p50s: &[f64]) -> Vec<Sample> {
    p50s.iter().map(|p| Sample { p50_ms: *p, ..Sample::default() }).collect()
}

fn result() -> RealTei {
    RealTei {
        cache: "/cache/real-tei".into(),
        model: procs::REAL_TEI_MODEL.into(),
        limits: static_limits(),
        throughput: Throughput {
            callers: 64,
            seconds_per_run: 4.0,
            direct: vec![run(1000, 1000, 400.0, 200.0), run(1000, 1000, 380.0, 200.0)],
            through: vec![run(1000, 1000, 392.0, 200.0), run(1000, 1000, 342.0, 200.0)],
        },
        patient: Patient {
            callers: 64,
            calls: 600,
            deadline_s: 30.0,
            direct: vec![run(600, 600, 400.0, 200.0)],
            through: vec![run(600, 599, 390.0, 200.0)],
        },
        storm: Storm {
            limits: storm::adaptive_limits(),
            seconds: 8.0,
            sweep_seconds: 2.0,
            sweep: vec![
                storm::SweepPoint { concurrency: 4, run: run(800, 800, 380.0, 20.0) },
                storm::SweepPoint { concurrency: 16, run: run(800, 800, 400.0, 60.0) },
            ],
            direct: run(3000, 3000, 395.0, 700.0),
            through: run(3000, 3000, 372.0, 700.0),
            limit_after: Some(8.0),
        },
        hop: Hop {
            rounds: 2,
            cases: vec![
                HopCase {
                    name: "Info".into(),
                    calls_per_round: 10,
                    direct: side(&[0.100, 0.100]),
                    sidecar: side(&[0.140, 0.140]),
                    haproxy_h2: side(&[0.160, 0.160]),
                    floor_h2: side(&[0.130, 0.130]),
                },
                HopCase {
                    name: "Embed 20 tokens".into(),
                    calls_per_round: 10,
                    direct: side(&[3.0, 3.0]),
                    sidecar: side(&[3.1, 3.1]),
                    haproxy_h2: vec![],
                    floor_h2: vec![],
                },
            ],
            haproxy_missing: None,
        },
        http: Some(HttpStorm {
            limits: http::limits(),
            callers: 2048,
            calls_per_run: 4096,
            direct: vec![run(4096, 4096, 400.0, 6000.0)],
            through: vec![run(4096, 4096, 410.0, 600.0)],
        }),
        http_missing: None,
        lanes: Some(Lanes {
            limits: static_limits(),
            ingest_share_percent: 10,
            rate: 240.0,
            seconds: 5.0,
            alone: run(1200, 1200, 240.0, 40.0),
            beside: run(1200, 1200, 240.0, 60.0),
            ingest: run(800, 800, 150.0, 500.0),
        }),
        lanes_missing: None,
    }
}

fn verdict(targets: &[Target], name: &str) -> (Verdict, f64) {
    let t = targets.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name}: {targets:?}"));
    (t.verdict, t.measured.unwrap_or(f64::NAN))
}

#[test]
fn each_row_is_judged_on_a_ratio_of_the_same_run() {
    let targets = result().targets();
    // Rounds of 0.98 and 0.9: the median of the two.
    let (v, m) = verdict(&targets, throughput::THROUGHPUT);
    assert!((m - 0.94).abs() < 1e-9 && v == Verdict::Fail, "{m}");
    let (v, m) = verdict(&targets, throughput::SERVED);
    assert!((m - 599.0 / 600.0).abs() < 1e-9 && v == Verdict::Fail, "one call of 600 not served fails it");
    // 372 of the best 400.
    let (v, m) = verdict(&targets, storm::GOODPUT);
    assert!((m - 0.93).abs() < 1e-9 && v == Verdict::Pass, "{m}");
    // +40 µs over HAProxy's +60 µs.
    let (v, m) = verdict(&targets, hop::INFO_VS_HAPROXY);
    assert!((m - 40.0 / 60.0).abs() < 1e-6 && v == Verdict::Pass, "{m}");
    let (v, m) = verdict(&targets, "HTTP p99 through ÷ direct, 2,048 callers");
    assert!((m - 0.1).abs() < 1e-9 && v == Verdict::Pass, "{m}");
    let (v, _) = verdict(&targets, "HTTP texts/s through ÷ direct, 2,048 callers");
    assert_eq!(v, Verdict::Pass);
    // 60 ms beside ingest over 40 ms alone.
    let (v, m) = verdict(&targets, lanes::P99);
    assert!((m - 1.5).abs() < 1e-9 && v == Verdict::Fail, "{m}");
}

#[test]
fn planned_targets_are_the_judged_ones() {
    let judged: Vec<String> =
        result().targets().into_iter().filter(|t| t.rule != Rule::Report).map(|t| t.name).collect();
    let planned: Vec<String> = RealTei::planned_targets().into_iter().map(|t| t.name).collect();
    assert_eq!(judged, planned);
}

#[test]
fn rows_5_and_6_skip_with_the_reason_when_they_could_not_run() {
    use crate::render::Render;
    let mut r = result();
    r.http = None;
    r.http_missing = Some("TEI's HTTP router is not built".into());
    let targets = r.targets();
    let p99 = targets.iter().find(|t| t.name.starts_with("HTTP p99")).unwrap();
    assert_eq!(p99.verdict, Verdict::Skip);
    assert!(p99.note.contains("not built"), "{}", p99.note);
    r.lanes = None;
    r.lanes_missing = Some("the multiplexer has no --ingest-share flag".into());
    let (v, _) = verdict(&r.targets(), lanes::P99);
    assert_eq!(v, Verdict::Skip);
    assert!(r.body().contains("**6. Lanes.** Not measured: the multiplexer has no --ingest-share flag."));
}

#[test]
fn without_haproxy_the_hop_target_skips() {
    let mut r = result();
    r.hop.cases.iter_mut().for_each(|c| c.haproxy_h2.clear());
    r.hop.haproxy_missing = Some("haproxy is not installed".into());
    let (v, _) = verdict(&r.targets(), hop::INFO_VS_HAPROXY);
    assert_eq!(v, Verdict::Skip);
}

#[test]
fn row_5_is_sized_in_whole_waves_of_callers() {
    assert_eq!(http::calls_per_run(true, 400.0), 2048);
    // 12,000 calls are 5.9 waves.
    assert_eq!(http::calls_per_run(false, 400.0), 12_288);
    assert_eq!(http::calls_per_run(false, 5000.0), 20_000);
    assert_eq!(http::calls_per_run(false, 10.0), 2048);
    assert_eq!(http::calls_per_run(false, f64::NAN), 2048);
}

#[test]
fn a_missing_cache_says_how_to_build_it() {
    let cache = RealTeiCache { root: "/nonexistent/real-tei".into() };
    let why = cache.missing().unwrap();
    assert!(
        why.contains("real-tei.sh") && why.contains("/nonexistent/real-tei/bin/text-embeddings-router-grpc"),
        "{why}"
    );
}

#[test]
fn the_section_shows_every_row() {
    use crate::render::Render;
    let text = result().body();
    for needle in [
        "**1. Throughput",
        "**2. Patient",
        "**3. A storm",
        "**4. The hop",
        "**5. The auto-batching",
        "4096 calls per run",
        "**6. Lanes",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    assert!(text.contains("| Info | 10 | 0.100 ms | 0.140 ms | 0.160 ms | +40 µs | +60 µs | 0.667× |"), "{text}");
}

#[test]
fn the_floor_splits_the_sidecars_hop_into_stack_and_checks() {
    let targets = result().targets();
    // Direct 100 µs, floor 130, sidecar 140, HAProxy 160: the stack adds 30, the checks 10.
    let (v, m) = verdict(&targets, "floor (bare h2 proxy) added p50, Info");
    assert!((m - 30.0).abs() < 1e-6 && v == Verdict::Info, "{m}");
    let (_, m) = verdict(&targets, "sidecar − floor (bare h2 proxy) added p50, Info");
    assert!((m - 10.0).abs() < 1e-6, "{m}");
    let (_, m) = verdict(&targets, "floor (bare h2 proxy) ÷ HAProxy h2 added p50, Info");
    assert!((m - 0.5).abs() < 1e-6, "{m}");
    // Without the floor the row has none of its figures, and the judged target stands.
    let mut r = result();
    r.hop.cases.iter_mut().for_each(|c| c.floor_h2.clear());
    let targets = r.targets();
    assert!(!targets.iter().any(|t| t.name.contains("floor")), "{targets:?}");
    let (v, _) = verdict(&targets, hop::INFO_VS_HAPROXY);
    assert_eq!(v, Verdict::Pass);
}
