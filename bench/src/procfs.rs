//! What the kernel says about a process: CPU time from `/proc/<pid>/stat` and resident memory
//! from `/proc/<pid>/status`. Measuring the multiplexer as its own process is what lets these
//! numbers be its alone.

use std::time::Duration;

use crate::{Error, Result};

/// User plus system CPU time of `pid` so far.
pub fn cpu_time(pid: u32, ticks_per_second: u64) -> Result<Duration> {
    let text = read(&format!("/proc/{pid}/stat"))?;
    parse_cpu_ticks(&text)
        .map(|ticks| Duration::from_secs_f64(ticks as f64 / ticks_per_second.max(1) as f64))
        .ok_or_else(|| Error::Process(format!("unreadable /proc/{pid}/stat")))
}

/// Resident set size of `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let text = read(&format!("/proc/{pid}/status"))?;
    parse_rss_kb(&text).map(|kb| kb * 1024).ok_or_else(|| Error::Process(format!("no VmRSS in /proc/{pid}/status")))
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`; 100 on Linux unless
/// the kernel was built otherwise).
pub fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// CPU time of several processes over an interval.
#[derive(Debug)]
pub struct CpuMeter {
    pids: Vec<u32>,
    start: Vec<Duration>,
    ticks: u64,
}

impl CpuMeter {
    pub fn start(pids: &[u32]) -> Result<Self> {
        let ticks = ticks_per_second();
        let start = pids.iter().map(|pid| cpu_time(*pid, ticks)).collect::<Result<Vec<_>>>()?;
        Ok(Self { pids: pids.to_vec(), start, ticks })
    }

    /// CPU seconds each process spent since [`CpuMeter::start`], in the order given.
    pub fn stop(self) -> Result<Vec<f64>> {
        self.pids
            .iter()
            .zip(&self.start)
            .map(|(pid, start)| Ok(cpu_time(*pid, self.ticks)?.saturating_sub(*start).as_secs_f64()))
            .collect()
    }
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::File { what: "reading", path: path.into(), source })
}

/// utime + stime (fields 14 and 15). The command name (field 2) may contain spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so utime (14) is index 11 and stime (15) index 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmRSS:     12345 kB` → 12345.
pub fn parse_rss_kb(status: &str) -> Option<u64> {
    status.lines().find_map(|line| line.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_skip_a_command_name_with_spaces() {
        let stat = "4242 (tei mux (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 100 1000000 500";
        assert_eq!(parse_cpu_ticks(stat), Some(325));
        assert_eq!(parse_cpu_ticks("garbage"), None);
    }

    #[test]
    fn rss_from_status() {
        let status = "Name:\tteifleet-multip\nVmPeak:\t  99999 kB\nVmRSS:\t   12345 kB\nThreads:\t3\n";
        assert_eq!(parse_rss_kb(status), Some(12345));
        assert_eq!(parse_rss_kb("Name: x\n"), None);
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(rss_bytes(pid).unwrap() > 0);
        assert!(cpu_time(pid, ticks_per_second()).is_ok());
        let meter = CpuMeter::start(&[pid, pid]).unwrap();
        let spent = meter.stop().unwrap();
        assert_eq!(spent.len(), 2);
        assert!(spent.iter().all(|s| *s >= 0.0));
    }
}
