//! Attention graphs (`luminal_nn::causal_attention` with and without a KV cache, grouped
//! queries, f16 caches, `luminal_nn::attention` with a padding bias) on a CUDA plan (GPU or
//! emulator) against the reference runtime, and whether the plan ran them fused.

use super::data;
use luminal::half::f16;
use luminal::prelude::*;
use luminal_cuda::plan::{Executor, PlanRuntime};
use luminal_nn::{CacheType, KvCache};

/// Builds a graph with `build` (inputs and outputs), runs it on `backend` and the reference
/// for each binding of `dims` in turn (state written by one run is read by the next), and
/// compares every output (`|Δ| ≤ tol·(1 + |want|)`). `fused`: whether every run must have
/// computed an attention through the executor (`Some(false)`: none).
pub fn check<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    name: &str,
    backend: B,
    tol: f32,
    build: impl for<'g> Fn(&'g Graph) -> (Vec<GraphTensor<'g>>, Vec<GraphTensor<'g>>),
    bindings: &[&[(&str, usize)]],
    fused: Option<bool>,
) {
    let cx = Graph::new();
    let (inputs, outputs) = build(&cx);
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (b, dims) in bindings.iter().enumerate() {
        for (d, v) in dims.iter() {
            reference.set_dim(d, *v);
            rt.set_dim(d, *v);
        }
        for (i, &t) in inputs.iter().enumerate() {
            // Caches (state) are set once, before the first run.
            if b > 0 && t.shape().iter().all(|e| e.as_constant().is_some()) {
                continue;
            }
            let v = data(elements(t, dims), i as u32 + 31 * b as u32 + 7);
            set_values(&mut reference, t, &v);
            set_values(&mut rt, t, &v);
        }
        reference.run().unwrap();
        rt.run().unwrap();
        for (o, &t) in outputs.iter().enumerate() {
            let (w, g) = (reference.get_f32(t).unwrap(), rt.get_f32(t).unwrap());
            assert_eq!(w.len(), g.len(), "{name} output {o}");
            if std::env::var("ATTN_ERRORS").is_ok() {
                let worst = w
                    .iter()
                    .zip(&g)
                    .map(|(a, b)| (a - b).abs() / (1.0 + a.abs()));
                eprintln!("{name} {dims:?}: max error {}", worst.fold(0f32, f32::max));
            }
            for (i, (a, b)) in w.iter().zip(&g).enumerate() {
                assert!(
                    (a - b).abs() <= tol * (1.0 + a.abs()),
                    "{name} {dims:?} output {o} element {i}: want {a}, got {b}"
                );
            }
        }
        match fused {
            Some(true) => assert!(
                rt.attention_calls() > 0,
                "{name} {dims:?}: attention was not fused ({} patterns)",
                rt.attention_patterns()
            ),
            Some(false) => assert_eq!(rt.attention_calls(), 0, "{name}: attention was fused"),
            None => {}
        }
    }
}

/// Elements of `t` with its dims bound as `dims` says.
pub fn elements(t: GraphTensor<'_>, dims: &[(&str, usize)]) -> usize {
    t.shape()
        .iter()
        .map(|e| e.eval_with(&|v| dims.iter().find(|d| d.0 == v).map(|d| d.1 as i64)))
        .map(|v| v.unwrap() as usize)
        .product()
}

/// Sets `t` to `values` on `rt`, rounded to f16 where `t` is f16.
pub fn set_values<R: Runtime>(rt: &mut R, t: GraphTensor<'_>, values: &[f32]) {
    if t.dtype() == DType::F16 {
        let h: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
        rt.set(t, &h).unwrap();
    } else {
        rt.set(t, values).unwrap();
    }
}

