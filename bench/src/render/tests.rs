use teifleet_load::Report;

use super::*;
use crate::procs::Device;
use crate::results::{Outcome, Section};
use crate::scenarios::Sample;
use crate::scenarios::Scenario;
use crate::scenarios::overhead::{Case, CaseResult, Overhead};
use crate::scenarios::shed_storm::{self, Run, RunCpu, ShedStorm};
use crate::scenarios::{fast_model, unhurried_limits};
use crate::targets::Target;

fn side(p50s: &[f64]) -> Vec<Sample> {
    p50s.iter().map(|p| Sample { p50_ms: *p, p99_ms: p * 2.0, ..Sample::default() }).collect()
}

fn overhead() -> Section {
    let backend = crate::procs::SimModel { device: Device::Spin, ..fast_model() };
    let case = |case, direct: &[f64], mux: &[f64], floor: &[f64]| CaseResult {
        case,
        calls_per_round: 100,
        direct: side(direct),
        mux: side(mux),
        floor: side(floor),
        floors: crate::scenarios::FloorSides {
            floor_h2: side(&direct.iter().map(|d| d + 0.015).collect::<Vec<_>>()),
            haproxy_tcp: side(&direct.iter().map(|d| d + 0.010).collect::<Vec<_>>()),
            haproxy_h2: side(&direct.iter().map(|d| d + 0.020).collect::<Vec<_>>()),
        },
    };
    Section::measured(
        Scenario::Overhead,
        Outcome::Overhead(Box::new(Overhead {
            backend,
            limits: unhurried_limits(),
            rounds: 2,
            cases: vec![
                case(Case::Info, &[0.100, 0.100], &[0.150, 0.150], &[0.125, 0.125]),
                case(Case::Single { tokens: 20 }, &[1.0, 1.0], &[1.25, 1.25], &[1.05, 1.05]),
                case(Case::Single { tokens: 500 }, &[1.5, 1.5], &[1.6, 1.6], &[1.52, 1.52]),
            ],
            haproxy_missing: None,
        })),
    )
}

fn storm() -> Section {
    let run = |ok, answered, goodput_rps, mux_s| Run {
        report: Report { ok, answered, sent: answered, goodput_rps, ..Report::default() },
        cpu: RunCpu { mux_s, sim_s: 5.0, client_s: 2.0 },
    };
    Section::measured(
        Scenario::ShedStorm,
        Outcome::ShedStorm(Box::new(ShedStorm {
            backend: crate::scenarios::gpu_model(512, Device::Spin),
            limits: shed_storm::limits(),
            seconds: 10.0,
            capacity: run(3000, 3000, 300.0, 0.0),
            capacity_after: None,
            served: run(3000, 3000, 300.0, 0.6),
            storm: run(2000, 102_000, 200.0, 5.4),
            storm_fewer_connections: None,
            deadline_storms: vec![shed_storm::DeadlineStorm { connections: 1, run: run(2900, 2900, 290.0, 0.6) }],
            short_deadline_storm: None,
            http_storm: Some(run(2850, 2850, 285.0, 0.7)),
        })),
    )
}

fn results(sections: Vec<Section>) -> Results {
    Results {
        date: "2026-01-02".into(),
        mode: "quick".into(),
        commit: "abc1234".into(),
        sections,
        ..Results::default()
    }
}

#[test]
fn summary_has_every_target_with_info_rows_unbolded() {
    let targets = vec![
        Target::at_most("1 overhead", "added p50, Info", 50.0, 60.0, "µs"),
        Target::info("5 cost", "instructions per call (callgrind)", Some(123_456.0), ""),
    ];
    let table = summary_table(&targets);
    assert!(table.contains("| 1 overhead | added p50, Info | 50.0 µs | ≤ 60.0 µs | **PASS** |"), "{table}");
    assert!(table.contains("| 5 cost | instructions per call (callgrind) | 123456 | — | info |"), "{table}");
}

