//! The plan's fast path (`PlanRuntime::prepare_changed`): a run that changes only dims some
//! steps read (a decode step's position) prepares those steps again and keeps the last run's
//! launches when theirs are the same. Decode steps over two cached attention layers, a
//! reduction over the keys so far (its grid grows with the position: new launches at powers
//! of two), a product with a weight's static reduction, against the reference backend at
//! every step, through changes that must list new launches: the grid crossing a power of
//! two, a chunk of several tokens (new products, new input lengths), a weight set again (its
//! static step runs again). With graphs (replayed from a capture) and without (the kept
//! launches issued, their attention calls updated). One test in this file: it sets
//! `LUMINAL_CUDA_GRAPHS` for the second runtime.

mod common;
use common::data;
use luminal::prelude::*;
use luminal_cuda::HostEmulatorBackend;
use luminal_nn::{CacheType, KvCache};

/// Runs the decode steps; returns the runtime's (replays, captures).
fn decode() -> (usize, usize) {
    let cx = Graph::new();
    let (hq, hkv, d, max_ctx) = (4, 2, 8, 40);
    let p = Expression::var("p");
    let mut inputs = vec![];
    let mut outputs = vec![];
    let mut caches = vec![];
    for layer in 0..2 {
        let q = cx.tensor(&format!("q{layer}"), (1, hq, "s", d));
        let k = cx.tensor(&format!("k{layer}"), (1, hkv, "s", d));
        let v = cx.tensor(&format!("v{layer}"), (1, hkv, "s", d));
        let cache = KvCache::with_type(&cx, &format!("l{layer}"), hkv, max_ctx, d, CacheType::F32);
        let (kc, vc) = cache.append(k, v, p.clone());
        outputs.push(luminal_nn::causal_attention(q, kc, vc).output());
        // Over the `p + s` keys so far: a launch whose grid follows the position (a block
        // more past p + s = 16).
        outputs.push((kc * 0.5 + 1.0).output());
        inputs.extend([q, k, v]);
        caches.extend([cache.k, cache.v]);
    }
    let x = cx.tensor("x", ("s", 24));
    let w = cx.tensor("w", (24, 6));
    // `w.sum(0)` depends on the weight alone: a static step, run again when `w` is set.
    let bias = w.sum(0).unsqueeze(0).expand(0, Expression::var("s"));
    outputs.push((x.matmul(w) + bias).output());
    inputs.push(x);
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx
        .compile(HostEmulatorBackend, CompileOptions::default())
        .unwrap();
    let zeros = vec![0f32; hkv * max_ctx * d];
    for &c in &caches {
        reference.set(c, &zeros).unwrap();
        rt.set(c, &zeros).unwrap();
    }
    // (tokens, whether `w` is set before the run): a prefill, decode steps across p + s = 16,
    // a chunk of 3, decode steps, `w` set again, decode steps.
    let mut steps = vec![(3, true)];
    steps.extend([(1, false); 17]);
    steps.push((3, false));
    steps.extend([(1, false); 4]);
    steps.push((1, true));
    steps.extend([(1, false); 3]);
    let mut pos = 0;
    for (run, &(s, set_w)) in steps.iter().enumerate() {
        for (name, value) in [("s", s), ("p", pos)] {
            reference.set_dim(name, value);
            rt.set_dim(name, value);
        }
        if set_w {
            let v = data(24 * 6, 100 + run as u32);
            reference.set(w, &v).unwrap();
            rt.set(w, &v).unwrap();
        }
        for (i, &t) in inputs.iter().enumerate() {
            let n: usize = t
                .shape()
                .iter()
                .map(|e| e.eval_with(&|v| (v == "s").then_some(s as i64)).unwrap() as usize)
                .product();
            let v = data(n, (run * inputs.len() + i) as u32 + 7);
            reference.set(t, &v).unwrap();
            rt.set(t, &v).unwrap();
        }
        reference.run().unwrap();
        rt.run().unwrap();
        for (o, &t) in outputs.iter().enumerate() {
            let (want, got) = (reference.get_f32(t).unwrap(), rt.get_f32(t).unwrap());
            assert_eq!(
                want.len(),
                got.len(),
                "run {run} (s {s}, p {pos}) output {o}"
            );
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "run {run} (s {s}, p {pos}) output {o} element {i}: want {a}, got {b}"
                );
            }
        }
        pos += s;
    }
    assert!(
        rt.attention_calls() == 2,
        "attention not fused: the test would not cover its calls"
    );
    rt.graph_replays()
}

#[test]
fn decode_steps_keep_launches_only_while_they_are_the_same() {
    let (replays, captures) = decode();
    // Most decode steps replay: the fast path keeps the launches between the changes.
    assert!(replays >= 12, "{replays} replays, {captures} captures");
    // SAFETY: the only test of this binary: no other thread reads the environment.
    std::env::set_var("LUMINAL_CUDA_GRAPHS", "0");
    let (replays, captures) = decode();
    assert_eq!((replays, captures), (0, 0), "graphs off");
}
