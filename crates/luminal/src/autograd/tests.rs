//! Gradients against central finite differences on the reference runtime (which computes
//! each node in f64 and rounds to f32). PyTorch comparisons of the same rules, on every
//! backend, live in `crates/luminal_training/tests/`.

use super::*;
use crate::prelude::*;

/// Deterministic values in `[lo, hi)`.
fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * u
        })
        .collect()
}

/// Builds `loss(params)` with `build`, checks every gradient element against
/// `(L(p + eps) - L(p - eps)) / 2eps`.
fn check<F>(shapes: &[Vec<usize>], range: (f32, f32), build: F)
where
    F: for<'g> Fn(&'g Graph, &[GraphTensor<'g>]) -> GraphTensor<'g>,
{
    let data: Vec<Vec<f32>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| values(s.iter().product(), 7 + i as u64, range.0, range.1))
        .collect();
    let cx = Graph::new();
    let params: Vec<GraphTensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| cx.tensor(&format!("p{i}"), s.clone()))
        .collect();
    let loss = build(&cx, &params);
    let grads: Vec<GraphTensor> = gradients(&params, loss)
        .into_iter()
        .map(|g| g.output())
        .collect();
    let loss = loss.output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let eval = |rt: &mut ReferenceRuntime, vals: &[Vec<f32>]| -> f64 {
        for (p, v) in params.iter().zip(vals) {
            rt.set(*p, v).unwrap();
        }
        rt.run().unwrap();
        rt.get::<f32>(loss).unwrap()[0] as f64
    };
    eval(&mut rt, &data);
    let analytic: Vec<Vec<f32>> = grads.iter().map(|g| rt.get::<f32>(*g).unwrap()).collect();
    let eps = 1e-2f32;
    for (pi, d) in data.iter().enumerate() {
        for e in 0..d.len() {
            let mut plus = data.clone();
            plus[pi][e] += eps;
            let mut minus = data.clone();
            minus[pi][e] -= eps;
            let fd = (eval(&mut rt, &plus) - eval(&mut rt, &minus)) / (2.0 * eps as f64);
            let a = analytic[pi][e] as f64;
            assert!(
                (a - fd).abs() <= 2e-2 * fd.abs().max(1.0),
                "param {pi} element {e}: autograd {a}, finite difference {fd}"
            );
        }
    }
}

/// `sum(t * w)` with a fixed, varied weighting `w = 0.7 sin(i + seed) + 0.5`, so that every
/// output element matters differently.
fn weighted<'g>(t: GraphTensor<'g>, seed: u64) -> GraphTensor<'g> {
    let w = (t.graph.arange(t.n_elements()) + seed as f32).sin() * 0.7 + 0.5;
    let axes: Vec<i64> = (0..t.rank() as i64).collect();
    (t * w.reshape(t.shape())).sum(axes)
}

#[test]
fn unary_primops() {
    check(&[vec![2, 3]], (0.5, 2.0), |_, p| {
        let x = p[0];
        weighted(x.log2(), 1)
            + weighted(x.exp2(), 2)
            + weighted(x.sin(), 3)
            + weighted(x.sqrt(), 4)
            + weighted(x.recip(), 5)
    });
}

#[test]
fn binary_broadcast_and_fan_out() {
    check(&[vec![2, 3], vec![3]], (-1.0, 1.0), |_, p| {
        let (a, b) = (p[0], p[1]);
        weighted(a * b + a * a - b, 1)
    });
}

#[test]
fn reductions() {
    check(&[vec![3, 4]], (-1.0, 1.0), |_, p| {
        let x = p[0];
        weighted(x.max(1), 1) + weighted(x.sum(0), 2) + weighted(x.mean(1), 3)
    });
}

#[test]
fn matmul_2d_and_batched() {
    check(
        &[vec![3, 4], vec![4, 2], vec![2, 3, 4]],
        (-1.0, 1.0),
        |_, p| weighted(p[0].matmul(p[1]), 1) + weighted(p[2].matmul(p[1]), 2),
    );
}

#[test]
fn views_permute_slice_pad_expand_reshape() {
    check(&[vec![4, 6]], (-1.0, 1.0), |_, p| {
        let x = p[0];
        let a = x.slice(1, 1, 5).permute(&[1, 0]); // [4, 4] strided
        let b = x.pad_axis(0, 1, 2).slice(0, 0, 5); // padded, then sliced
        let c = x.reshape([2, 12]).slice(1, 3, 9).expand(0, 3); // broadcast
        let d = x.slice(0, 1, 3).slice(1, 2, 6).reshape([8]); // needs a copy
        weighted(a, 1) + weighted(b, 2) + weighted(c, 3) + weighted(d, 4)
    });
}