#[test]
fn the_overhead_section_shows_the_floor_and_the_ratio() {
    let text = markdown(&results(vec![overhead()]), &[vec!["x-overhead.svg".into()]]);
    assert!(text.contains("# teifleet benchmarks, 2026-01-02 (quick run)"), "{text}");
    assert!(text.contains("## 1. Overhead"), "{text}");
    assert!(text.contains("| Info (no device time) | 100 | 0.100 ms | 0.150 ms | +50 µs | +25 µs | 2.00× |"), "{text}");
    assert!(text.contains("**The floor this machine allows**"), "{text}");
    assert!(
        text.contains(
            "Info: the h2 floor adds +15 µs, the tonic floor +25 µs, the multiplexer +50 µs (2.00× the tonic floor)"
        ),
        "{text}"
    );
    assert!(text.contains("| +25 µs | 2.00× | +15 µs | +10 µs | +20 µs | 2.50× |"), "{text}");
    assert!(
        text.contains(
            "Info: HAProxy TCP adds +10 µs, HAProxy h2 +20 µs, the h2 floor +15 µs (0.750× HAProxy h2), the \
             multiplexer +50 µs (2.50× HAProxy h2)"
        ),
        "{text}"
    );
    assert!(text.contains("![x-overhead.svg](x-overhead.svg)"));
    // Embed 20 tokens adds 250 µs: a FAIL with its fix.
    assert!(text.contains("| 1 overhead | added p50, Embed 20 tokens | 250 µs | ≤ 60.0 µs | **FAIL** |"), "{text}");
    assert!(text.contains("### What would fix the failures"), "{text}");
}

#[test]
fn the_storm_section_puts_shed_cost_next_to_served_cost() {
    let text = markdown(&results(vec![storm()]), &[vec![]]);
    assert!(text.contains("**200 µs per served call, 50 µs per shed**"), "{text}");
    assert!(text.contains("| multiplexer, storm | 512 | 200.0 | 0.667 |"), "{text}");
    assert!(text.contains("| 7 shed storm | goodput at c=512 on 16 connections, resending ÷ capacity | 0.667 × capacity | ≥ 0.900 × capacity | **FAIL** |"), "{text}");
}

#[test]
fn a_busy_machine_is_said_up_front() {
    let busy = Results { load_before: Some(3.2), ..results(vec![]) };
    assert!(markdown(&busy, &[]).contains("Load average (1 min) when the run started: 3.20. The machine was busy"));
    let quiet = Results { load_before: Some(0.1), ..results(vec![]) };
    assert!(!markdown(&quiet, &[]).contains("was busy"));
}

#[test]
fn a_section_that_could_not_measure_says_why() {
    let text = markdown(&results(vec![Section::not_measured(Scenario::LiveLimits, "no control plane")]), &[vec![]]);
    assert!(text.contains("## 6. Live limit change latency"), "{text}");
    assert!(text.contains("Not measured: no control plane."), "{text}");
    assert!(text.contains("**0 PASS, 0 FAIL, 1 SKIP.**"), "{text}");
}

#[test]
fn writing_produces_markdown_json_and_plots() {
    let dir = std::env::temp_dir().join(format!("teifleet-bench-render-{}", std::process::id()));
    let written = write(&results(vec![overhead(), storm()]), &dir, "2026-01-02").unwrap();
    let names: Vec<String> = written.iter().filter_map(|p| p.file_name()?.to_str().map(str::to_owned)).collect();
    assert_eq!(names, vec!["2026-01-02.md", "2026-01-02.json", "2026-01-02-overhead.svg"]);
    let json = std::fs::read_to_string(dir.join("2026-01-02.json")).unwrap();
    let back: Results = serde_json::from_str(&json).unwrap();
    assert_eq!(back.sections.len(), 2);
    assert!(matches!(back.sections[1].outcome, Some(Outcome::ShedStorm(_))));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_header_says_how_the_binaries_were_built() {
    let plain = markdown(&results(vec![]), &[]);
    assert!(plain.contains("Binaries: plain release build (not profile-guided)."), "{plain}");
    let pgo = Results { build: "profile-guided: teifleet-multiplexer (profile p.profdata)".into(), ..results(vec![]) };
    assert!(markdown(&pgo, &[]).contains("Binaries: profile-guided: teifleet-multiplexer (profile p.profdata)."));
}