/// Cached causal attention as a Llama layer builds it: new keys and values appended to a
/// `cache_type` cache at `p`, `hq` query heads over `hkv` kv heads.
pub fn cached<'g>(
    cx: &'g Graph,
    hq: usize,
    hkv: usize,
    d: usize,
    max_ctx: usize,
    cache_type: CacheType,
) -> (Vec<GraphTensor<'g>>, Vec<GraphTensor<'g>>) {
    let q = cx.tensor("q", (1, hq, "s", d));
    let k = cx.tensor("k", (1, hkv, "s", d));
    let v = cx.tensor("v", (1, hkv, "s", d));
    let cache = KvCache::with_type(cx, "layer", hkv, max_ctx, d, cache_type);
    let (kc, vc) = cache.append(k, v, Expression::var("p"));
    let out = luminal_nn::causal_attention(q, kc, vc).output();
    (vec![q, k, v, cache.k, cache.v], vec![out])
}

/// Bidirectional attention of q `[b, h, s, d]` (f32) over f16 keys and values `[b, h, t, d]`
/// (`luminal_nn::scores_product`/`values_product` read them through their widening casts),
/// with a padding bias over the keys (the first `keep` keys of batch 0, every key of the
/// others) or none.
pub fn half_kv<'g>(
    cx: &'g Graph,
    (b, h, s, t, d): (usize, usize, usize, usize, usize),
    keep: Option<usize>,
) -> (Vec<GraphTensor<'g>>, Vec<GraphTensor<'g>>) {
    let q = cx.tensor("q", (b, h, s, d));
    let k = cx.input("k", (b, h, t, d), DType::F16);
    let v = cx.input("v", (b, h, t, d), DType::F16);
    let mut scores = luminal_nn::scores_product(q, k) * (1.0 / (d as f32).sqrt());
    if let Some(keep) = keep {
        // 1 for the first `keep` keys of batch 0 and all of the others, else 0.
        let batch0 = cx
            .arange(b)
            .lt(cx.constant(1.0).expand(0, b))
            .cast(DType::F32);
        let limit = batch0 * (keep as f32 - t as f32) + t as f32;
        let mask = cx
            .arange(t)
            .expand(0, b)
            .lt(limit.expand(1, t))
            .cast(DType::F32);
        scores = scores + luminal_nn::key_padding_bias(mask).expand_to(scores.shape());
    }
    let out = luminal_nn::values_product(scores.softmax(-1), v).output();
    (vec![q, k, v], vec![out])
}