#[test]
fn slice_from_the_start_is_a_prefix_of_the_buffer() {
    // x[0:2] (and a padded row sliced away) read a prefix of x: a contiguous view with fewer
    // elements than the buffer (found by the random-view property test).
    check(&[vec![3, 4, 2]], (-1.0, 1.0), |_, p| {
        let x = p[0];
        weighted(x.slice(0, 0, 2), 1) + weighted(x.pad_axis(0, 1, 0).slice(0, 0, 2), 2)
    });
}

#[test]
fn overlapping_unfold_windows() {
    check(&[vec![2, 7]], (-1.0, 1.0), |_, p| {
        weighted(p[0].unfold(1, 3, 2), 1) + weighted(p[0].unfold(1, 4, 1), 2)
    });
}

#[test]
fn composites_softmax_layer_norm() {
    check(&[vec![2, 5]], (-1.0, 1.0), |_, p| {
        let x = p[0];
        weighted(x.softmax(1), 1)
            + weighted(x.log_softmax(1), 2)
            + weighted(x.layer_norm(1, 1e-5), 3)
    });
}

#[test]
fn gather_scatter_adds_repeated_rows() {
    let cx = Graph::new();
    let table = cx.tensor("table", (4, 3));
    let ids = cx.input("ids", 5, DType::I32);
    let w = cx.tensor("w", (5, 3));
    let loss = (table.embedding(ids) * w).sum([0, 1]);
    let g = gradients(&[table], loss)[0].output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let wv = values(15, 3, -1.0, 1.0);
    rt.set(table, &values(12, 1, -1.0, 1.0)).unwrap();
    rt.set(ids, &[2i32, 0, 2, 3, 2]).unwrap();
    rt.set(w, &wv).unwrap();
    rt.run().unwrap();
    let got = rt.get::<f32>(g).unwrap();
    // d loss / d table[r, c] = sum of w[s, c] over positions s with ids[s] == r.
    let ids = [2usize, 0, 2, 3, 2];
    for r in 0..4 {
        for c in 0..3 {
            let want: f32 = (0..5).filter(|&s| ids[s] == r).map(|s| wv[s * 3 + c]).sum();
            assert!((got[r * 3 + c] - want).abs() < 1e-6, "row {r} col {c}");
        }
    }
}

#[test]
fn gradient_of_gradient() {
    // f = sum(x^3 * w): df/dx = 3x^2 w; d/dx sum(df/dx) = 6 x w.
    let cx = Graph::new();
    let x = cx.tensor("x", 4);
    let w = cx.tensor("w", 4);
    let f = (x * x * x * w).sum(0);
    let g = gradients(&[x], f)[0];
    let gg = gradients(&[x], g.sum(0))[0].output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let (xv, wv) = ([0.5f32, -1.0, 2.0, 0.0], [1.0f32, 2.0, -0.5, 3.0]);
    rt.set(x, &xv).unwrap();
    rt.set(w, &wv).unwrap();
    rt.run().unwrap();
    let got = rt.get::<f32>(gg).unwrap();
    for i in 0..4 {
        assert!((got[i] - 6.0 * xv[i] * wv[i]).abs() < 1e-5);
    }
}

#[test]
fn non_differentiable_ops_give_no_gradient() {
    let cx = Graph::new();
    let x = cx.tensor("x", 3);
    let mask = x.lt(0.5).cast(DType::F32); // comparison: no gradient
    let m = x % 0.7; // mod: no gradient
    let loss = (mask + m).sum(0) + x.sum(0) * 0.0;
    let g = gradients(&[x], loss)[0].output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(x, &[0.1f32, 0.9, 2.0]).unwrap();
    rt.run().unwrap();
    assert_eq!(rt.get::<f32>(g).unwrap(), vec![0.0; 3]);
}

