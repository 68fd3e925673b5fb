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
