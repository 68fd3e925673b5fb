//! Causal prefill attention (`luminal_nn::causal_attention`, `s = t`) through luminal on the
//! CUDA backend (the flash-attention kernel, [`luminal_cuda::attention`]), timed per
//! `rt.run()` (the mask kernel, launch and synchronisation included; inputs kept on the
//! device). Batch 1, 32 heads, head dim 128, q f32, k and v f32 or f16.
//!
//! `cargo run --release -p luminal_cuda --example attention_bench -- [SEQ..]`
//! (default 1024 2048 4096 8192; `REPS` in the environment, default 10 timed runs after 2
//! warm-ups). Prints `attention | seq | runner | best ms | mean ms | TFLOP/s` rows
//! (FLOPs `4·s·t·d·heads / 2`, causal) as `scripts/torch_attention_bench.py` does for
//! `torch.nn.functional.scaled_dot_product_attention`, and checks a few output rows against
//! an f64 host computation. `LUMINAL_CUDA_ATTENTION=0` runs the primop kernels instead (they
//! materialise the `heads·s·t` scores: keep the sequence short).

use luminal::half::f16;
use luminal::prelude::*;
use luminal_cuda::CudaBackend;

const HEADS: usize = 32;
const D: usize = 128;

mod common;
use common::data;

/// Row `row` of head `h` of attention over `[heads, s, D]` buffers and keys `0..keys`, in f64.
fn host_row(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: usize,
    h: usize,
    row: usize,
    keys: usize,
) -> Vec<f64> {
    let scale = 1.0 / (D as f64).sqrt();
    let at = |x: &[f32], r: usize, c: usize| x[(h * s + r) * D + c] as f64;
    let x: Vec<f64> = (0..keys)
        .map(|j| (0..D).map(|c| at(q, row, c) * at(k, j, c)).sum::<f64>() * scale)
        .collect();
    let m = x.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = x.iter().map(|x| (x - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    (0..D)
        .map(|c| {
            e.iter()
                .enumerate()
                .map(|(j, p)| p * at(v, j, c))
                .sum::<f64>()
                / sum
        })
        .collect()
}

fn bench(
    backend: &CudaBackend,
    s: usize,
    kv: DType,
    reps: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let cx = Graph::new();
    // A dynamic sequence dim, as a model's: the plan then recomputes the attention every run
    // (a graph of constant shape over inputs set once would be computed once and kept).
    let q = cx.tensor("q", (1, HEADS, "s", D));
    let k = cx.input("k", (1, HEADS, "s", D), kv);
    let v = cx.input("v", (1, HEADS, "s", D), kv);
    // `ATTN_NOMASK=1`: no mask (`luminal_nn::attention`, every key visible: twice the FLOPs).
    let causal = std::env::var("ATTN_NOMASK").map_or(true, |v| v == "0");
    let out = if causal {
        luminal_nn::causal_attention(q, k, v)
    } else {
        luminal_nn::attention(q, k, v, None)
    }
    .output();
    let mut rt = cx.compile(backend.clone(), CompileOptions::default())?;
    rt.set_dim("s", s);
    let n = HEADS * s * D;
    let (hq, mut hk, mut hv) = (data(n, 1), data(n, 2), data(n, 3));
    rt.set(q, &hq)?;
    if kv == DType::F16 {
        let half = |x: &mut Vec<f32>| -> Vec<f16> {
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            *x = h.iter().map(|v| v.to_f32()).collect();
            h
        };
        rt.set(k, &half(&mut hk))?;
        rt.set(v, &half(&mut hv))?;
    } else {
        rt.set(k, &hk)?;
        rt.set(v, &hv)?;
    }
    for _ in 0..2 {
        rt.run()?;
    }
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = std::time::Instant::now();
        rt.run()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let got = rt.get_f32(out)?;
    let mut max_err = 0f64;
    for &(h, row) in &[
        (0, 0),
        (HEADS / 2, s / 3),
        (HEADS - 1, s - 1),
        (7 % HEADS, s / 2 + 1),
    ] {
        let want = host_row(&hq, &hk, &hv, s, h, row, if causal { row + 1 } else { s });
        for (c, w) in want.iter().enumerate() {
            let g = got[(h * s + row) * D + c] as f64;
            max_err = max_err.max((g - w).abs() / (1.0 + w.abs()));
        }
    }
    let best = times.iter().cloned().fold(f64::MAX, f64::min);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let flops = 4.0 * (s * s * D * HEADS) as f64 / if causal { 2.0 } else { 1.0 };
    // Over f16 keys and values the f16 tensor-core kernel runs unless
    // `LUMINAL_CUDA_ATTENTION=tf32` (or `simt`) asks for another.
    let kernel = match std::env::var("LUMINAL_CUDA_ATTENTION") {
        Ok(v) if !v.is_empty() => v,
        _ if kv == DType::F16 => "f16 mma".to_string(),
        _ => "3xtf32 mma".to_string(),
    };
    let runner = format!(
        "luminal cuda {} (k/v {kv}{}, fused {})",
        if backend.flash_attention() {
            format!("flash {kernel}")
        } else {
            "primops".to_string()
        },
        if causal { "" } else { ", no mask" },
        rt.attention_calls()
    );
    println!(
        "attention | {s} | {runner} | {:.3} | {:.3} | {:.2}",
        best * 1e3,
        mean * 1e3,
        flops / best / 1e12
    );
    eprintln!("  max |Δ|/(1+|want|) over 4 checked rows: {max_err:.2e}");
    // The f16 kernel rounds q and the probabilities to f16.
    let bound = if kv == DType::F16 { 1e-2 } else { 1e-3 };
    if max_err > bound {
        return Err(
            format!("seq {s} k/v {kv}: output differs from the host by {max_err:.2e}").into(),
        );
    }
    Ok(())
}

fn main() {
    let mut seqs: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("sequence lengths: attention_bench [SEQ..]")
        })
        .collect();
    if seqs.is_empty() {
        seqs = vec![1024, 2048, 4096, 8192];
    }
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    // Every run computes (a step over inputs not set again would otherwise keep its result).
    let backend = match CudaBackend::new(0) {
        Ok(b) => b.without_static_steps(),
        Err(e) => {
            eprintln!("attention_bench needs a CUDA GPU: {e}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "{} ({}), batch 1, {HEADS} heads, d {D}, causal s = t, best/mean of {reps}",
        backend.device_name().unwrap_or_default(),
        backend.arch()
    );
    println!("attention | seq | runner | best ms | mean ms | TFLOP/s");
    for &s in &seqs {
        // `luminal_nn::attention` (no mask) takes k and v in q's dtype only.
        let nomask = std::env::var("ATTN_NOMASK").is_ok_and(|v| v != "0");
        // `ATTN_KV=f16` (or `f32`): that k/v type only.
        let only = std::env::var("ATTN_KV").ok();
        for kv in [DType::F32, DType::F16] {
            if (nomask && kv != DType::F32) || only.as_ref().is_some_and(|o| *o != kv.to_string()) {
                continue;
            }
            if let Err(e) = bench(&backend, s, kv, reps) {
                eprintln!("attention_bench: seq {s}, k/v {kv}: {e}");
                std::process::exit(1);
            }
        }
    }
}
