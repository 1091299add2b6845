//! The sections of the scenarios that measure what the multiplexer spends (5 cost) and how fast it
//! follows a limit change (6 live limits).

use std::fmt::Write as _;

use super::Render;
use super::table::{Table, figure, text};
use super::words::{backend, limits};
use crate::scenarios::cost::{Cost, Memory};
use crate::scenarios::live_limits::LiveLimits;
use crate::targets::number;

/// One memory measurement as a table; `waiting` says where the calls waited.
fn memory_table(out: &mut String, m: &Memory, waiting: &str) {
    Table::new(
        out,
        &[
            figure("RSS idle"),
            figure("RSS loaded"),
            figure(&format!("{waiting} (from /metrics)")),
            figure(&format!("bytes per {waiting} request")),
        ],
    )
    .row(&[
        &format!("{:.1} MiB", m.idle_bytes as f64 / 1_048_576.0),
        &format!("{:.1} MiB", m.loaded_bytes as f64 / 1_048_576.0),
        &m.queued,
        &format!("{:.0}", m.per_queued()),
    ]);
}

impl Render for Cost {
    fn write(&self, out: &mut String) {
        let cpu = &self.cpu;
        let _ = writeln!(
            out,
            "**CPU.** The multiplexer ({}) in front of the {}; open loop at {:.0} req/s for {:.0} s over 4 connections, \
             16-token Embeds, all admitted. CPU = utime + stime of each process over the run, from `/proc/<pid>/stat`. \
             The simulator is a tonic gRPC server that also batches and computes each embedding, so a proxy that costs \
             more per call than it does is doing more than forwarding.\n",
            limits(&self.limits),
            backend(&self.backend),
            cpu.rate,
            cpu.seconds
        );
        let mut table = Table::new(out, &[text("process"), figure("CPU s"), figure("calls"), figure("µs per call")]);
        let mut process = |name: &str, cpu_s: f64, calls: u64, us_per_call: f64| {
            table.row(&[&name, &format!("{cpu_s:.3}"), &calls, &format!("{us_per_call:.1}")]);
        };
        process("multiplexer (proxied)", cpu.mux_cpu_s, cpu.mux_calls, cpu.mux_us_per_call());
        process("simulator (served)", cpu.sim_cpu_s, cpu.sim_served, cpu.sim_us_per_call());
        process("floor proxy on tonic (proxied, same load)", cpu.floor_cpu_s, cpu.floor_calls, cpu.floor_us_per_call());
        if let Some(h2) = &cpu.floor_h2 {
            process("floor proxy on h2 alone (proxied, same load)", h2.cpu_s, h2.calls, h2.us_per_call());
        }
        match (&cpu.haproxy_h2, &cpu.haproxy_missing) {
            (Some(h), _) => process("HAProxy h2c, one thread (proxied, same load)", h.cpu_s, h.calls, h.us_per_call()),
            (None, why) => {
                let why = format!("not run: {}", why.as_deref().unwrap_or("unknown"));
                table.row(&[&"HAProxy h2c", &"—", &"—", &why]);
            }
        }
        let _ = writeln!(
            out,
            "\nRatio multiplexer ÷ simulator: **{}×**; multiplexer ÷ floor proxy: **{}×** (the floor is what one \
             tonic hop costs with no admission, routing or metrics).",
            number(cpu.ratio()),
            number(cpu.mux_over_floor())
        );
        if let Some(h2) = cpu.mux_over_haproxy_h2() {
            let floor_h2 = cpu.floor_h2_us_per_call().and_then(|us| cpu.over_haproxy_h2(us));
            let _ = writeln!(
                out,
                "Multiplexer ÷ HAProxy h2c: **{}×** (HAProxy decodes and re-encodes every HTTP/2 frame on one thread: \
                 what the best L7 proxy spends per call on this machine); the tonic floor ÷ HAProxy h2c: {}×; the h2 \
                 floor ÷ HAProxy h2c: {}×.",
                number(h2),
                cpu.over_haproxy_h2(cpu.floor_us_per_call()).map_or("n/a".into(), number),
                floor_h2.map_or("n/a".into(), number)
            );
        }
        let _ = write!(out, "\n**Instructions.**");
        match (&self.instructions, &self.instructions_missing) {
            (Some(i), _) => {
                let _ = writeln!(
                    out,
                    " The multiplexer alone under `valgrind --tool=callgrind`, twice: {} warm-up calls then {} calls \
                     (closed loop, one at a time), and the same start and warm-up followed by as long idle ({:.1} s) \
                     with zero calls; each ended by SIGTERM. Per call = the difference ÷ calls, so start-up, idle \
                     timers and shutdown cancel.\n",
                    i.warm_up_calls, i.calls, i.seconds
                );
                Table::new(out, &[text("run"), figure("instructions")])
                    .row(&[&format!("{} calls", i.calls), &i.measured])
                    .row(&[&"zero calls", &i.baseline])
                    .row(&[&"**per call**", &format!("**{:.0}**", i.per_call())]);
            }
            (None, why) => {
                let _ = writeln!(out, " Not measured: {}.", why.as_deref().unwrap_or("unknown"));
            }
        }
        let m = &self.memory;
        let _ = writeln!(
            out,
            "\n**Memory.** A fresh multiplexer ({}) in front of a simulator told to stall, so admitted calls never \
             finish; {} closed-loop clients over 16 connections, so the rest wait in the queue. RSS from \
             `/proc/<pid>/status` (VmRSS), idle (after a warm-up) and with the queue full.\n",
            limits(&m.limits),
            m.clients
        );
        memory_table(out, m, "queued");
        if let Some(held) = &self.memory_held {
            let _ = writeln!(
                out,
                "\nThe same with no queue ({}): every call beyond the in-flight limit waits at the pool's door \
                 (`teifleet_held_at_door`) instead (the load has no deadlines).\n",
                limits(&held.limits)
            );
            memory_table(out, held, "held");
        }
    }
}

impl Render for LiveLimits {
    fn write(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok fake nodes, v1.33), the \
             operator binary, a one-replica pool (`gpu.type: cpu`), and the multiplexer in Kubernetes mode as its \
             sidecar (admin kubeconfig; RBAC does not change the path's timing) in front of the simulator. Each edit \
             is a merge patch of `spec.concurrency.maxInFlight` (alternating 8 and 4); the clock runs from sending the \
             patch until the sidecar's `/metrics` (polled every ~2 ms) shows the new `teifleet_limit_in_flight`.\n"
        );
        let s = &self.summary;
        Table::new(out, &[figure("edits"), figure("p50"), figure("p99"), figure("max"), figure("mean")]).row(&[
            &s.count,
            &format!("{:.1} ms", s.p50_ms),
            &format!("{:.1} ms", s.p99_ms),
            &format!("{:.1} ms", s.max_ms),
            &format!("{:.1} ms", s.mean_ms),
        ]);
        let list: Vec<String> = self.edits_ms.iter().map(|e| format!("{e:.0}")).collect();
        let _ = writeln!(out, "\nEach edit (ms): {}.", list.join(", "));
    }
}
