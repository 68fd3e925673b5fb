//! RMSNorms and residual sums computed by the products next to them: a decode-shaped product
//! over an f16 or bf16 weight whose activations are an RMSNorm of f32 rows runs the
//! tensor-core skinny kernel with the norm computed as it stages them
//! (`codegen::skinny_mma_norm_kernel`), and a norm read only by such products launches
//! nothing of its own; a product read only by a residual sum `y + r` adds `r` as it stores
//! (`codegen::skinny_mma_residual_kernel`), and the sum launches nothing.
//!
//! Each case's products are checked against an f64 model of the plan's semantics: the norm
//! `x · r [· w]` rounded to the weight's type, then the product summed exactly. Bound per
//! output: `1e-5 · Σ|x̂·w|` (f32 sums in another order) plus one step of the half type at the
//! largest `|x̂|` times the largest `|w|` (the f32 norm computed in another order may round
//! to the neighbouring half). The first row of `x` is scaled so that its mean square is of
//! epsilon's order. On the emulator, the cooperative emulator (the kernels' GPU branch on
//! OpenMP threads, `mma` emulated) and, where there is one, a GPU.

mod common;

use common::data;
use luminal::half::{bf16, f16};
use luminal::prelude::*;
use luminal::quant::SharedBytes;
use luminal_cuda::plan::{Executor, PlanRuntime};
use luminal_cuda::{HostEmulatorBackend, HostEmulatorCooperative};

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    k: usize,
    dtype: DType,
    /// The first norm has a learned weight.
    weighted: bool,
    /// The first norm is also a graph output (read by something other than products).
    also_read: bool,
    /// A Q8_0 product also reads the first norm (its blocks read in place).
    quant: bool,
}

/// The products: (rows, which norm). Norm 0: `norm(x + 0.5)` (eps 1e-5, weighted if the
/// case says so); norm 1: `norm(2x + 0.25)` with a weight and eps 1e-6.
const PRODUCTS: [(usize, usize); 4] = [(40, 0), (24, 0), (16, 0), (32, 1)];

fn round(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => bf16::from_f64(v).to_f64(),
        _ => f16::from_f64(v).to_f64(),
    }
}

