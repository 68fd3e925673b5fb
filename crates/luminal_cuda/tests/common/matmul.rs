//! Matrix products on a CUDA plan (GPU or emulator) against the reference runtime.

use super::data;
use luminal::half::{bf16, f16};
use luminal::prelude::*;
use luminal_cuda::plan::{Executor, PlanRuntime};

/// Builds a graph with `build` (inputs and outputs), runs it on `backend` and the reference
/// for each binding of `dims`, compares every output, and checks whether products went
/// through the plan's gemm (`expect_gemm`).
fn check<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    name: &str,
    backend: B,
    build: impl for<'g> Fn(&'g Graph) -> (Vec<GraphTensor<'g>>, Vec<GraphTensor<'g>>),
    bindings: &[&[(&str, usize)]],
    expect_gemm: Option<bool>,
) {
    check_tol(name, backend, build, bindings, expect_gemm, 1e-4, None)
}

/// [`check`] with relative tolerance `tol`; half inputs get the data rounded to their type.
fn check_tol<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    name: &str,
    backend: B,
    build: impl for<'g> Fn(&'g Graph) -> (Vec<GraphTensor<'g>>, Vec<GraphTensor<'g>>),
    bindings: &[&[(&str, usize)]],
    expect_gemm: Option<bool>,
    tol: f32,
    expect_half: Option<bool>,
) {
    let cx = Graph::new();
    let (inputs, outputs) = build(&cx);
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for dims in bindings {
        for (d, v) in dims.iter() {
            reference.set_dim(d, *v);
            rt.set_dim(d, *v);
        }
        for (i, &t) in inputs.iter().enumerate() {
            let n = t
                .shape()
                .iter()
                .map(|e| e.eval_with(&|v| dims.iter().find(|d| d.0 == v).map(|d| d.1 as i64)))
                .map(|v| v.unwrap() as usize)
                .product();
            let v = data(n, i as u32 + 17 * dims.len() as u32);
            let host = match t.dtype() {
                DType::F16 => HostData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
                DType::BF16 => HostData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
                _ => HostData::F32(v),
            };
            reference.set_data(t, host.clone()).unwrap();
            rt.set_data(t, host).unwrap();
        }
        reference.run().unwrap();
        rt.run().unwrap();
        for (o, &t) in outputs.iter().enumerate() {
            let (w, g) = (reference.get_f32(t).unwrap(), rt.get_f32(t).unwrap());
            assert_eq!(w.len(), g.len(), "{name} output {o}");
            for (i, (a, b)) in w.iter().zip(&g).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + a.abs()),
                    "{name} {dims:?} output {o} element {i}: want {a}, got {b}"
                );
            }
        }
        match expect_gemm {
            Some(true) => assert!(rt.gemm_products() > 0, "{name}: no product went to gemm"),
            Some(false) => assert_eq!(rt.gemm_products(), 0, "{name}: a product went to gemm"),
            None => {}
        }
        if let Some(h) = expect_half {
            assert_eq!(
                rt.half_products() > 0,
                h,
                "{name}: half operands read by gemm: {}",
                rt.half_products()
            );
        }
    }
}

/// Every case; `gemm`: whether the backend runs products through gemm.
pub fn all<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: impl Fn() -> B, gemm: bool) {
    all_tol(backend, gemm, 1e-4)
}

/// [`all`] on a backend multiplying f32 on TF32 tensor cores (10-bit mantissas: sums of up to
/// 20 products of values in [-2, 2) are off by up to ~1e-2).
pub fn all_tf32<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: impl Fn() -> B) {
    all_tol(backend, true, 2e-2)
}