/// Every case; `fused`: whether the backend runs attention fused; `half_tol`: the tolerance
/// of the cases over f16 caches (which the f16 kernel takes, rounding q and the
/// probabilities to f16), the others' is 1e-4.
pub fn all<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(
    backend: impl Fn() -> B,
    fused: bool,
    half_tol: f32,
) {
    let on = Some(fused);
    check(
        "prefill s = t, 4 heads, d 64",
        backend(),
        1e-4,
        |cx| {
            let q = cx.tensor("q", (1, 4, "s", 64));
            let k = cx.tensor("k", (1, 4, "s", 64));
            let v = cx.tensor("v", (1, 4, "s", 64));
            let out = luminal_nn::causal_attention(q, k, v).output();
            (vec![q, k, v], vec![out])
        },
        &[&[("s", 37)], &[("s", 1)], &[("s", 70)]],
        on,
    );
    check(
        "prefill, GQA 3:1, odd d 40",
        backend(),
        1e-4,
        |cx| {
            let q = cx.tensor("q", (1, 6, "s", 40));
            let k = cx.tensor("k", (1, 2, "s", 40));
            let v = cx.tensor("v", (1, 2, "s", 40));
            let out = luminal_nn::causal_attention(q, k, v).output();
            (vec![q, k, v], vec![out])
        },
        &[&[("s", 33)], &[("s", 2)]],
        on,
    );
    check(
        "f32 cache, GQA 3:1, d 64: prefill, decode, chunk after a cache",
        backend(),
        1e-4,
        |cx| cached(cx, 9, 3, 64, 320, CacheType::F32),
        &[
            &[("s", 12), ("p", 0)],
            &[("s", 1), ("p", 12)],
            &[("s", 5), ("p", 13)],
            &[("s", 1), ("p", 290)],
        ],
        on,
    );
    check(
        "f16 cache, GQA 4:1, d 64: prefill, decode to t 300",
        backend(),
        half_tol,
        |cx| cached(cx, 8, 2, 64, 320, CacheType::F16),
        &[
            &[("s", 20), ("p", 0)],
            &[("s", 7), ("p", 20)],
            &[("s", 1), ("p", 27)],
            &[("s", 1), ("p", 299)],
        ],
        on,
    );
    check(
        "f16 cache, no GQA, d 128, long decode (split keys on a GPU)",
        backend(),
        half_tol,
        |cx| cached(cx, 2, 2, 128, 1100, CacheType::F16),
        &[&[("s", 3), ("p", 0)], &[("s", 1), ("p", 1000)]],
        on,
    );
    check(
        "f16 cache, d 128: prefill of 65 (row 64's own key opens a key tile), a chunk of 64",
        backend(),
        half_tol,
        |cx| cached(cx, 2, 2, 128, 160, CacheType::F16),
        &[&[("s", 65), ("p", 0)], &[("s", 64), ("p", 65)]],
        on,
    );
    check(
        "f16 cache, GQA 2:1, d 36 (not a multiple of 8: element staging on a GPU)",
        backend(),
        half_tol,
        |cx| cached(cx, 4, 2, 36, 96, CacheType::F16),
        &[&[("s", 70), ("p", 0)], &[("s", 1), ("p", 70)]],
        on,
    );
    check(
        "f16 k/v, padding bias over the keys, batch 2 (the bias read)",
        backend(),
        half_tol,
        |cx| half_kv(cx, (2, 3, 70, 130, 64), Some(100)),
        &[&[]],
        on,
    );
    check(
        "f16 k/v, no mask, 3 queries over 300 keys (split on a GPU), d 128",
        backend(),
        half_tol,
        |cx| half_kv(cx, (1, 2, 3, 300, 128), None),
        &[&[]],
        on,
    );
    check(
        "f16 cache, GQA 4:1, odd d 24",
        backend(),
        half_tol,
        |cx| cached(cx, 4, 1, 24, 64, CacheType::F16),
        &[&[("s", 9), ("p", 0)], &[("s", 1), ("p", 40)]],
        on,
    );
    check(
        "f32 cache, GQA 2:1, d 30 (not a multiple of 4: scalar staging on a GPU)",
        backend(),
        1e-4,
        |cx| cached(cx, 4, 2, 30, 128, CacheType::F32),
        &[&[("s", 50), ("p", 0)], &[("s", 1), ("p", 50)]],
        on,
    );
    check(
        "head dim 200 (the simple kernel on a GPU)",
        backend(),
        1e-4,
        |cx| {
            let q = cx.tensor("q", (1, 2, "s", 200));
            let k = cx.tensor("k", (1, 2, "s", 200));
            let v = cx.tensor("v", (1, 2, "s", 200));
            let out = luminal_nn::causal_attention(q, k, v).output();
            (vec![q, k, v], vec![out])
        },
        &[&[("s", 11)]],
        on,
    );
    check(
        "encoder attention, padding bias, batch 2",
        backend(),
        1e-4,
        |cx| {
            let q = cx.tensor("q", (2, 3, 17, 32));
            let k = cx.tensor("k", (2, 3, 17, 32));
            let v = cx.tensor("v", (2, 3, 17, 32));
            let mask = cx.tensor("mask", (2, 17));
            // 1 for the first 12 keys of batch 0 and all of batch 1, else 0.
            let keep = cx
                .arange(17)
                .expand(0, 2)
                .lt(cx.constant(12.0).expand(0, 17).expand(0, 2));
            let _ = mask;
            let mask01 = keep.cast(DType::F32);
            let out = luminal_nn::attention(q, k, v, Some(mask01)).output();
            (vec![q, k, v], vec![out])
        },
        &[&[]],
        on,
    );
    check(
        "encoder attention, no mask",
        backend(),
        1e-4,
        |cx| {
            let q = cx.tensor("q", (1, 2, 9, 16));
            let k = cx.tensor("k", (1, 2, 13, 16));
            let v = cx.tensor("v", (1, 2, 13, 16));
            let out = luminal_nn::attention(q, k, v, None).output();
            (vec![q, k, v], vec![out])
        },
        &[&[]],
        on,
    );
}
