//! The per-kernel profile table (`LUMINAL_PROFILE=1` or `CpuRuntime::profile()`).

use std::fmt::Write;
use std::time::Duration;

/// One kernel's line: its name, time, bytes moved (output + buffers read) and FLOPs.
pub struct Row<'a> {
    pub name: &'a str,
    pub time: Duration,
    pub bytes: usize,
    pub flops: usize,
}

/// Markdown table: kernel, time, bytes moved, FLOPs, GB/s, GFLOP/s.
pub fn table<'a>(rows: impl Iterator<Item = Row<'a>>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| # | kernel | time (us) | bytes | FLOPs | GB/s | GFLOP/s |\n|---|---|---|---|---|---|---|"
    );
    let (mut total_t, mut total_b, mut total_f) = (0.0, 0usize, 0usize);
    for (i, r) in rows.enumerate() {
        let (bytes, flops) = (r.bytes, r.flops);
        let secs = r.time.as_secs_f64();
        total_t += secs;
        total_b += bytes;
        total_f += flops;
        let _ = writeln!(
            s,
            "| {i} | {} | {:.1} | {bytes} | {flops} | {:.2} | {:.2} |",
            r.name,
            secs * 1e6,
            bytes as f64 / secs.max(1e-12) / 1e9,
            flops as f64 / secs.max(1e-12) / 1e9
        );
    }
    let _ = writeln!(
        s,
        "| | total | {:.1} | {total_b} | {total_f} | | |",
        total_t * 1e6
    );
    s
}