/// [`all`] with relative tolerance `tol`.
fn all_tol<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    backend: impl Fn() -> B,
    gemm: bool,
    tol: f32,
) {
    let on = Some(gemm);
    check_tol(
        "odd 2-D",
        backend(),
        |cx| {
            let a = cx.tensor("a", (7, 13));
            let b = cx.tensor("b", (13, 5));
            (vec![a, b], vec![a.matmul(b).output()])
        },
        &[&[]],
        on,
        tol,
        None,
    );
    check_tol(
        "transposed operands",
        backend(),
        |cx| {
            let a = cx.tensor("a", (13, 7));
            let b = cx.tensor("b", (5, 13));
            let c = a.permute([1, 0]).matmul(b.permute([1, 0]));
            (vec![a, b], vec![c.output()])
        },
        &[&[]],
        on,
        tol,
        None,
    );
    check_tol(
        "batched, broadcast weight",
        backend(),
        |cx| {
            let x = cx.tensor("x", (3, 6, 10));
            let w = cx.tensor("w", (10, 4));
            (vec![x, w], vec![x.matmul(w).output()])
        },
        &[&[]],
        on,
        tol,
        None,
    );
    check_tol(
        "two batch dims",
        backend(),
        |cx| {
            let a = cx.tensor("a", (2, 3, 5, 8));
            let b = cx.tensor("b", (2, 3, 8, 6));
            (vec![a, b], vec![a.matmul(b).output()])
        },
        &[&[]],
        on,
        tol,
        None,
    );
    check_tol(
        "attention over a dynamic cache window",
        backend(),
        |cx| {
            let q = cx.tensor("q", (2, "s", 16));
            let k = cx.tensor("k", (2, 20, 16));
            let v = cx.tensor("v", (2, 20, 16));
            let end = Expression::var("p") + Expression::var("s");
            let kw = k.slice(1, 0, end.clone());
            let vw = v.slice(1, 0, end);
            let scores = q.matmul(kw.permute([0, 2, 1]));
            let out = scores.matmul(vw);
            (vec![q, k, v], vec![scores.output(), out.output()])
        },
        &[
            &[("s", 3), ("p", 4)],
            &[("s", 1), ("p", 9)],
            &[("s", 5), ("p", 0)],
        ],
        on,
        tol,
        None,
    );
    check_tol(
        "vector times matrix, matrix times vector",
        backend(),
        |cx| {
            let x = cx.tensor("x", (9,));
            let w = cx.tensor("w", (9, 4));
            let m = cx.tensor("m", (3, 9));
            (
                vec![x, w, m],
                vec![x.matmul(w).output(), m.matmul(x).output()],
            )
        },
        &[&[]],
        on,
        tol,
        None,
    );
    check_tol(
        "sliced operand (offset, row stride past K)",
        backend(),
        |cx| {
            let a = cx.tensor("a", (8, 12));
            let b = cx.tensor("b", (10, 3));
            let c = a.slice(0, 2, 7).slice(1, 1, 11).matmul(b);
            (vec![a, b], vec![c.output()])
        },
        &[&[]],
        on,
        tol,
        None,
    );
    check_tol(
        "padded operand (masked: the kernels)",
        backend(),
        |cx| {
            let a = cx.tensor("a", (4, 6));
            let b = cx.tensor("b", (8, 3));
            let c = a.pad_axis(1, 0, 2).matmul(b);
            (vec![a, b], vec![c.output()])
        },
        &[&[]],
        Some(false),
        tol,
        None,
    );
}

