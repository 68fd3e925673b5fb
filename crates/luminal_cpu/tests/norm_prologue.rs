//! An RMSNorm read only by weight products is computed by those products (the
//! `norm_prologue` of `MatmulKernel`): no norm kernel runs, and the products equal the
//! reference runtime's (which runs the norm's primops, then dequantize-then-matmul), and the
//! same graph with the prologue switched off.
//!
//! Bounds: with f32 activations (`QuantDots::F32`) each output may differ from the reference
//! and from the norm kernel's product by `1e-5 · Σ|x̂·w|` (the sums in another order). With
//! int8 activations (the default) the prologue's rows and the norm kernel's are equal to a
//! few ulps, which the activation rounding can turn into one step of the largest activation
//! times the largest weight. The first row is scaled so that its mean square is of the order
//! of epsilon.

mod blocks_common;

use blocks_common::{random_blocks, Rng};
use luminal::prelude::*;
use luminal_cpu::{CpuBackend, QuantDots};
use luminal_nn::{Linear, Module, RmsNorm};

struct Case {
    dtype: DType,
    k: usize,
    rows: usize,
    scaled: bool,
    /// The first norm reads its input as `[1, rows, k]` (an embedding's rows, unsqueezed).
    unsqueeze: bool,
}

/// The products, in launch order: name, which norm they read (0: `norm(x + 0.5)`, scaled
/// if the case says so; 1: `norm(2x + 0.25)` with a scale and another epsilon), outputs.
/// The first and the last read the same norm, so a run starts with the rows the last run
/// ended with in the scratch (which it must not reuse).
const PRODUCTS: [(&str, usize, usize); 3] = [("q", 0, 40), ("v", 1, 16), ("k", 0, 24)];

/// The inputs of a case, drawn in a fixed order from the seed: `x`, the two norms' scales,
/// the products' weight blocks.
struct Data {
    xs: Vec<f32>,
    scales: [Vec<f32>; 2],
    weights: Vec<Vec<u8>>,
}

fn data(c: &Case, seed: u64) -> Data {
    let mut rng = Rng(seed);
    let xs: Vec<f32> = (0..c.rows * c.k)
        .map(|_| (rng.uniform() * 2.0 - 1.0) * 3.0)
        .collect();
    let xs = scale_first_row(xs, c.k);
    let mut scale = || {
        (0..c.k)
            .map(|_| rng.uniform() * 2.0 + 0.5)
            .collect::<Vec<f32>>()
    };
    let scales = [scale(), scale()];
    let weights = PRODUCTS
        .iter()
        .map(|&(_, _, n)| random_blocks(c.dtype, n * c.k, &mut rng))
        .collect();
    Data {
        xs,
        scales,
        weights,
    }
}

/// Runs the case on `backend` (the reference runtime for `None`); returns every product's
/// values and the kernel names (empty for the reference runtime).
fn run(c: &Case, backend: Option<CpuBackend>, d: &Data) -> (Vec<Vec<f32>>, Vec<String>) {
    let cx = Graph::new();
    for (name, _, _) in PRODUCTS {
        cx.set_tensor_dtype(&format!("{name}.weight"), c.dtype);
    }
    let x = cx.tensor("x", (c.rows, c.k));
    let norms = [
        RmsNorm::with_affine(&cx, "n0", c.k, c.scaled, 1e-5),
        RmsNorm::with_affine(&cx, "n1", c.k, true, 1e-6),
    ];
    // The norms' inputs are computed (a residual sum), as in a transformer block.
    let x0 = if c.unsqueeze {
        (x + 0.5).unsqueeze(0)
    } else {
        x + 0.5
    };
    let h = [norms[0].forward(x0), norms[1].forward(x * 2.0 + 0.25)];
    let linears: Vec<Linear> = PRODUCTS
        .iter()
        .map(|&(name, _, n)| Linear::new(&cx, name, c.k, n, false))
        .collect();
    let outs: Vec<GraphTensor> = PRODUCTS
        .iter()
        .zip(&linears)
        .map(|(&(_, which, _), l)| l.forward(h[which]).output())
        .collect();
    macro_rules! go {
        ($rt:expr) => {{
            let mut rt = $rt;
            for (norm, s) in norms.iter().zip(&d.scales) {
                if let Some(w) = norm.weight {
                    rt.set(w, s).unwrap();
                }
            }
            for (l, b) in linears.iter().zip(&d.weights) {
                let data = HostData::from_bytes(c.dtype, SharedBytes::from_vec(b.clone()));
                rt.set_data(l.weight, data.unwrap()).unwrap();
            }
            // A first run on other rows: the second must not reuse its normalised rows.
            let other: Vec<f32> = d.xs.iter().map(|v| v + 1.0).collect();
            rt.set(x, &other).unwrap();
            rt.run().unwrap();
            rt.set(x, &d.xs).unwrap();
            rt.run().unwrap();
            outs.iter()
                .map(|&o| rt.get::<f32>(o).unwrap())
                .collect::<Vec<_>>()
        }};
    }
    match backend {
        None => {
            let rt = cx.compile(ReferenceBackend, CompileOptions::default());
            (go!(rt.unwrap()), vec![])
        }
        Some(be) => {
            let rt = cx.compile(be, CompileOptions::default()).unwrap();
            let names = rt.kernel_names();
            (go!(rt), names)
        }
    }
}

