//! State updated in place across runs (`write_slice`, the KV-cache primitive): the same
//! checks for every backend. Expected values are built element by element from the inputs.

use crate::backend::{Backend, CompileOptions, Runtime};
use crate::error::LuminalError;
use crate::graph::Graph;
use crate::shape::Expression;
/// A `[2, 5, 3]` cache written at `p` along axis 1, over three runs (prefill of 2 rows, then
/// one row at a time), read back whole and through a `0..p+s` slice reduction.
pub fn check_write_slice<B: Backend>(backend: B) {
    let cx = Graph::new();
    let cache = cx.tensor("cache", (2, 5, 3));
    let new = cx.tensor("new", (2, "s", 3));
    let updated = cache.write_slice(1, "p", new * 10.0);
    let seen = updated
        .slice(1, 0, Expression::var("p") + Expression::var("s"))
        .sum(1)
        .output();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    let mut want = [0f32; 30];
    rt.set(cache, &want).unwrap();
    let steps: [(usize, usize); 3] = [(0, 2), (2, 1), (3, 1)];
    for (step, &(p, s)) in steps.iter().enumerate() {
        let src: Vec<f32> = (0..2 * s * 3).map(|i| (step * 100 + i) as f32).collect();
        rt.set_dim("p", p);
        rt.set_dim("s", s);
        rt.set(new, &src).unwrap();
        rt.run().unwrap();
        for h in 0..2 {
            for r in 0..s {
                for c in 0..3 {
                    want[(h * 5 + p + r) * 3 + c] = src[(h * s + r) * 3 + c] * 10.0;
                }
            }
        }
        assert_eq!(rt.get::<f32>(updated).unwrap(), want, "step {step}: result");
        assert_eq!(
            rt.get::<f32>(cache).unwrap(),
            want,
            "step {step}: state kept"
        );
        let mut sums = vec![0f32; 6];
        for h in 0..2 {
            for r in 0..p + s {
                for c in 0..3 {
                    sums[h * 3 + c] += want[(h * 5 + r) * 3 + c];
                }
            }
        }
        assert_eq!(
            rt.get::<f32>(seen).unwrap(),
            sums,
            "step {step}: slice read"
        );
    }
    // Writing past the end is a typed error, not a panic.
    rt.set_dim("p", 4);
    rt.set_dim("s", 2);
    rt.set(new, &[1.0; 12]).unwrap();
    match rt.run() {
        Err(LuminalError::IndexOutOfRange { .. }) => {}
        other => panic!("write past the end: expected IndexOutOfRange, got {other:?}"),
    }
}

/// An in-place update whose state input has other readers (an optimizer step:
/// `y = sum(w * x)` reads the weight, then `w ← w - 0.5 * x` writes it): every reader sees
/// the value from before the run, whatever order the graph was built in, and the state
/// keeps the update across runs.
pub fn check_state_update<B: Backend + Clone>(backend: B) {
    for write_first in [false, true] {
        let cx = Graph::new();
        let w = cx.tensor("w", 4);
        let x = cx.tensor("x", 4);
        let (updated, y) = if write_first {
            let u = w.write_slice(0, 0, w - x * 0.5);
            (u, (w * x).sum(0).output())
        } else {
            let y = (w * x).sum(0).output();
            (w.write_slice(0, 0, w - x * 0.5), y)
        };
        let doubled = (updated * 2.0).output();
        let mut rt = cx
            .compile(backend.clone(), CompileOptions::default())
            .unwrap();
        let mut want_w = [1.0f32, -2.0, 3.0, 0.5];
        rt.set(w, &want_w).unwrap();
        for step in 0..3 {
            let xs: Vec<f32> = (0..4).map(|i| (step * 4 + i) as f32 - 3.0).collect();
            rt.set(x, &xs).unwrap();
            rt.run().unwrap();
            let want_y: f32 = want_w.iter().zip(&xs).map(|(a, b)| a * b).sum();
            for (v, d) in want_w.iter_mut().zip(&xs) {
                *v -= d * 0.5;
            }
            let case = format!("write built first: {write_first}, step {step}");
            assert_eq!(
                rt.get::<f32>(y).unwrap(),
                vec![want_y],
                "{case}: old value read"
            );
            assert_eq!(rt.get::<f32>(updated).unwrap(), want_w, "{case}: update");
            assert_eq!(rt.get::<f32>(w).unwrap(), want_w, "{case}: state kept");
            let twice: Vec<f32> = want_w.iter().map(|v| v * 2.0).collect();
            assert_eq!(
                rt.get::<f32>(doubled).unwrap(),
                twice,
                "{case}: new value read"
            );
        }
    }
}