/// Products with f16/bf16 operands: half in and out, widening casts of halves (read in
/// place), f32 activations with a half weight (rounded to the weight's type where the backend
/// allows it), a transposed bf16 linear weight, an f16 cache window. `gemm`: whether the
/// backend runs products through gemm; `rounds`: whether it rounds f32 activations to a half
/// weight's type.
pub fn halves<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    backend: impl Fn() -> B,
    gemm: bool,
    rounds: bool,
) {
    let on = Some(gemm);
    let half = Some(gemm);
    let rounded = Some(gemm && rounds);
    // A half's relative precision is 2^-11 (f16) and 2^-8 (bf16); sums of up to 20 terms of
    // magnitude <= 0.25.
    for dt in [DType::F16, DType::BF16] {
        let tol = if dt == DType::F16 { 2e-3 } else { 1.5e-2 };
        check_tol(
            &format!("{dt} operands, {dt} product"),
            backend(),
            |cx| {
                let a = cx.input("a", (7, 13), dt);
                let b = cx.input("b", (13, 5), dt);
                (vec![a, b], vec![a.matmul(b).output()])
            },
            &[&[]],
            on,
            tol,
            half,
        );
        check_tol(
            &format!("{dt} casts, f32 product (exact)"),
            backend(),
            |cx| {
                let a = cx.input("a", (2, 6, 11), dt);
                let b = cx.input("b", (11, 9), dt);
                let c = a.cast(DType::F32).matmul(b.cast(DType::F32));
                (vec![a, b], vec![c.output()])
            },
            &[&[]],
            on,
            1e-4,
            half,
        );
        check_tol(
            &format!("f32 activations, {dt} weight"),
            backend(),
            |cx| {
                let x = cx.tensor("x", (3, 6, 10));
                let w = cx.input("w", (10, 4), dt);
                (vec![x, w], vec![x.matmul(w.cast(DType::F32)).output()])
            },
            &[&[]],
            on,
            tol,
            rounded,
        );
        check_tol(
            &format!("{dt} linear weight (transposed), weight on the left"),
            backend(),
            |cx| {
                let x = cx.tensor("x", (5, 12));
                let w = cx.input("w", (7, 12), dt);
                let y = x.matmul(w.cast(DType::F32).permute([1, 0]));
                let w2 = cx.input("w2", (7, 12), dt);
                let z = w2.cast(DType::F32).matmul(x.permute([1, 0]));
                (vec![x, w, w2], vec![y.output(), z.output()])
            },
            &[&[]],
            on,
            tol,
            rounded,
        );
        check_tol(
            &format!("{dt} cache window"),
            backend(),
            |cx| {
                let q = cx.tensor("q", (2, "s", 16));
                let k = cx.input("k", (2, 20, 16), dt);
                let v = cx.input("v", (2, 20, 16), dt);
                let end = Expression::var("p") + Expression::var("s");
                let kw = k.cast(DType::F32).slice(1, 0, end.clone());
                let vw = v.cast(DType::F32).slice(1, 0, end);
                let scores = q.matmul(kw.permute([0, 2, 1]));
                let out = scores.matmul(vw);
                (vec![q, k, v], vec![scores.output(), out.output()])
            },
            &[&[("s", 3), ("p", 4)], &[("s", 1), ("p", 9)]],
            on,
            tol * 4.0,
            rounded,
        );
    }
}

/// Times `[m, k]·[k, n]` on `backend` (the best of 5 runs after a warm-up, inputs kept on
/// the device); a line for the log.
pub fn time_product<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    backend: B,
    m: usize,
    k: usize,
    n: usize,
) -> String {
    let cx = Graph::new();
    let a = cx.tensor("a", (m, k));
    let b = cx.tensor("b", (k, n));
    let c = a.matmul(b).output();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    rt.set(a, &data(m * k, 1)).unwrap();
    rt.set(b, &data(k * n, 2)).unwrap();
    rt.run().unwrap();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        rt.run().unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    let _ = rt.get_f32(c).unwrap();
    format!(
        "[{m}, {k}]·[{k}, {n}] f32, {} product(s) through gemm: {:.3} ms ({:.1} GFLOP/s)",
        rt.gemm_products(),
        best * 1e3,
        2.0 * (m * k * n) as f64 / best / 1e9
    )
}

/// One decode product `ones[1, k] · Wᵀ` over a random `[n, k]` weight of `dtype`
/// (`quant::random_storage`, seed 1) on the host emulator: its outputs, the weight's storage
/// and the products that ran skinny.
pub fn ones_product(n: usize, k: usize, dtype: DType) -> (Vec<f32>, HostData, usize) {
    let cx = Graph::new();
    let x = cx.tensor("x", (1, k));
    let w = cx.input("w", (n, k), dtype);
    let y = x.matmul(w.cast(DType::F32).permute([1, 0])).output();
    let mut rt = cx
        .compile(luminal_cuda::HostEmulatorBackend, CompileOptions::default())
        .unwrap();
    let data = super::quant::random_storage(dtype, n * k, 1);
    rt.set_data(w, data.clone()).unwrap();
    rt.set(x, &vec![1.0; k]).unwrap();
    rt.run().unwrap();
    let out = rt.get_f32(y).unwrap();
    assert_eq!(out.len(), n);
    (out, data, rt.skinny_products())
}

