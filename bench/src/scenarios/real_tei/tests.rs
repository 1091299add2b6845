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
            learned: Default::default(),
        }),
        lanes_missing: None,
        bulk: Some(bulk_result(20.0, 21.0)),
        bulk_missing: None,
    }
}

/// A bulk call of 800 texts, every row full and every sampled row matching, in `seconds`.
fn call(seconds: f64) -> bulk::Call {
    bulk::Call {
        sent: 800,
        answered: 800,
        full: 800,
        sampled: 20,
        matched: 20,
        least_cosine: Some(0.999_999),
        seconds,
        outcome: "OK".into(),
    }
}

/// Row 7 with the unary reference at 40 and 44 texts/s (mean 42).
fn bulk_result(arrow_s: f64, stream_s: f64) -> RealBulk {
    RealBulk {
        texts: 800,
        callers: 64,
        balanced: vec![
            Run { elapsed_s: 20.0, ..run(800, 800, 40.0, 1600.0) },
            Run { elapsed_s: 18.2, ..run(800, 800, 44.0, 1500.0) },
        ],
        arrow: call(arrow_s),
        stream: call(stream_s),
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
fn row_7_judges_each_bulk_call_against_the_unary_mean_and_on_its_rows() {
    let targets = bulk_result(20.0, 21.0).targets(&Scenario::RealTei.label());
    // 800 rows in 20 s is 40 texts/s against the unary runs' mean of 42.
    let (v, m) = verdict(&targets, bulk::ARROW);
    assert!((m - 40.0 / 42.0).abs() < 1e-9 && v == Verdict::Pass, "{m}");
    let (v, m) = verdict(&targets, bulk::STREAM);
    assert!((m - 800.0 / 21.0 / 42.0).abs() < 1e-9 && v == Verdict::Pass, "{m}");
    assert_eq!(verdict(&targets, bulk::ARROW_ROWS), (Verdict::Pass, 0.0));
    assert_eq!(verdict(&targets, bulk::STREAM_ROWS), (Verdict::Pass, 0.0));

    // 800 rows in 25 s is 32 texts/s: 0.76× of 42.
    let mut slow = bulk_result(25.0, 21.0);
    slow.stream.full = 799;
    slow.stream.matched = 19;
    let targets = slow.targets(&Scenario::RealTei.label());
    let arrow = targets.iter().find(|t| t.name == bulk::ARROW).unwrap();
    assert_eq!(arrow.verdict, Verdict::Fail);
    assert!(arrow.note.contains("got 32.0 texts/s against 42.0"), "{}", arrow.note);
    // One row without a full vector and one sampled row that is not its text's: two wrong.
    let rows = targets.iter().find(|t| t.name == bulk::STREAM_ROWS).unwrap();
    assert_eq!((rows.verdict, rows.measured), (Verdict::Fail, Some(2.0)));
    assert!(rows.note.contains("799 with a 384-long vector; 19 of 20 sampled rows"), "{}", rows.note);
}

#[test]
fn row_7_skips_with_the_reason_when_it_could_not_run() {
    use crate::render::Render;
    let mut r = result();
    r.bulk = None;
    r.bulk_missing = Some("TEI direct refused the reference Embed of row 0".into());
    let targets = r.targets();
    for name in [bulk::ARROW, bulk::STREAM, bulk::ARROW_ROWS, bulk::STREAM_ROWS] {
        let t = targets.iter().find(|t| t.name == name).unwrap();
        assert_eq!(t.verdict, Verdict::Skip, "{name}");
        assert!(t.note.contains("reference Embed"), "{}", t.note);
    }
    assert!(r.body().contains("**7. Bulk at 384 dimensions.** Not measured: TEI direct refused"));
}

#[test]
fn a_bulk_answer_is_judged_on_its_length_and_against_tei_direct() {
    use crate::scenarios::bulk::Got;
    let unit = |i: usize| -> Vec<f32> { (0..bulk::DIMENSIONS).map(|d| if d == i { 1.0 } else { 0.0 }).collect() };
    // Rows 0..4; TEI direct's vectors of rows 0 and 3; row 2 short, rows 3 and 1 swapped.
    let got =
        Got { answers: vec![Some(unit(0)), Some(unit(3)), None, Some(unit(1))], seconds: 2.0, outcome: "OK".into() };
    let reference = vec![(0, unit(0).iter().map(|x| x * 2.0).collect()), (3, unit(3))];
    let call = bulk::judge(&got, 4, &reference);
    assert_eq!((call.sent, call.answered, call.full, call.sampled, call.matched), (4, 4, 3, 2, 1));
    assert_eq!(call.least_cosine, Some(0.0));
    assert_eq!(call.wrong(), 2);
    assert!((call.texts_per_s() - 1.5).abs() < 1e-9);
    // Answers beyond those sent are wrong too, and are not counted as full.
    let extra = Got { answers: vec![Some(unit(0)); 5], seconds: 1.0, outcome: "OK".into() };
    assert_eq!(bulk::judge(&extra, 4, &[]).wrong(), 1);
}

#[test]
fn sampled_rows_are_spread_over_the_call() {
    assert_eq!(bulk::sampled_rows(800, 20).len(), 20);
    assert_eq!(bulk::sampled_rows(800, 20).first(), Some(&0));
    assert_eq!(bulk::sampled_rows(800, 20).last(), Some(&799));
    assert_eq!(bulk::sampled_rows(5, 20), vec![0, 1, 2, 3, 4]);
    assert_eq!(bulk::sampled_rows(100, 1), vec![0]);
    assert!(bulk::sampled_rows(0, 20).is_empty());
    assert_eq!(bulk::cosine(&[1.0, 0.0], &[0.0, 0.0]), None);
    assert_eq!(bulk::cosine(&[1.0], &[1.0, 0.0]), None);
}

#[test]
fn row_7_shows_the_unary_runs_and_both_calls() {
    use crate::render::Render;
    let text = result().body();
    assert!(text.contains("**7. Bulk at 384 dimensions.**"), "{text}");
    assert!(
        text.contains("20000 rows, scenario 18's call, would take 476 s on this CPU TEI: 800 rows instead"),
        "{text}"
    );
    assert!(
        text.contains("| EmbedArrow, one call | 800 | 800 | 800 | 20 of 20 | 0.999999 | 20.0 | 40.0 | 0.952× | OK |"),
        "{text}"
    );
    assert!(text.contains("| unary, before | 800 | 800 | — | — | — | 20.0 | 40.0 | 0.952× | |"), "{text}");
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
