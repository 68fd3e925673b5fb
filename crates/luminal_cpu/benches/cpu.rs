//! `cargo bench -p luminal_cpu`: one markdown table, every row measured in this run, each
//! against a baseline measured on the same buffers (gemm called directly; a plain memcpy of
//! the same bytes), at 1 and 2 threads. Best of several runs (after a warm-up).

use luminal::prelude::*;
use luminal_cpu::{CpuBackend, CpuRuntime};
use std::time::Instant;

fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
        .collect()
}

fn compile(cx: &Graph, threads: usize) -> CpuRuntime {
    cx.compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap()
}

/// Seconds per matmul through luminal, and through `gemm` directly on the same buffers.
fn matmul(m: usize, n: usize, k: usize, threads: usize, reps: usize) -> (f64, f64) {
    let cx = Graph::new();
    let a = cx.tensor("a", (m, k));
    let b = cx.tensor("b", (k, n));
    let _ = a.matmul(b).output();
    let mut rt = compile(&cx, threads);
    let (ad, bd) = (data(m * k), data(k * n));
    rt.set(a, &ad).unwrap();
    rt.set(b, &bd).unwrap();
    let ours = best_of(reps, || rt.run().unwrap());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut dst = vec![0f32; m * n];
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let direct = pool.install(|| {
        best_of(reps, || {
            // SAFETY: row-major m×k, k×n and m×n buffers of exactly those sizes.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    dst.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    ad.as_ptr(),
                    1,
                    k as isize,
                    bd.as_ptr(),
                    1,
                    n as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    par,
                )
            }
        })
    });
    (ours, direct)
}

/// Seconds to copy `bytes` bytes (read + write counted by the caller).
fn memcpy(bytes: usize, threads: usize, reps: usize) -> f64 {
    let n = bytes / 4;
    let src = data(n);
    let mut dst = vec![0f32; n];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    use rayon::prelude::*;
    pool.install(|| {
        best_of(reps, || {
            dst.par_chunks_mut(1 << 16)
                .zip(src.par_chunks(1 << 16))
                .for_each(|(d, s)| d.copy_from_slice(s))
        })
    })
}

fn graph_secs(
    build: for<'g> fn(&'g Graph) -> Vec<GraphTensor<'g>>,
    threads: usize,
    reps: usize,
) -> f64 {
    let cx = Graph::new();
    let ins = build(&cx);
    let mut rt = compile(&cx, threads);
    for t in ins {
        let n: usize = t
            .shape()
            .iter()
            .map(|d| d.as_constant().unwrap() as usize)
            .product();
        rt.set(t, &data(n)).unwrap();
    }
    best_of(reps, || rt.run().unwrap())
}

const N: usize = 16 << 20;
const ROWS: usize = 4096;
const COLS: usize = 2048;

fn chain(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", N);
    let y = cx.tensor("y", N);
    let _ = ((((x * 1.5 + 0.5) * y + x) * 0.25) + y).output();
    vec![x, y]
}
fn softmax(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", (ROWS, COLS));
    let _ = x.softmax(1).output();
    vec![x]
}
fn rms(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", (ROWS, COLS));
    let _ = x.rms_norm(1, 1e-5).output();
    vec![x]
}

fn main() {
    let mut rows: Vec<String> = vec![];
    let gb = |bytes: f64, s: f64| bytes / s / 1e9;
    for &(m, n, k, reps) in &[
        (256, 256, 256, 50),
        (1024, 1024, 1024, 5),
        (2048, 2048, 512, 3),
        (1, 1536, 576, 200),
    ] {
        let flops = 2.0 * (m * n * k) as f64;
        let r: Vec<(f64, f64)> = [1, 2].iter().map(|&t| matmul(m, n, k, t, reps)).collect();
        rows.push(format!(
            "| matmul {m}×{n}×{k} | {:.1} GFLOP/s | {:.1} GFLOP/s | {:.2}× gemm | {:.2}× gemm | {:.2}× |",
            flops / r[0].0 / 1e9,
            flops / r[1].0 / 1e9,
            r[0].1 / r[0].0,
            r[1].1 / r[1].0,
            r[0].0 / r[1].0
        ));
    }
    let (n, rows_, cols) = (N, ROWS, COLS);
    type Build = for<'g> fn(&'g Graph) -> Vec<GraphTensor<'g>>;
    let cases: [(&str, Build, f64); 3] = [
        ("elementwise chain (6 ops) 16M", chain, (3 * n * 4) as f64),
        ("softmax 4096×2048", softmax, (2 * rows_ * cols * 4) as f64),
        ("rms_norm 4096×2048", rms, (2 * rows_ * cols * 4) as f64),
    ];
    for (name, build, bytes) in cases {
        let t: Vec<f64> = [1, 2].iter().map(|&th| graph_secs(build, th, 5)).collect();
        let c: Vec<f64> = [1, 2]
            .iter()
            .map(|&th| memcpy(bytes as usize / 2, th, 5))
            .collect();
        rows.push(format!(
            "| {name} | {:.1} GB/s | {:.1} GB/s | {:.2}× memcpy | {:.2}× memcpy | {:.2}× |",
            gb(bytes, t[0]),
            gb(bytes, t[1]),
            c[0] / t[0],
            c[1] / t[1],
            t[0] / t[1]
        ));
    }
    println!("| benchmark | 1 thread | 2 threads | ratio (1 thread) | ratio (2 threads) | 2-thread speedup |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