/// The f64 model of norm `n` of rows `h` (`[m, k]`), rounded to `dtype`.
fn normed(h: &[f64], k: usize, w: Option<&[f32]>, eps: f64, dtype: DType) -> Vec<f64> {
    h.chunks(k)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / k as f64;
            let r = 1.0 / (ms + eps).sqrt();
            row.iter()
                .enumerate()
                .map(move |(e, v)| round(v * r * w.map_or(1.0, |w| w[e] as f64), dtype))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Runs `c` on `backend`; returns its launches per run.
fn check<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: B, c: Case) -> usize {
    let name = format!("{c:?}");
    let cx = Graph::new();
    let x = cx.tensor("x", (c.m, c.k));
    let nw = [cx.tensor("n0.weight", c.k), cx.tensor("n1.weight", c.k)];
    // The norms' inputs have buffers of their own (as a model's residual stream: read by the
    // norm and by a later residual sum; here outputs).
    let h = [(x + 0.5).output(), (x * 2.0 + 0.25).output()];
    let n0 = h[0].rms_norm(-1, 1e-5);
    let n0 = if c.weighted { n0 * nw[0] } else { n0 };
    let n1 = h[1].rms_norm(-1, 1e-6) * nw[1];
    let norms = [n0, n1];
    let ws: Vec<_> = PRODUCTS
        .iter()
        .enumerate()
        .map(|(i, &(n, _))| cx.input(&format!("w{i}"), (n, c.k), c.dtype))
        .collect();
    let ys: Vec<_> = PRODUCTS
        .iter()
        .zip(&ws)
        .map(|(&(_, which), &w)| {
            norms[which]
                .matmul(w.cast(DType::F32).permute([1, 0]))
                .output()
        })
        .collect();
    if c.also_read {
        norms[0].output();
    }
    let wq = c.quant.then(|| cx.input("wq", (8, c.k), DType::Q8_0));
    let q = wq.map(|wq| {
        norms[0]
            .matmul(wq.cast(DType::F32).permute([1, 0]))
            .output()
    });
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();

    let mut xv = data(c.m * c.k, 3 + c.k as u32);
    for v in &mut xv[..c.k] {
        *v *= 1e-3; // mean square ~1e-6: of epsilon's order
    }
    let nwv = [data(c.k, 5), data(c.k, 6)];
    rt.set_data(x, HostData::F32(xv.clone())).unwrap();
    for (t, v) in nw.iter().zip(&nwv) {
        rt.set_data(*t, HostData::F32(v.clone())).unwrap();
    }
    let mut wvals = vec![];
    for (i, (&(n, _), &w)) in PRODUCTS.iter().zip(&ws).enumerate() {
        let v: Vec<f32> = data(n * c.k, 20 + i as u32)
            .iter()
            .map(|&v| round(v as f64 * 0.5, c.dtype) as f32)
            .collect();
        let d = match c.dtype {
            DType::BF16 => HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
            _ => HostData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        };
        rt.set_data(w, d).unwrap();
        wvals.push(v);
    }
    let qvals = q.map(|_| {
        let v = data(8 * c.k, 40);
        let mut b = vec![0u8; DType::Q8_0.bytes_for(8 * c.k).unwrap()];
        luminal::quant::encode(DType::Q8_0, &v, &mut b);
        let mut back = vec![0f32; 8 * c.k];
        luminal::quant::decode(DType::Q8_0, &b, &mut back);
        (b, back)
    });
    if let (Some((b, _)), Some(wq)) = (&qvals, wq) {
        rt.set_data(
            wq,
            HostData::from_bytes(DType::Q8_0, SharedBytes::from_vec(b.clone())).unwrap(),
        )
        .unwrap();
    }
    rt.run().unwrap();

    let hv: [Vec<f64>; 2] = [
        xv.iter().map(|&v| v as f64 + 0.5).collect(),
        xv.iter()
            .map(|&v| (v as f64 * 2.0 + 0.25) as f32 as f64)
            .collect(),
    ];
    let nv = [
        normed(
            &hv[0],
            c.k,
            c.weighted.then_some(&nwv[0][..]),
            1e-5,
            c.dtype,
        ),
        normed(&hv[1], c.k, Some(&nwv[1]), 1e-6, c.dtype),
    ];
    let step = match c.dtype {
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    };
    let compare = |label: &str, got: Vec<f32>, a: &[f64], w: &[f32], n: usize, half: f64| {
        assert_eq!(got.len(), c.m * n, "{name} {label}");
        let wmax = w.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        for j in 0..c.m {
            let row = &a[j * c.k..(j + 1) * c.k];
            let amax = row.iter().fold(0f64, |m, v| m.max(v.abs()));
            for i in 0..n {
                let wr = &w[i * c.k..(i + 1) * c.k];
                let want: f64 = row.iter().zip(wr).map(|(a, &w)| a * w as f64).sum();
                let abs: f64 = row.iter().zip(wr).map(|(a, &w)| (a * w as f64).abs()).sum();
                let bound = 1e-5 * abs + half * amax * wmax + 1e-30;
                let g = got[j * n + i] as f64;
                assert!(
                    (g - want).abs() <= bound,
                    "{name} {label} row {j} output {i}: want {want}, got {g} (bound {bound})"
                );
            }
        }
    };
    for (p, (&(n, which), &y)) in PRODUCTS.iter().zip(&ys).enumerate() {
        compare(
            &format!("product {p}"),
            rt.get_f32(y).unwrap(),
            &nv[which],
            &wvals[p],
            n,
            step,
        );
    }
    if let (Some((_, back)), Some(q)) = (&qvals, q) {
        // The in-place Q8_0 kernel reads the norm's f32 rows rounded to f16.
        let a: Vec<f64> = nv_unrounded(&hv[0], c.k, c.weighted.then_some(&nwv[0][..]), 1e-5)
            .into_iter()
            .map(|v| round(v, DType::F16))
            .collect();
        // With more rows cuBLAS reads the weight's f16 copy (its values rounded to f16).
        let w: Vec<f32> = if c.m > luminal_cuda::gemm::SKINNY_ROWS as usize {
            back.iter()
                .map(|&v| round(v as f64, DType::F16) as f32)
                .collect()
        } else {
            back.clone()
        };
        compare(
            "q8_0 product",
            rt.get_f32(q).unwrap(),
            &a,
            &w,
            8,
            2f64.powi(-11),
        );
    }
    rt.launches()
}

