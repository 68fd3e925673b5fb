//! The static memory plan on state written in place (a stack of KV-cache "layers"): the
//! values a `WriteSlice` reads are freed after their last read, so the plan's buffers do not
//! grow with the number of layers, and reusing them never changes a result: runs of
//! different lengths at growing positions (chunked prefill, then decode steps) match the
//! reference runtime, outputs and cache contents alike.

use luminal::prelude::*;
use luminal_cpu::{CpuBackend, CpuRuntime};

const D: usize = 8;
const MAX: usize = 24;

struct Stack<'g> {
    x: GraphTensor<'g>,
    weights: Vec<GraphTensor<'g>>,
    caches: Vec<GraphTensor<'g>>,
    updated: Vec<GraphTensor<'g>>,
    out: GraphTensor<'g>,
}

/// `layers` blocks over `x: [s, D]`: each writes its keys `sin(h · w)` into its cache at
/// `p..p + s`, attends over the cached rows `0..p + s`, and adds the result to `h`.
fn stack(cx: &Graph, layers: usize) -> Stack<'_> {
    let s = Expression::var("s");
    let p = Expression::var("p");
    let x = cx.input("x", ("s", D), DType::F32);
    let mut h = x;
    let (mut weights, mut caches, mut updated) = (vec![], vec![], vec![]);
    for l in 0..layers {
        let w = cx.input(&format!("w{l}"), (D,), DType::F32);
        let cache = cx.input(&format!("cache{l}"), (MAX, D), DType::F32);
        let k = (h * w.expand(0, s.clone())).sin();
        let written = cache.write_slice(0, p.clone(), k);
        let past = written.slice(0, 0, p.clone() + s.clone());
        let scores = (h.matmul(past.permute(&[1, 0])) * 0.5).softmax(1);
        h = h + scores.matmul(past) * 0.5;
        weights.push(w);
        caches.push(cache);
        updated.push(written);
    }
    Stack {
        x,
        weights,
        caches,
        updated,
        out: h.output(),
    }
}

fn ramp(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + 13 * seed) * 7919) % 97) as f32 / 50.0 - 1.0)
        .collect()
}

/// Non-input buffers of the plan for `layers` layers (inputs: x, and a weight and a cache
/// per layer).
fn working_buffers(layers: usize) -> usize {
    let cx = Graph::new();
    let _ = stack(&cx, layers);
    let rt: CpuRuntime = cx
        .compile(CpuBackend::default(), CompileOptions::default())
        .unwrap();
    rt.buffer_count() - 1 - 2 * layers
}

#[test]
fn in_place_sources_are_reused_across_layers() {
    // Before, every layer's new keys kept a buffer of their own for the whole run.
    // (The first layers may settle the plan's shape: 2, 3, then 4 buffers for 1, 2, 3
    // layers with the fused attention kernel, and 4 from then on.)
    let (four, sixteen) = (working_buffers(4), working_buffers(16));
    assert_eq!(
        four, sixteen,
        "working buffers grow with the layers: {four} for 4 layers, {sixteen} for 16"
    );
}

#[test]
fn chunked_runs_with_reused_buffers_match_reference() {
    for threads in [1, 2] {
        let layers = 4;
        let cx = Graph::new();
        let st = stack(&cx, layers);
        let mut rt = cx
            .compile(CpuBackend::with_threads(threads), CompileOptions::default())
            .unwrap();
        let mut re = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        for l in 0..layers {
            let (w, c) = (ramp(D, l), vec![0.0; MAX * D]);
            rt.set(st.weights[l], &w).unwrap();
            re.set(st.weights[l], &w).unwrap();
            rt.set(st.caches[l], &c).unwrap();
            re.set(st.caches[l], &c).unwrap();
        }
        // Prefill chunks of different lengths (the last one shorter), then decode steps.
        let mut p = 0;
        for (run, s) in [7usize, 7, 3, 1, 1, 5].into_iter().enumerate() {
            let x = ramp(s * D, 100 + run);
            for (name, v) in [("s", s), ("p", p)] {
                rt.set_dim(name, v);
                re.set_dim(name, v);
            }
            rt.set(st.x, &x).unwrap();
            re.set(st.x, &x).unwrap();
            rt.run().unwrap();
            re.run().unwrap();
            for t in std::iter::once(st.out).chain(st.updated.iter().copied()) {
                let (a, b) = (rt.get::<f32>(t).unwrap(), re.get::<f32>(t).unwrap());
                assert_eq!(a.len(), b.len());
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (x - y).abs() <= 1e-4 + 1e-4 * y.abs(),
                        "{threads} threads, run {run} (s {s}, p {p}), element {i}: {x} vs {y}"
                    );
                }
            }
            // The state keeps the rows: the next run's cache is this run's result.
            p += s;
        }
        let report = rt.memory_report();
        assert!(report.contains("working buffers"), "{report}");
    }
}