/// `Σ_q |x̂_q · w_jq|` for every output `j` of every product (the scale of its rounding),
/// from the norms' rows in f64 and the weights decoded by the core's decoders; and one int8
/// rounding step of the largest activation times the largest weight.
fn magnitudes(c: &Case, d: &Data) -> (Vec<Vec<f64>>, f64) {
    let k = c.k;
    let xhat = |which: usize| -> Vec<f64> {
        let (mul, add, eps, scaled) = match which {
            0 => (1.0, 0.5, 1e-5f32, c.scaled),
            _ => (2.0, 0.25, 1e-6f32, true),
        };
        let mut out = vec![0f64; c.rows * k];
        for r in 0..c.rows {
            let row: Vec<f64> = d.xs[r * k..][..k]
                .iter()
                .map(|&v| v as f64 * mul + add)
                .collect();
            let ms = row.iter().map(|v| v * v).sum::<f64>() / k as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            for q in 0..k {
                let s = if scaled {
                    d.scales[which][q] as f64
                } else {
                    1.0
                };
                out[r * k + q] = row[q] * inv * s;
            }
        }
        out
    };
    let rows = [xhat(0), xhat(1)];
    let mut mags = vec![];
    let mut w_max = 0f64;
    for (&(_, which, n), b) in PRODUCTS.iter().zip(&d.weights) {
        let mut w = vec![0f32; n * k];
        luminal::quant::decode(c.dtype, b, &mut w);
        w_max = w.iter().fold(w_max, |a, v| a.max(v.abs() as f64));
        let mut m = vec![0f64; c.rows * n];
        for r in 0..c.rows {
            for j in 0..n {
                m[r * n + j] = (0..k)
                    .map(|q| (rows[which][r * k + q] * w[j * k + q] as f64).abs())
                    .sum();
            }
        }
        mags.push(m);
    }
    let x_max = rows.iter().flatten().fold(0f64, |a, v| a.max(v.abs()));
    (mags, x_max / 127.0 * w_max)
}

/// The first row scaled down 1000×: its mean square (~3e-6) is then of the order of the
/// epsilon, which a wrong epsilon would show.
fn scale_first_row(mut xs: Vec<f32>, k: usize) -> Vec<f32> {
    for v in &mut xs[..k] {
        *v = *v * 1e-3 - 0.5;
    }
    xs
}

#[test]
fn norm_is_computed_by_its_weight_products() {
    let cases = [
        Case {
            dtype: DType::Q8_0,
            k: 96,
            rows: 1,
            scaled: true,
            unsqueeze: false,
        },
        Case {
            dtype: DType::Q4_0,
            k: 64,
            rows: 3,
            scaled: false,
            unsqueeze: true,
        },
        Case {
            dtype: DType::Q4_K,
            k: 256,
            rows: 1,
            scaled: true,
            unsqueeze: false,
        },
        Case {
            dtype: DType::F16,
            k: 80,
            rows: 2,
            scaled: true,
            unsqueeze: false,
        },
        // More rows than a skinny product: the rows are normalised in parallel.
        Case {
            dtype: DType::Q8_0,
            k: 64,
            rows: 37,
            scaled: true,
            unsqueeze: true,
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let d = data(c, 11 + i as u64);
        let what = format!(
            "{:?} K={} rows={} scaled={}",
            c.dtype, c.k, c.rows, c.scaled
        );
        let (want, _) = run(c, None, &d);
        let (mags, step) = magnitudes(c, &d);
        for dots in [QuantDots::F32, QuantDots::Int8] {
            let on = CpuBackend::with_threads(2).quant_dots(dots);
            let off = CpuBackend::with_threads(2)
                .quant_dots(dots)
                .disable_rules(&["norm_prologue"]);
            let (got, names_on) = run(c, Some(on), &d);
            let (other, names_off) = run(c, Some(off), &d);
            assert!(
                !names_on.iter().any(|n| n.starts_with("rows")),
                "{what}: a norm kernel still runs: {names_on:?}"
            );
            assert_eq!(
                names_off.iter().filter(|n| n.starts_with("rows")).count(),
                2,
                "{what}: switched off, each norm has a kernel: {names_off:?}"
            );
            for (p, (name, _, _)) in PRODUCTS.iter().enumerate() {
                let (got, other, want, mag) = (&got[p], &other[p], &want[p], &mags[p]);
                assert_eq!(got.len(), want.len());
                for j in 0..want.len() {
                    let (g, o, w) = (got[j] as f64, other[j] as f64, want[j] as f64);
                    let exact = 1e-5 * mag[j] + 1e-7;
                    if dots == QuantDots::F32 {
                        assert!(
                            (g - w).abs() <= exact,
                            "{what} {name}[{j}]: prologue {g} vs reference {w} (bound {exact})"
                        );
                        assert!(
                            (g - o).abs() <= exact,
                            "{what} {name}[{j}]: prologue {g} vs norm kernel {o}"
                        );
                    } else {
                        // The same int8 scheme over rows equal to a few ulps: at most an
                        // activation rounding tie decided the other way.
                        assert!(
                            (g - o).abs() <= exact + step,
                            "{what} int8 {name}[{j}]: prologue {g} vs norm kernel {o}"
                        );
                    }
                }
            }
        }
    }
}
