//! The per-kernel profile table (`LUMINAL_PROFILE=1` or `CpuRuntime::profile()`).

use crate::exec::runtime::CpuRuntime;
use std::fmt::Write;

/// Markdown table: kernel, time, bytes moved (output + buffers read), FLOPs, GB/s, GFLOP/s.
pub fn table(rt: &CpuRuntime) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| # | kernel | time (us) | bytes | FLOPs | GB/s | GFLOP/s |\n|---|---|---|---|---|---|---|"
    );
    let (mut total_t, mut total_b, mut total_f) = (0.0, 0usize, 0usize);
    for (i, (k, t, n)) in rt.profile_rows().enumerate() {
        let elem = k.dtype.size_bytes();
        let read: usize = k.reads().into_iter().map(|b| rt.buf_bytes(b)).sum();
        let bytes = n * elem + read;
        let flops = k.kind.flops(n);
        let secs = t.as_secs_f64();
        total_t += secs;
        total_b += bytes;
        total_f += flops;
        let _ = writeln!(
            s,
            "| {i} | {} | {:.1} | {bytes} | {flops} | {:.2} | {:.2} |",
            k.name,
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
