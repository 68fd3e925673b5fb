//! Matrix products on a CUDA plan (GPU or emulator) against the reference runtime.

use super::data;
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
            reference.set(t, &v).unwrap();
            rt.set(t, &v).unwrap();
        }
        reference.run().unwrap();
        rt.run().unwrap();
        for (o, &t) in outputs.iter().enumerate() {
            let (w, g) = (reference.get_f32(t).unwrap(), rt.get_f32(t).unwrap());
            assert_eq!(w.len(), g.len(), "{name} output {o}");
            for (i, (a, b)) in w.iter().zip(&g).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "{name} {dims:?} output {o} element {i}: want {a}, got {b}"
                );
            }
        }
        match expect_gemm {
            Some(true) => assert!(rt.gemm_products() > 0, "{name}: no product went to gemm"),
            Some(false) => assert_eq!(rt.gemm_products(), 0, "{name}: a product went to gemm"),
            None => {}
        }
    }
}

/// Every case; `gemm`: whether the backend runs products through gemm.
pub fn all<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: impl Fn() -> B, gemm: bool) {
    let on = Some(gemm);
    check(
        "odd 2-D",
        backend(),
        |cx| {
            let a = cx.tensor("a", (7, 13));
            let b = cx.tensor("b", (13, 5));
            (vec![a, b], vec![a.matmul(b).output()])
        },
        &[&[]],
        on,
    );
    check(
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
    );
    check(
        "batched, broadcast weight",
        backend(),
        |cx| {
            let x = cx.tensor("x", (3, 6, 10));
            let w = cx.tensor("w", (10, 4));
            (vec![x, w], vec![x.matmul(w).output()])
        },
        &[&[]],
        on,
    );
    check(
        "two batch dims",
        backend(),
        |cx| {
            let a = cx.tensor("a", (2, 3, 5, 8));
            let b = cx.tensor("b", (2, 3, 8, 6));
            (vec![a, b], vec![a.matmul(b).output()])
        },
        &[&[]],
        on,
    );
    check(
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
    );
    check(
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
    );
    check(
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
    );
    check(
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
    );
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
