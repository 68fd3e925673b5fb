//! Memory-bound ops through luminal on the CUDA backend, in GB/s (issue 14's list: fused
//! elementwise, softmax, rms_norm, against a device-to-device copy of the same bytes; torch
//! eager and `torch.compile` rows come from `scripts/torch_ops_bench.py`, same shapes and
//! formula).
//!
//! `cargo run --release -p luminal_cuda --example ops_gbps -- [ROWS] [COLS] [REPS]`
//! (default 4096 8192 50), f32:
//! - `silu_mul`: `x.silu() * y` (`x · sigmoid(x) · y`, one fused kernel), reads x and y,
//!   writes the product;
//! - `softmax`: `x.softmax(1)` over the last axis;
//! - `rms_norm`: `x.rms_norm(1, 1e-5) * w` (`x · rsqrt(mean(x²) + eps) · w`, what
//!   `luminal_nn::RmsNorm` computes), reads x and w;
//! - `d2d_copy`: `cuMemcpyDtoD` of the softmax's input bytes (read and written).
//!
//! Each graph is compiled once, its inputs set once (they stay on the device), run 3 times to
//! warm up, then `REPS` timed `rt.run()`s (each synchronises; launch overhead included).
//! GB/s = (input bytes + output bytes) / best time. The reductions run twice: as the backend
//! runs them (several threads per output for long rows) and with one thread per output
//! (`without_cooperative_reductions`, the order the emulator sums in). A few rows of each
//! output are checked against an f64 host computation (max relative error printed). Without
//! a GPU it says so and exits with status 2.

use luminal::prelude::*;
use luminal_cuda::CudaBackend;
use std::time::Instant;

mod common;

/// `n` deterministic values in [-4, 4).
fn data(n: usize, seed: u64) -> Vec<f32> {
    common::data(n, seed).into_iter().map(|v| v * 8.0).collect()
}

/// Best and mean seconds of `reps` calls of `f` after 3 warm-ups.
fn time(reps: usize, mut f: impl FnMut() -> luminal::Result<()>) -> luminal::Result<(f64, f64)> {
    for _ in 0..3 {
        f()?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    Ok(summary(&times))
}

fn summary(times: &[f64]) -> (f64, f64) {
    let best = times.iter().cloned().fold(f64::MAX, f64::min);
    (best, times.iter().sum::<f64>() / times.len().max(1) as f64)
}

fn row(op: &str, rows: usize, cols: usize, runner: &str, (best, mean): (f64, f64), bytes: usize) {
    println!(
        "{op} | {rows}x{cols} | {runner} | {:.4} | {:.4} | {:.1}",
        best * 1e3,
        mean * 1e3,
        bytes as f64 / best / 1e9
    );
}

/// Max of `|got - want| / max(|want|, 1e-6)` over `rows` of a `[.., cols]` output.
fn rel_err(got: &[f32], rows: &[usize], cols: usize, want_row: impl Fn(usize) -> Vec<f64>) -> f64 {
    let mut worst = 0f64;
    for &r in rows {
        for (c, w) in want_row(r).into_iter().enumerate() {
            let g = got[r * cols + c] as f64;
            worst = worst.max((g - w).abs() / w.abs().max(1e-6));
        }
    }
    worst
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: [ROWS] [COLS] [REPS]"))
        .collect();
    let rows = args.first().copied().unwrap_or(4096);
    let cols = args.get(1).copied().unwrap_or(8192);
    let reps = args.get(2).copied().unwrap_or(50);
    // Every run computes (a step over inputs not set again would otherwise keep its result).
    let backend = match CudaBackend::new(0) {
        Ok(b) => b.without_static_steps(),
        Err(e) => {
            eprintln!("ops_gbps needs a CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let n = rows * cols;
    let hx = data(n, 1);
    let hy = data(n, 2);
    let hw = data(cols, 3);
    let check_rows = [0, rows / 2, rows - 1];
    let x_row = |r: usize| hx[r * cols..(r + 1) * cols].iter().map(|&v| v as f64);
    println!(
        "# {} ({}), f32, {reps} reps; op | shape | runner | best ms | mean ms | GB/s (at best)",
        backend.device_name()?,
        backend.arch()
    );

    // Fused elementwise: silu(x) * y.
    {
        let cx = Graph::new();
        let x = cx.tensor("x", (rows, cols));
        let y = cx.tensor("y", (rows, cols));
        let out = (x.silu() * y).output();
        let mut rt = cx.compile(backend.clone(), CompileOptions::default())?;
        rt.set(x, &hx)?;
        rt.set(y, &hy)?;
        let t = time(reps, || rt.run())?;
        let got = rt.get_f32(out)?;
        let err = rel_err(&got, &check_rows, cols, |r| {
            x_row(r)
                .zip(&hy[r * cols..(r + 1) * cols])
                .map(|(x, &y)| x / (1.0 + (-x).exp()) * y as f64)
                .collect()
        });
        row("silu_mul", rows, cols, "luminal", t, 3 * n * 4);
        eprintln!(
            "  silu_mul: {} launch(es) per run, max rel err {err:.1e}",
            rt.launches()
        );
    }

    for (runner, b) in [
        ("luminal", backend.clone()),
        (
            "luminal 1 thread/output",
            backend.clone().without_cooperative_reductions(),
        ),
    ] {
        // Softmax over the last axis.
        {
            let cx = Graph::new();
            let x = cx.tensor("x", (rows, cols));
            let out = x.softmax(1).output();
            let mut rt = cx.compile(b.clone(), CompileOptions::default())?;
            rt.set(x, &hx)?;
            let t = time(reps, || rt.run())?;
            let got = rt.get_f32(out)?;
            let err = rel_err(&got, &check_rows, cols, |r| {
                let m = x_row(r).fold(f64::MIN, f64::max);
                let s: f64 = x_row(r).map(|v| (v - m).exp()).sum();
                x_row(r).map(|v| (v - m).exp() / s).collect()
            });
            row("softmax", rows, cols, runner, t, 2 * n * 4);
            eprintln!(
                "  softmax ({runner}): {} launch(es) per run, max rel err {err:.1e}",
                rt.launches()
            );
        }
        // rms_norm with a weight.
        {
            let cx = Graph::new();
            let x = cx.tensor("x", (rows, cols));
            let w = cx.tensor("w", (cols,));
            let out = (x.rms_norm(1, 1e-5) * w.expand(0, rows)).output();
            let mut rt = cx.compile(b.clone(), CompileOptions::default())?;
            rt.set(x, &hx)?;
            rt.set(w, &hw)?;
            let t = time(reps, || rt.run())?;
            let got = rt.get_f32(out)?;
            let err = rel_err(&got, &check_rows, cols, |r| {
                let ms = x_row(r).map(|v| v * v).sum::<f64>() / cols as f64;
                let k = 1.0 / (ms + 1e-5).sqrt();
                x_row(r).zip(&hw).map(|(v, &w)| v * k * w as f64).collect()
            });
            row("rms_norm", rows, cols, runner, t, (2 * n + cols) * 4);
            eprintln!(
                "  rms_norm ({runner}): {} launch(es) per run, max rel err {err:.1e}",
                rt.launches()
            );
        }
    }

    // A device-to-device copy of the softmax's input (its read + written bytes).
    let copies = backend.copy_times(n * 4, reps)?;
    row(
        "d2d_copy",
        rows,
        cols,
        "cuMemcpyDtoD",
        summary(&copies),
        2 * n * 4,
    );
    Ok(())
}