#[test]
fn detached_values_pass_no_gradient() {
    // d/dx sum(x · detach(x)²) = detach(x)² = x², not 3x²; the detached copy disappears
    // when the graph is compiled (softmax uses one for the max it subtracts).
    let cx = Graph::new();
    let x = cx.tensor("x", 3);
    let d = x.detach();
    let loss = (x * d * d).sum(0);
    let g = gradients(&[x], loss)[0].output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let xv = [0.5f32, -2.0, 3.0];
    rt.set(x, &xv).unwrap();
    rt.run().unwrap();
    let want: Vec<f32> = xv.iter().map(|v| v * v).collect();
    assert_eq!(rt.get::<f32>(g).unwrap(), want);
    assert!(
        !rt.graph()
            .node_ids()
            .any(|id| rt.graph().node(id).op == crate::op::Op::Contiguous),
        "the detached copy was not removed"
    );
}

#[test]
fn unused_parameter_gets_zeros() {
    let cx = Graph::new();
    let x = cx.tensor("x", 2);
    let y = cx.tensor("y", (2, 2));
    let grads = Autograd::new(&[x, y], (x * x).sum(0));
    let gy = grads.grad(y).output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(x, &[1f32, 2.]).unwrap();
    rt.set(y, &[1f32; 4]).unwrap();
    rt.run().unwrap();
    assert_eq!(rt.get::<f32>(gy).unwrap(), vec![0.0; 4]);
}

#[test]
#[should_panic(expected = "the loss must have one element")]
fn non_scalar_loss_panics() {
    let cx = Graph::new();
    let x = cx.tensor("x", 2);
    Autograd::new(&[x], x * 2.0);
}

#[test]
fn write_slice_and_cast_gradients() {
    // loss = sum(write_slice(dest, rows 1..3, src) * w) + sum(x.cast(f16).cast(f32) * v):
    // d/dsrc = w[1..3], d/ddest = w with rows 1..3 zeroed, d/dx = v (a float cast passes the
    // gradient through unchanged).
    let cx = Graph::new();
    let dest = cx.tensor("dest", (4, 2));
    let src = cx.tensor("src", (2, 2));
    let w = cx.tensor("w", (4, 2));
    let x = cx.tensor("x", 3);
    let v = cx.tensor("v", 3);
    let written = dest.write_slice(0, 1usize, src);
    let loss = (written * w).sum([0, 1]) + (x.cast(DType::F16).cast(DType::F32) * v).sum(0);
    let g = gradients(&[dest, src, x], loss);
    let g: Vec<GraphTensor> = g.into_iter().map(|t| t.output()).collect();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let wv: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
    rt.set(dest, &[0f32; 8]).unwrap();
    rt.set(src, &[1f32; 4]).unwrap();
    rt.set(w, &wv).unwrap();
    rt.set(x, &[0.5f32, 1.5, -2.0]).unwrap();
    rt.set(v, &[3f32, -1., 0.25]).unwrap();
    rt.run().unwrap();
    assert_eq!(
        rt.get::<f32>(g[0]).unwrap(),
        vec![1., 2., 0., 0., 0., 0., 7., 8.]
    );
    assert_eq!(rt.get::<f32>(g[1]).unwrap(), vec![3., 4., 5., 6.]);
    assert_eq!(rt.get::<f32>(g[2]).unwrap(), vec![3., -1., 0.25]);
}

#[test]
fn select_gradient_is_elementwise_not_a_one_hot_product() {
    // where(m > 0, x, 2x) on 128x128: d/dx = w where m > 0, 2w elsewhere. The general gather
    // gradient would build a [2·16384, 16384] one-hot; the select rule stays O(n).
    let cx = Graph::new();
    let x = cx.tensor("x", (128, 128));
    let m = cx.tensor("m", (128, 128));
    let w = cx.tensor("w", (128, 128));
    let loss = (m.gt(0.0).select(x, x * 2.0) * w).sum([0, 1]);
    let g = gradients(&[x], loss)[0].output();
    let biggest = cx
        .snapshot()
        .nodes
        .iter()
        .flatten()
        .map(|n| {
            n.shape
                .iter()
                .map(|d| d.as_constant().unwrap())
                .product::<i64>()
        })
        .max()
        .unwrap();
    assert!(biggest <= 2 * 128 * 128, "a node of {biggest} elements");
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mv = values(128 * 128, 5, -1.0, 1.0);
    let wv = values(128 * 128, 6, -1.0, 1.0);
    rt.set(x, &values(128 * 128, 4, -1.0, 1.0)).unwrap();
    rt.set(m, &mv).unwrap();
    rt.set(w, &wv).unwrap();
    rt.run().unwrap();
    let got = rt.get::<f32>(g).unwrap();
    for i in 0..128 * 128 {
        let want = if mv[i] > 0.0 { wv[i] } else { 2.0 * wv[i] };
        assert_eq!(got[i], want, "element {i}");
    }
}

