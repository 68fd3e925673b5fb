//! Decode-shaped products (one activation row) through luminal's CUDA backend, timed as the
//! weight bytes they stream per second: a chain of `L` linear layers `x · Wᵀ` alternating
//! `[H, D]` and `[D, H]` weights (a Llama FFN's up and down shapes; `H = D` for square
//! ones), one `rt.run()` (one replayed CUDA graph) per timing, best and mean of `REPS` after
//! warm-ups, the activations set before each run (its time includes that copy). Compare the
//! skinny kernels with cuBLAS by running it twice, with
//! `LUMINAL_CUDA_SKINNY=all` and `LUMINAL_CUDA_SKINNY=0` (read when the plan compiles).
//!
//! `cargo run --release -p luminal_cuda --example matvec_gbps -- [D H L REPS] [f16|bf16|f32|q8_0|q4_0|q4_1] [--emulator]`
//! (default 2048 8192 16 50 f16). Prints one line: the shape, the launches per run, the
//! skinny products, best/mean ms and GB/s of weights, and the largest difference of the
//! last output from an f64 host chain over the same (dequantized) weights. `--emulator` runs
//! the same plan on the host emulator (slow; a check of the example itself).

use luminal::half::{bf16, f16};
use luminal::prelude::*;
use luminal::quant::SharedBytes;
use luminal_cuda::plan::{Executor, PlanRuntime};
use luminal_cuda::{CudaBackend, HostEmulatorBackend};

mod common;
use common::data;

/// Random weights of `rows × cols` in `dtype` (values ~N(0, 1/cols)-sized) and their values.
fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> (HostData, Vec<f32>) {
    let scale = 1.0 / (cols as f32).sqrt();
    let n = rows * cols;
    let v: Vec<f32> = data(n, seed).iter().map(|x| x * 2.0 * scale).collect();
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => match dtype {
            DType::F16 => {
                let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                let back = h.iter().map(|x| x.to_f32()).collect();
                (HostData::F16(h), back)
            }
            DType::BF16 => {
                let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
                let back = h.iter().map(|x| x.to_f32()).collect();
                (HostData::BF16(h), back)
            }
            _ => (HostData::F32(v.clone()), v),
        },
        q => {
            // Quantized by the core's encoder; the reference reads them back by its decoder.
            let mut b = vec![0u8; q.bytes_for(n).expect("whole blocks")];
            luminal::quant::encode(q, &v, &mut b);
            let mut back = vec![0f32; n];
            luminal::quant::decode(q, &b, &mut back);
            let data = HostData::from_bytes(q, SharedBytes::from_vec(b)).expect("whole blocks");
            (data, back)
        }
    }
}

fn run<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    backend: B,
    (d, h, layers, reps): (usize, usize, usize, usize),
    dtype: DType,
) -> Result<String, Box<dyn std::error::Error>> {
    let cx = Graph::new();
    let x = cx.tensor("x", (1, d));
    let mut shapes = vec![];
    let mut y = x;
    let mut ws = vec![];
    for l in 0..layers {
        let (rows, cols) = if l % 2 == 0 { (h, d) } else { (d, h) };
        let w = cx.input(&format!("w{l}"), (rows, cols), dtype);
        y = y.matmul(w.cast(DType::F32).permute([1, 0]));
        shapes.push((rows, cols));
        ws.push(w);
    }
    let y = y.output();
    let mut rt = cx.compile(backend, CompileOptions::default())?;
    let mut values = vec![];
    let mut bytes = 0usize;
    for (l, (&w, &(rows, cols))) in ws.iter().zip(&shapes).enumerate() {
        let (data, v) = weight(dtype, rows, cols, 10 + l as u64);
        bytes += dtype.bytes_for(rows * cols).expect("whole blocks");
        rt.set_data(w, data)?;
        values.push(v);
    }
    let xv = data(d, 3);
    let mut times = vec![];
    for i in 0..reps + 3 {
        let t = std::time::Instant::now();
        // New activations each run (as a decode step's): the products run again, a quantized
        // weight's f16 copy (the cuBLAS path's) is kept from the first run.
        rt.set(x, &xv)?;
        rt.run()?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let got = rt.get_f32(y)?;
    // The f64 chain, activations rounded to f16 before each half or quantized product as the
    // plan rounds them (f32 weights: not rounded).
    let mut act: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
    for (v, &(rows, cols)) in values.iter().zip(&shapes) {
        let a: Vec<f64> = act
            .iter()
            .map(|&z| match dtype {
                DType::F32 => z as f32 as f64,
                DType::BF16 => bf16::from_f64(z).to_f64(),
                _ => f16::from_f64(z).to_f64(),
            })
            .collect();
        act = (0..rows)
            .map(|r| (0..cols).map(|c| v[r * cols + c] as f64 * a[c]).sum())
            .collect();
    }
    let scale = act.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&act)
        .fold(0f64, |m, (&g, &w)| m.max((g as f64 - w).abs()))
        / scale;
    let best = times.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    Ok(format!(
        "matvec {dtype} D {d} H {h} x{layers}: {} launches, {} skinny products; best {:.3} ms \
         ({:.1} GB/s of weights), mean {:.3} ms ({:.1} GB/s); max |Δ|/max|want| {err:.1e}",
        rt.launches(),
        rt.skinny_products(),
        best * 1e3,
        bytes as f64 / best / 1e9,
        mean * 1e3,
        bytes as f64 / mean / 1e9,
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let emulator = words.iter().any(|w| w == "--emulator");
    let nums: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let kind = words
        .iter()
        .find(|w| w.parse::<usize>().is_err() && !w.starts_with("--"))
        .map_or("f16", |s| s.as_str());
    let dtype = match kind {
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        other => return Err(format!("unknown type {other}").into()),
    };
    let get = |i: usize, default: usize| nums.get(i).copied().unwrap_or(default);
    let shape = (get(0, 2048), get(1, 8192), get(2, 16), get(3, 50));
    let line = if emulator {
        run(HostEmulatorBackend, shape, dtype)?
    } else {
        match CudaBackend::new(0) {
            Ok(b) => run(b, shape, dtype)?,
            Err(e) => {
                eprintln!("matvec_gbps needs a CUDA device (or --emulator): {e}");
                std::process::exit(2);
            }
        }
    };
    println!("{line}");
    Ok(())
}