fn nv_unrounded(h: &[f64], k: usize, w: Option<&[f32]>, eps: f64) -> Vec<f64> {
    h.chunks(k)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / k as f64;
            let r = 1.0 / (ms + eps).sqrt();
            row.iter()
                .enumerate()
                .map(move |(e, v)| v * r * w.map_or(1.0, |w| w[e] as f64))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Launches the fusions save per norm (its sum of squares and its chain) or per pair of
/// residual sums: 2 where the products of `m` rows are skinny, none otherwise.
fn fewer_launches(m: usize) -> usize {
    if m <= luminal_cuda::gemm::SKINNY_ROWS as usize {
        2
    } else {
        0
    }
}

/// Every case on `backend`; a norm read only by skinny products launches nothing: two
/// launches fewer per such norm than the same graph with the first norm also an output
/// (both norms' two kernels, a sum of squares and its elementwise chain, are skipped when
/// only products read them); with 5 rows (cuBLAS's products) or a Q8_0 product reading the
/// first norm, it runs.
fn all<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: impl Fn() -> B) {
    for dtype in [DType::F16, DType::BF16] {
        for (m, k) in [(1, 64), (2, 200), (4, 576), (1, 1024), (5, 64)] {
            for weighted in [true, false] {
                let case = Case {
                    m,
                    k,
                    dtype,
                    weighted,
                    also_read: false,
                    quant: false,
                };
                let skipped = check(backend(), case);
                let kept = check(
                    backend(),
                    Case {
                        also_read: true,
                        ..case
                    },
                );
                let fewer = fewer_launches(m);
                assert_eq!(
                    kept - skipped,
                    fewer,
                    "{case:?}: launches {skipped} and {kept}"
                );
                if dtype == DType::F16 && weighted && k % 32 == 0 {
                    let with_q = check(
                        backend(),
                        Case {
                            quant: true,
                            ..case
                        },
                    );
                    assert!(with_q > skipped, "{case:?}: the Q8_0 reader's norm runs");
                }
            }
        }
    }
}

/// A transformer block's two residual sums: `y = norm(h)·W1ᵀ + h` (the norm and the residual
/// in one kernel) and `z = y·W2ᵀ + y` (plain activations), `W1`, `W2` square `[k, k]`, `h =
/// x + 0.5` with a buffer of its own. Checked against the f64 model (`y` as the bound above
/// plus `y`'s own bound carried through `W2`'s row); returns the launches per run. With
/// `keep`, the products are also outputs (so their sums cannot be added as they store).
fn residual<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    backend: B,
    (m, k, dtype): (usize, usize, DType),
    keep: bool,
) -> usize {
    let name = format!("residual m {m} k {k} {dtype} keep {keep}");
    let cx = Graph::new();
    let x = cx.tensor("x", (m, k));
    let nw = cx.tensor("n.weight", k);
    let h = (x + 0.5).output();
    let n = h.rms_norm(-1, 1e-5) * nw;
    let w1 = cx.input("w1", (k, k), dtype);
    let w2 = cx.input("w2", (k, k), dtype);
    let p1 = n.matmul(w1.cast(DType::F32).permute([1, 0]));
    let y = p1 + h;
    let p2 = y.matmul(w2.cast(DType::F32).permute([1, 0]));
    let z = (p2 + y).output();
    if keep {
        p1.output();
        p2.output();
    }
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    let xv = data(m * k, 9 + k as u32);
    let nwv = data(k, 10);
    let wv: Vec<Vec<f32>> = (0..2)
        .map(|i| {
            data(k * k, 30 + i)
                .iter()
                .map(|&v| round(v as f64 * 0.1, dtype) as f32)
                .collect()
        })
        .collect();
    rt.set_data(x, HostData::F32(xv.clone())).unwrap();
    rt.set_data(nw, HostData::F32(nwv.clone())).unwrap();
    for (t, v) in [w1, w2].iter().zip(&wv) {
        let d = match dtype {
            DType::BF16 => HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
            _ => HostData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        };
        rt.set_data(*t, d).unwrap();
    }
    rt.run().unwrap();
    let step = match dtype {
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-11),
    };
    let hv: Vec<f64> = xv.iter().map(|&v| (v + 0.5) as f64).collect();
    let nv = normed(&hv, k, Some(&nwv), 1e-5, dtype);
    // Row j of `a · Wᵀ + r`, and each output's bound (`carried`: the activations' own).
    let layer = |a: &[f64], w: &[f32], r: &[f64], carried: f64| -> (Vec<f64>, Vec<f64>) {
        let mut out = vec![];
        let mut bounds = vec![];
        for j in 0..m {
            let row = &a[j * k..(j + 1) * k];
            let amax = row.iter().fold(0f64, |mx, v| mx.max(v.abs()));
            for i in 0..k {
                let wr = &w[i * k..(i + 1) * k];
                let wsum: f64 = wr.iter().map(|&v| v.abs() as f64).sum();
                let wmax = wr.iter().fold(0f64, |mx, v| mx.max(v.abs() as f64));
                out.push(
                    row.iter().zip(wr).map(|(a, &w)| a * w as f64).sum::<f64>() + r[j * k + i],
                );
                let abs: f64 = row.iter().zip(wr).map(|(a, &w)| (a * w as f64).abs()).sum();
                bounds.push(
                    1e-5 * (abs + r[j * k + i].abs()) + step * amax * wmax + carried * (1.0 + wsum),
                );
            }
        }
        (out, bounds)
    };
    let (yv, yb) = layer(&nv, &wv[0], &hv, 0.0);
    let y_err = yb.iter().fold(0f64, |mx, &b| mx.max(b));
    let yr: Vec<f64> = yv.iter().map(|&v| round(v, dtype)).collect();
    let (zv, zb) = layer(&yr, &wv[1], &yv, y_err);
    let got = rt.get_f32(z).unwrap();
    assert_eq!(got.len(), m * k, "{name}");
    for (i, ((g, w), b)) in got.iter().zip(&zv).zip(&zb).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= *b,
            "{name} element {i}: want {w}, got {g} (bound {b})"
        );
    }
    rt.launches()
}