mod random_views {
    //! Random chains of views (permute, slice, pad, expand, flatten, unfold, transpose) on a
    //! small tensor. `L(x) = sum(view(x) · w)` is linear, so its gradient is `L` at each basis
    //! vector: `grad[i] = L(e_i)`, computed by running the forward only (no autograd), with
    //! integer weights so that every value is exact.
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum ViewOp {
        Permute(u64),
        Slice(usize, u64, u64),
        Pad(usize, usize, usize),
        Expand(usize, usize),
        Flatten(usize),
        Unfold(usize, usize, usize),
    }

    fn view_op() -> impl Strategy<Value = ViewOp> {
        prop_oneof![
            any::<u64>().prop_map(ViewOp::Permute),
            (0..4usize, any::<u64>(), any::<u64>()).prop_map(|(a, s, e)| ViewOp::Slice(a, s, e)),
            (0..4usize, 0..3usize, 0..3usize).prop_map(|(a, b, c)| ViewOp::Pad(a, b, c)),
            (0..4usize, 2..4usize).prop_map(|(a, n)| ViewOp::Expand(a, n)),
            (0..4usize).prop_map(ViewOp::Flatten),
            (0..4usize, 1..4usize, 1..3usize).prop_map(|(a, k, s)| ViewOp::Unfold(a, k, s)),
        ]
    }

    fn apply<'g>(t: GraphTensor<'g>, op: &ViewOp) -> GraphTensor<'g> {
        let dims: Vec<usize> = t
            .shape()
            .iter()
            .map(|d| d.as_constant().unwrap() as usize)
            .collect();
        let r = dims.len();
        let n: usize = dims.iter().product();
        if n > 400 || r == 0 {
            return t;
        }
        match *op {
            ViewOp::Permute(seed) => {
                let mut axes: Vec<usize> = (0..r).collect();
                let mut s = seed;
                for i in (1..r).rev() {
                    axes.swap(i, (s % (i as u64 + 1)) as usize);
                    s /= 7;
                }
                t.permute(&axes)
            }
            ViewOp::Slice(a, s, e) => {
                let a = a % r;
                let d = dims[a] as u64;
                let start = s % d;
                let end = start + 1 + e % (d - start);
                t.slice(a as i64, start as i64, end as i64)
            }
            ViewOp::Pad(a, b, c) => t.pad_axis(a % r, b, c),
            ViewOp::Expand(a, n) if r < 5 => t.expand((a % (r + 1)) as i64, n),
            ViewOp::Flatten(a) if r >= 2 => {
                let a = a % (r - 1);
                t.flatten(a as i64, a as i64 + 1)
            }
            ViewOp::Unfold(a, k, s) if r < 5 => {
                let a = a % r;
                if k <= dims[a] {
                    t.unfold(a as i64, k, s)
                } else {
                    t
                }
            }
            _ => t,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn view_gradients_are_exact(ops in proptest::collection::vec(view_op(), 1..5)) {
            let cx = Graph::new();
            let x = cx.tensor("x", (3, 4, 2));
            let v = ops.iter().fold(x, |t, op| apply(t, op));
            // Integer weights -3..=3 of the view's shape.
            let w = ((cx.arange(v.n_elements()) * 5.0 + 1.0) % 7.0) - 3.0;
            let axes: Vec<i64> = (0..v.rank() as i64).collect();
            let loss = if axes.is_empty() {
                v * w.reshape(v.shape())
            } else {
                (v * w.reshape(v.shape())).sum(axes)
            };
            let g = gradients(&[x], loss)[0].output();
            let loss = loss.output();
            let mut rt = cx.compile(ReferenceBackend, CompileOptions::default()).unwrap();
            let mut basis = vec![0f32; 24];
            rt.set(x, &basis).unwrap();
            rt.run().unwrap();
            let got = rt.get::<f32>(g).unwrap();
            for i in 0..24 {
                basis[i] = 1.0;
                rt.set(x, &basis).unwrap();
                rt.run().unwrap();
                let want = rt.get::<f32>(loss).unwrap()[0];
                basis[i] = 0.0;
                prop_assert_eq!(got[i], want, "element {} after {:?}", i, ops);
            }
        }
    }
}

