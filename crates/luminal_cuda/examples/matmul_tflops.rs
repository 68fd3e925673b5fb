//! `[m, k]·[k, n]` through luminal on the CUDA backend (cuBLAS `cublasGemmStridedBatchedEx`),
//! timed per `rt.run()` (launch and synchronisation included, inputs kept on the device).
//!
//! `cargo run --release -p luminal_cuda --example matmul_tflops -- [M K N] [REPS] [f32|tf32|f16|bf16]`
//! (default 4096 4096 4096, 20 timed runs after 3 warm-ups, f32): `f16`/`bf16` are graphs
//! whose inputs, product and result are that type (f32 accumulation in cuBLAS); `tf32` is the
//! f32 graph on a backend `with_tf32()`. Prints the best and mean time and TFLOP/s and checks
//! a few output elements against an f64 host dot product of the (rounded) inputs.

use luminal::half::{bf16, f16};
use luminal::prelude::*;
use luminal_cuda::CudaBackend;

mod common;
use common::data;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let kind = words
        .iter()
        .find(|w| w.parse::<usize>().is_err())
        .cloned()
        .unwrap_or_else(|| "f32".into());
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let (m, k, n) = match args[..] {
        [m, k, n, ..] => (m, k, n),
        _ => (4096, 4096, 4096),
    };
    let reps = args.get(3).copied().unwrap_or(20);
    // Every run computes the product (its inputs are not set again between runs, so the
    // plan would otherwise keep the first run's result).
    let mut backend = match CudaBackend::new(0) {
        Ok(b) => b.without_static_steps(),
        Err(e) => {
            eprintln!("matmul_tflops needs a CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let dtype = match kind.as_str() {
        "f32" => DType::F32,
        "tf32" => {
            backend = backend.with_tf32();
            DType::F32
        }
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => return Err(format!("unknown type {other}: f32, tf32, f16 or bf16").into()),
    };
    let cx = Graph::new();
    let a = cx.input("a", (m, k), dtype);
    let b = cx.input("b", (k, n), dtype);
    let c = a.matmul(b).output();
    let mut rt = cx.compile(backend, CompileOptions::default())?;
    let (mut ha, mut hb) = (data(m * k, 1), data(k * n, 2));
    let host = |v: &mut Vec<f32>| -> HostData {
        match dtype {
            DType::F16 => {
                let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                *v = h.iter().map(|x| x.to_f32()).collect();
                HostData::F16(h)
            }
            DType::BF16 => {
                let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
                *v = h.iter().map(|x| x.to_f32()).collect();
                HostData::BF16(h)
            }
            _ => HostData::F32(v.clone()),
        }
    };
    rt.set_data(a, host(&mut ha))?;
    rt.set_data(b, host(&mut hb))?;
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
        "luminal cuda {kind} [{m}, {k}]x[{k}, {n}]: {} product(s) through cuBLAS; best {:.3} ms ({:.2} TFLOP/s), mean of {reps} {:.3} ms ({:.2} TFLOP/s); max rel err of 4 elements vs f64 host {max_rel:.1e}",
        rt.gemm_products(),
        best * 1e3,
        flop / best / 1e12,
        mean * 1e3,
        flop / mean / 1e12
    );
    Ok(())
}
