//! The per-kernel profile table (`LUMINAL_PROFILE=1` or `CpuRuntime::profile()`).

use crate::exec::runtime::CpuRuntime;
use crate::lower::KernelKind;
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
        let read: usize = k.reads.iter().map(|&b| rt.buf_bytes(b)).sum();
        let bytes = n * elem + read;
        let flops = match &k.kind {
            KernelKind::WriteSlice(_) | KernelKind::Direct(_) => 0,
            KernelKind::Elementwise(p) => n * p.flops_per_element(),
            KernelKind::Reduce { prog, .. } => {
                // Every reduced element passes the tree once and is combined once.
                let elems: usize = prog
                    .leaves
                    .first()
                    .map(|l| l.view.dims.iter().product::<i64>().max(0) as usize)
                    .unwrap_or(n);
                elems * (prog.flops_per_element() + 1)
            }
            KernelKind::Matmul(m) => {
                let (b, mm, nn, kk) = m.shape();
                let epi = m.epilogue.as_ref().map_or(0, |p| p.flops_per_element());
                b * mm * nn * (2 * kk + epi)
            }
            KernelKind::Fallback(_) => n,
            KernelKind::Cast(_) | KernelKind::Dequant(_) => 0,
            KernelKind::Rows(r) => r.flops(),
        };
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