#[test]
fn dynamic_batch_dimension() {
    // loss = sum((x·w + b)²) over a batch bound at run time; d/dw = 2 xᵀ(xw + b), d/db =
    // 2 Σ_rows (xw + b), checked on two batch sizes with the same compiled graph.
    let cx = Graph::new();
    let x = cx.tensor("x", ("batch", 3));
    let w = cx.tensor("w", (3, 2));
    let b = cx.tensor("b", 2);
    let y = x.matmul(w) + b;
    let loss = (y * y).sum([0, 1]);
    let g = gradients(&[w, b], loss);
    let (gw, gb) = (g[0].output(), g[1].output());
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let wv = [0.5f32, -1.0, 2.0, 0.25, -0.5, 1.5];
    let bv = [0.1f32, -0.2];
    rt.set(w, &wv).unwrap();
    rt.set(b, &bv).unwrap();
    for n in [2usize, 5] {
        let xv = values(n * 3, n as u64, -1.0, 1.0);
        rt.set_dim("batch", n);
        rt.set(x, &xv).unwrap();
        rt.run().unwrap();
        let (mut want_w, mut want_b) = ([0f64; 6], [0f64; 2]);
        for r in 0..n {
            for c in 0..2 {
                let yv: f64 = (0..3)
                    .map(|k| xv[r * 3 + k] as f64 * wv[k * 2 + c] as f64)
                    .sum::<f64>()
                    + bv[c] as f64;
                want_b[c] += 2.0 * yv;
                for k in 0..3 {
                    want_w[k * 2 + c] += 2.0 * xv[r * 3 + k] as f64 * yv;
                }
            }
        }
        let (got_w, got_b) = (rt.get::<f32>(gw).unwrap(), rt.get::<f32>(gb).unwrap());
        for i in 0..6 {
            assert!(
                (got_w[i] as f64 - want_w[i]).abs() < 1e-5,
                "batch {n} dw[{i}]"
            );
        }
        for i in 0..2 {
            assert!(
                (got_b[i] as f64 - want_b[i]).abs() < 1e-5,
                "batch {n} db[{i}]"
            );
        }
    }
}

/// `softmax(q·kᵀ·scale + mask)·v` as `luminal_nn::causal_attention` builds it, q, k, v
/// read from one `[b, s, 3, h, d]` tensor (a fused projection's layout).
fn causal_attention_of<'g>(qkv: GraphTensor<'g>, masked: bool) -> GraphTensor<'g> {
    let (s, d) = (
        qkv.shape()[1].clone(),
        qkv.shape()[4].as_constant().unwrap(),
    );
    let head = |i: i64| qkv.slice(2, i, i + 1).squeeze(2).permute(&[0, 2, 1, 3]);
    let (q, k, v) = (head(0), head(1), head(2));
    let scores = q.matmul(k.transpose(-1, -2)) * (1.0 / (d as f32).sqrt());
    let x = if masked {
        let cx = qkv.graph;
        let rows = cx.arange(s.clone()).expand(1, s.clone());
        let cols = cx.arange(s.clone()).expand(0, s.clone());
        let mask = cols.gt(rows).cast(DType::F32) * -1e30;
        scores + mask.unsqueeze(0).unsqueeze(0).expand_to(scores.shape())
    } else {
        scores
    };
    x.softmax(-1).matmul(v)
}

#[test]
fn attention_gradient_in_one_piece_matches_finite_differences() {
    for masked in [true, false] {
        check(&[vec![2, 5, 3, 2, 3]], (-1.0, 1.0), |_, p| {
            weighted(causal_attention_of(p[0], masked), 4)
        });
    }
}

#[test]
fn attention_gradient_in_one_piece_equals_rule_by_rule() {
    let data = values(2 * 6 * 3 * 2 * 4, 11, -1.5, 1.5);
    let run = |one_piece: bool| -> (Vec<f32>, usize) {
        set_attention_grads(Some(one_piece));
        let cx = Graph::new();
        let qkv = cx.tensor("qkv", (2, 6, 3, 2, 4));
        let loss = weighted(causal_attention_of(qkv, true), 5);
        let g = gradients(&[qkv], loss)[0].output();
        set_attention_grads(None);
        let snap = cx.snapshot();
        let hints = snap
            .attention_grads
            .keys()
            .filter(|&&id| crate::patterns::AttentionGrad::find(&snap, id).is_some())
            .count();
        let mut rt = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        rt.set(qkv, &data).unwrap();
        rt.run().unwrap();
        (rt.get::<f32>(g).unwrap(), hints)
    };
    let ((fused, hints), (rules, none)) = (run(true), run(false));
    assert_eq!(
        (hints, none),
        (1, 0),
        "one checked hint with the one-piece gradient only"
    );
    for (i, (a, b)) in fused.iter().zip(&rules).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1.0),
            "element {i}: {a} vs {b}"
        );
    }
}