/// [`residual`]'s cases: two launches fewer than with the products kept as outputs (the two
/// sums) where the products are skinny, none with 5 rows.
fn residuals<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: impl Fn() -> B) {
    for dtype in [DType::F16, DType::BF16] {
        for (m, k) in [(1, 64), (3, 200), (2, 512), (5, 64)] {
            let fused = residual(backend(), (m, k, dtype), false);
            let kept = residual(backend(), (m, k, dtype), true);
            let fewer = fewer_launches(m);
            assert_eq!(
                kept - fused,
                fewer,
                "m {m} k {k} {dtype}: {fused} and {kept}"
            );
        }
    }
}

/// `want` (the reference runtime, activations not rounded) against `got`: within the
/// activations' f16 rounding (`0.05 + 2%`; the hazards below give wrong values by far more,
/// or fail).
fn close(label: &str, want: &[f32], got: &[f32]) {
    assert_eq!(want.len(), got.len(), "{label}");
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert!(
            (a - b).abs() <= 0.05 + 2e-2 * a.abs(),
            "{label} element {i}: want {a}, got {b}"
        );
    }
}

/// Graphs where a norm's or a residual sum's step must not be skipped or read early, each
/// against the reference runtime over several runs (a stale buffer shows in a later run):
/// - a final norm whose input is computed and read only by the norm (the input's step runs:
///   the norm kernel reads it), prefill (6 rows, products through the emulated cuBLAS) then
///   decode;
/// - the last layer: a residual sum read only by the final norm (it is the norm's input);
/// - a residual operand computed after the product in the graph's order (not added by the
///   product's kernel);
/// - the sum of two products (`x1·W1ᵀ + x2·W2ᵀ`: the later adds the earlier).
fn hazards<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: impl Fn() -> B) {
    let k = 64;
    let half = |n: usize, seed: u32, scale: f32| -> HostData {
        HostData::F16(
            data(n, seed)
                .iter()
                .map(|&v| f16::from_f32(v * scale))
                .collect(),
        )
    };
    let check_runs = |label: &str,
                      cx: &Graph,
                      inputs: &[(GraphTensor, usize)],
                      weights: &[(GraphTensor, HostData)],
                      y: GraphTensor,
                      rows: &[usize]| {
        let mut reference = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        let mut rt = cx.compile(backend(), CompileOptions::default()).unwrap();
        for (t, d) in weights {
            rt.set_data(*t, d.clone()).unwrap();
            reference.set_data(*t, d.clone()).unwrap();
        }
        for (run, &s) in rows.iter().enumerate() {
            rt.set_dim("s", s);
            reference.set_dim("s", s);
            for (i, &(t, width)) in inputs.iter().enumerate() {
                let v = data(s * width, 10 + 7 * run as u32 + i as u32);
                rt.set(t, &v).unwrap();
                reference.set(t, &v).unwrap();
            }
            reference.run().unwrap();
            rt.run()
                .unwrap_or_else(|e| panic!("{label} run {run} ({s} rows): {e}"));
            close(
                &format!("{label} run {run} ({s} rows)"),
                &reference.get_f32(y).unwrap(),
                &rt.get_f32(y).unwrap(),
            );
        }
    };
    {
        let cx = Graph::new();
        let x = cx.tensor("x", ("s", k));
        let w = cx.input("w", (16, k), DType::F16);
        let h = x + 0.5;
        let y = h
            .rms_norm(-1, 1e-5)
            .matmul(w.cast(DType::F32).permute([1, 0]))
            .output();
        let wd = half(16 * k, 4, 0.5);
        check_runs("final norm", &cx, &[(x, k)], &[(w, wd)], y, &[6, 1, 1]);
    }
    {
        let cx = Graph::new();
        let (x, a) = (cx.tensor("x", ("s", k)), cx.tensor("a", ("s", k)));
        let w1 = cx.input("w1", (k, k), DType::F16);
        let w2 = cx.input("w2", (16, k), DType::F16);
        let h = (x + 0.5).output();
        let y = a.matmul(w1.cast(DType::F32).permute([1, 0])) + h;
        let z = y
            .rms_norm(-1, 1e-5)
            .matmul(w2.cast(DType::F32).permute([1, 0]))
            .output();
        let ws = [(w1, half(k * k, 4, 0.1)), (w2, half(16 * k, 6, 0.5))];
        check_runs("last layer", &cx, &[(x, k), (a, k)], &ws, z, &[1, 1, 2]);
    }
    {
        let cx = Graph::new();
        let (a, b) = (cx.tensor("a", ("s", k)), cx.tensor("b", ("s", k)));
        let w = cx.input("w", (k, k), DType::F16);
        let p = a.matmul(w.cast(DType::F32).permute([1, 0]));
        let r = (b * 2.0 + 1.0).output();
        let y = (p + r).output();
        check_runs(
            "late residual",
            &cx,
            &[(a, k), (b, k)],
            &[(w, half(k * k, 4, 0.1))],
            y,
            &[1, 1],
        );
    }
    {
        let cx = Graph::new();
        let (a, b) = (cx.tensor("a", ("s", k)), cx.tensor("b", ("s", k)));
        let w1 = cx.input("w1", (k, k), DType::F16);
        let w2 = cx.input("w2", (k, k), DType::F16);
        let y = (a.matmul(w1.cast(DType::F32).permute([1, 0]))
            + b.matmul(w2.cast(DType::F32).permute([1, 0])))
        .output();
        let ws = [(w1, half(k * k, 4, 0.1)), (w2, half(k * k, 5, 0.1))];
        check_runs("two products", &cx, &[(a, k), (b, k)], &ws, y, &[1, 1, 3]);
    }
}

#[test]
fn plan_hazards_on_the_emulator() {
    hazards(|| HostEmulatorBackend);
}

#[test]
fn plan_hazards_with_warps_emulated() {
    hazards(|| HostEmulatorCooperative);
}

#[test]
fn norms_in_skinny_products_on_the_emulator() {
    all(|| HostEmulatorBackend);
}

#[test]
fn norms_in_skinny_products_with_warps_emulated() {
    all(|| HostEmulatorCooperative);
}

#[test]
fn residual_sums_in_skinny_products_on_the_emulator() {
    residuals(|| HostEmulatorBackend);
}

#[test]
fn residual_sums_in_skinny_products_with_warps_emulated() {
    residuals(|| HostEmulatorCooperative);
}

#[test]
fn gpu_norms_and_residual_sums_in_skinny_products() {
    match luminal_cuda::CudaBackend::new(0) {
        Ok(b) => {
            all(|| b.clone());
            residuals(|| b.clone());
            hazards(|| b.clone());
        }
        Err(e) => eprintln!("skipping the GPU norms: {e}"),
    }
}