/// Linear layers with few activation rows (a decode step's): `x [m, K] · Wᵀ` for a `[N, K]`
/// weight in f32, f16 or bf16 (f32 activations, rounded to the weight's half type), a pure
/// f16 product, a sliced activation (offset, row stride past K), K a multiple of 8 (16-byte
/// loads on a GPU) or not; for `m ≤ gemm::SKINNY_ROWS` the plan must run them as skinny
/// kernels (`skinny`: whether the backend has them), else through gemm. The reference gets the
/// activations already rounded to the weight's type, so both sides multiply the same values
/// and differ only in the order of the f32 sums.
pub fn skinny<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    backend: impl Fn() -> B,
    skinny: bool,
) {
    let round = |v: &[f32], dt: DType| -> Vec<f32> {
        v.iter()
            .map(|&x| match dt {
                DType::F16 => f16::from_f32(x).to_f32(),
                DType::BF16 => bf16::from_f32(x).to_f32(),
                _ => x,
            })
            .collect()
    };
    for dt in [DType::F32, DType::F16, DType::BF16] {
        // (m, K, N, pad, weight scale): activations staged in shared memory (M·K ≤ 8192),
        // not staged (8208), unaligned (K 13, 21), f16 subnormal weights (scale 1e-5), rows
        // split between warps (K ≥ 1024), more rows than a launch's blocks take at once (2200
        // rows split in two: 4400 warps, the grid striding over them).
        for (m, k, n, pad, scale) in [
            (1, 1024, 2200, 0, 1.0),
            (1, 64, 9, 0, 1.0),
            (1, 200, 33, 0, 1.0),
            (2, 13, 5, 0, 1.0),
            (3, 24, 40, 8, 1.0),
            (4, 576, 17, 0, 1.0),
            (1, 21, 3, 3, 1.0),
            (2, 4104, 5, 0, 1.0),
            (1, 2056, 7, 0, 1.0),
            (1, 64, 9, 0, 1e-5),
            (5, 64, 9, 0, 1.0),
        ] {
            let name = format!("{dt} weight, m {m}, K {k}, N {n}, pad {pad}, scale {scale}");
            let cx = Graph::new();
            let x_full = cx.tensor("x", (m, k + pad));
            let w = cx.input("w", (n, k), dt);
            let x = x_full.slice(1, pad, k + pad);
            let y = x.matmul(w.cast(DType::F32).permute([1, 0])).output();
            let mut reference = cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap();
            let mut rt = cx.compile(backend(), CompileOptions::default()).unwrap();
            let xv = data(m * (k + pad), 3 + m as u32);
            let wv: Vec<f32> = data(n * k, 7 + k as u32)
                .iter()
                .map(|v| v * scale)
                .collect();
            let wv = round(&wv, dt);
            let wh = match dt {
                DType::F16 => HostData::F16(wv.iter().map(|&v| f16::from_f32(v)).collect()),
                DType::BF16 => HostData::BF16(wv.iter().map(|&v| bf16::from_f32(v)).collect()),
                _ => HostData::F32(wv.clone()),
            };
            rt.set_data(x_full, HostData::F32(xv.clone())).unwrap();
            rt.set_data(w, wh.clone()).unwrap();
            reference
                .set_data(x_full, HostData::F32(round(&xv, dt)))
                .unwrap();
            reference.set_data(w, wh).unwrap();
            reference.run().unwrap();
            rt.run().unwrap();
            let (want, got) = (reference.get_f32(y).unwrap(), rt.get_f32(y).unwrap());
            assert_eq!(want.len(), got.len(), "{name}");
            // Both sum the same rounded operands in f32 in other orders (tensor cores' f32
            // accumulation on a GPU is a little coarser): within 1e-4 of Σ|x̂·w| of each
            // output (a dropped or doubled piece of 8 at K = 4104 is 2e-3 of it).
            let xr = round(&xv, dt);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                let (j, col) = (i / n, i % n);
                let abs: f64 = (0..k)
                    .map(|e| (xr[j * (k + pad) + pad + e] as f64 * wv[col * k + e] as f64).abs())
                    .sum();
                assert!(
                    ((a - b).abs() as f64) <= 1e-4 * abs + 1e-30,
                    "{name} element {i}: want {a}, got {b} (Σ|x·w| {abs})"
                );
            }
            let expect = skinny && m <= luminal_cuda::gemm::SKINNY_ROWS as usize;
            assert_eq!(rt.skinny_products() > 0, expect, "{name}: skinny products");
            assert!(rt.gemm_products() > 0, "{name}: no product went to gemm");
        }
    }
    // Three products over the same activations (a layer's q, k, v): one launch, with a
    // fourth (gate after them) starting another. With 5 rows they go to gemm, after one
    // rounding launch that all four share.
    for m in [1, 2, 5] {
        let cx = Graph::new();
        let rows = [24, 8, 16, 40];
        let (x, ws, ys) = super::shared_linears(&cx, (m, 48), &rows, DType::F16);
        let mut reference = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        let mut rt = cx.compile(backend(), CompileOptions::default()).unwrap();
        let xv = data(m * 48, 11);
        rt.set_data(x, HostData::F32(xv.clone())).unwrap();
        reference
            .set_data(x, HostData::F32(round(&xv, DType::F16)))
            .unwrap();
        for (i, (&w, &n)) in ws.iter().zip(&rows).enumerate() {
            let d = HostData::F16(
                data(n * 48, 20 + i as u32)
                    .iter()
                    .map(|&v| f16::from_f32(v))
                    .collect(),
            );
            rt.set_data(w, d.clone()).unwrap();
            reference.set_data(w, d).unwrap();
        }
        reference.run().unwrap();
        rt.run().unwrap();
        for (o, &y) in ys.iter().enumerate() {
            let (want, got) = (reference.get_f32(y).unwrap(), rt.get_f32(y).unwrap());
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "grouped products m {m} output {o} element {i}: want {a}, got {b}"
                );
            }
        }
        if skinny && m <= luminal_cuda::gemm::SKINNY_ROWS as usize {
            assert_eq!(rt.skinny_products(), 4, "grouped products m {m}");
            assert_eq!(rt.launches(), 2, "grouped products m {m}: launches");
        } else if skinny {
            assert_eq!(rt.skinny_products(), 0, "products m {m}");
            assert_eq!(rt.launches(), 5, "products m {m}: one rounding + 4 gemm");
        }
    }
    // f16 activations and weight, f16 result.
    for m in [1, 3] {
        let cx = Graph::new();
        let x = cx.input("x", (1, m, 40), DType::F16);
        let w = cx.input("w", (24, 40), DType::F16);
        let y = x.matmul(w.permute([1, 0])).output();
        let mut reference = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        let mut rt = cx.compile(backend(), CompileOptions::default()).unwrap();
        let half = |n: usize, seed: u32| -> HostData {
            HostData::F16(data(n, seed).iter().map(|&v| f16::from_f32(v)).collect())
        };
        for (t, d) in [(x, half(m * 40, 5)), (w, half(24 * 40, 6))] {
            rt.set_data(t, d.clone()).unwrap();
            reference.set_data(t, d).unwrap();
        }
        reference.run().unwrap();
        rt.run().unwrap();
        let (want, got) = (reference.get_f32(y).unwrap(), rt.get_f32(y).unwrap());
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            // The reference rounds every product and partial sum to f16; the kernel sums in
            // f32 and rounds once.
            assert!(
                (a - b).abs() <= 2e-2 * (1.0 + a.abs()),
                "f16 product m {m} element {i}: want {a}, got {b}"
            );
        }
        assert_eq!(rt.skinny_products() > 0, skinny, "f16 product m {m}");
    }
}