/// A recognised `gelu_tanh` is differentiated as `dy · x.gelu_tanh_grad()` (one expression,
/// see `patterns::GeluMatch`): the gradient is right (through a permuted view too, and
/// over the range where the exponential saturates), and the graph holds that expression of
/// the right tensor.
#[test]
fn gelu_tanh_gradient_in_one_expression() {
    check(&[vec![4, 6]], (-5.0, 5.0), |_, p| {
        weighted(p[0].gelu_tanh(), 1) + weighted(p[0].permute(&[1, 0]).gelu_tanh() * 1.5, 2)
    });
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 5));
    let loss = weighted(x.gelu_tanh(), 1);
    let _ = gradients(&[x], loss);
    let d = cx.snapshot();
    let found: Vec<_> = d
        .node_ids()
        .filter_map(|id| crate::patterns::GeluMatch::find(&d, id))
        .map(|m| (m.f, m.x.node))
        .collect();
    assert!(
        found.contains(&(crate::patterns::GeluFn::Tanh, x.node()))
            && found.contains(&(crate::patterns::GeluFn::TanhGrad, x.node())),
        "{found:?}"
    );
}

/// `gelu_tanh_grad` against the derivative of the tanh form, in f64.
#[test]
fn gelu_tanh_grad_values() {
    let xs: Vec<f32> = values(64, 3, -9.0, 9.0);
    let cx = Graph::new();
    let x = cx.tensor("x", 64);
    let d = x.gelu_tanh_grad().output();
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(x, &xs).unwrap();
    rt.run().unwrap();
    let got = rt.get::<f32>(d).unwrap();
    let c = (2.0 / std::f64::consts::PI).sqrt();
    for (&x, &g) in xs.iter().zip(&got) {
        let x = x as f64;
        let u = c * (x + 0.044715 * x * x * x);
        let t = u.tanh();
        let want = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
        assert!(
            (g as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
            "x = {x}: {g} vs {want}"
        );
    }
}

/// A recognised layer norm is differentiated as `x.layer_norm_grad(x̂, dy, eps)` (one
/// expression reading x, the norm's output and dy, hinted for backends): the gradient is
/// right (also through a permuted input and an affine), and nothing outside the forward
/// reads the forward's intermediates (mean, centered values, variance), so it can run as
/// one kernel.
#[test]
fn layer_norm_gradient_in_one_expression() {
    check(&[vec![3, 7], vec![7]], (-2.0, 2.0), |_, p| {
        let (x, w) = (p[0], p[1]);
        weighted(x.layer_norm(-1, 1e-5) * w.expand_to((3, 7)), 1)
            + weighted(x.permute(&[1, 0]).layer_norm(-1, 1e-3), 2)
    });
    let cx = Graph::new();
    let x = cx.tensor("x", (4, 6));
    let y = x.layer_norm(-1, 1e-5);
    let loss = weighted(y, 1);
    let d0 = cx.snapshot();
    let m = crate::patterns::LayerNormMatch::find(&d0, y.node()).expect("the norm is recognised");
    assert_eq!((m.x.node, m.eps), (x.node(), 1e-5));
    let dx = gradients(&[x], loss)[0];
    let d = cx.snapshot();
    let hint = d
        .layer_norm_grads
        .values()
        .next()
        .expect("a layer-norm gradient hint");
    assert_eq!((hint.x.node, hint.xhat.node), (x.node(), y.node()));
    assert!(crate::patterns::LayerNormGrad::find(&d, dx.node()).is_some());
    let inner: std::collections::HashSet<_> = m.inner.iter().copied().collect();
    for id in d.node_ids() {
        for e in &d.node(id).inputs {
            if inner.contains(&e.node) {
                assert!(
                    inner.contains(&id) || id == y.node(),
                    "node {id:?} outside the forward norm reads its intermediate {:?}",
                    e.node
                );
            }
        }
    }
}
