//! f32 `[m, k]·[k, n]` through luminal on the CUDA backend (cuBLAS `cublasSgemm…`, no TF32),
//! timed per `rt.run()` (launch and synchronisation included, inputs kept on the device).
//!
//! `cargo run --release -p luminal_cuda --example matmul_tflops -- [M K N] [REPS]`
//! (default 4096 4096 4096, 20 timed runs after 3 warm-ups); prints the best and mean time and
//! TFLOP/s and checks a few output elements against a host dot product.

use luminal::prelude::*;
use luminal_cuda::CudaBackend;

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: M K N [REPS]"))
        .collect();
    let (m, k, n) = match args[..] {
        [m, k, n, ..] => (m, k, n),
        _ => (4096, 4096, 4096),
    };
    let reps = args.get(3).copied().unwrap_or(20);
    let backend = CudaBackend::new(0)?;
    let cx = Graph::new();
    let a = cx.tensor("a", (m, k));
    let b = cx.tensor("b", (k, n));
    let c = a.matmul(b).output();
    let mut rt = cx.compile(backend, CompileOptions::default())?;
    let (ha, hb) = (data(m * k, 1), data(k * n, 2));
    rt.set(a, &ha)?;
    rt.set(b, &hb)?;
    for _ in 0..3 {
        rt.run()?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = std::time::Instant::now();
        rt.run()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let out = rt.get_f32(c)?;
    let mut max_rel = 0f64;
    for &(i, j) in &[(0, 0), (m / 2, n / 3), (m - 1, n - 1), (m / 7, n - 1)] {
        let want: f64 = (0..k)
            .map(|p| ha[i * k + p] as f64 * hb[p * n + j] as f64)
            .sum();
        let got = out[i * n + j] as f64;
        max_rel = max_rel.max((got - want).abs() / want.abs().max(1e-3));
    }
    let best = times.iter().cloned().fold(f64::MAX, f64::min);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let flop = 2.0 * (m * k * n) as f64;
    println!(
        "luminal cuda f32 [{m}, {k}]x[{k}, {n}]: {} product(s) through cuBLAS; best {:.3} ms ({:.2} TFLOP/s), mean of {reps} {:.3} ms ({:.2} TFLOP/s); max rel err of 4 elements vs f64 host {max_rel:.1e}",
        rt.gemm_products(),
        best * 1e3,
        flop / best / 1e12,
        mean * 1e3,
        flop / mean / 1e12
    );
    Ok(())
}
