//! The generic passes: each changes the graph as claimed and keeps results and handles right.

use luminal::op::{BinaryOp, Op, UnaryOp};
use luminal::passes::{ArithmeticSimplify, ConstantFold, Cse, DeadNodeElimination, Looped, Pass};
use luminal::prelude::*;
use luminal::GraphData;

fn count(g: &GraphData, pred: impl Fn(&Op) -> bool) -> usize {
    g.node_ids().filter(|&id| pred(&g.node(id).op)).count()
}

fn optimised(cx: &Graph) -> GraphData {
    let mut g = cx.snapshot();
    Looped((ConstantFold, ArithmeticSimplify, Cse, DeadNodeElimination)).run(&mut g);
    g
}

fn run(
    cx: &Graph,
    opts: CompileOptions,
    inputs: &[(GraphTensor, Vec<f32>)],
    out: GraphTensor,
) -> Vec<f32> {
    let mut rt = cx.compile(ReferenceBackend, opts).unwrap();
    for (t, v) in inputs {
        rt.set(*t, v).unwrap();
    }
    rt.run().unwrap();
    rt.get(out).unwrap()
}

#[test]
fn cse_merges_structurally_equal_nodes() {
    let cx = Graph::new();
    let a = cx.tensor("a", 4);
    let x = a.exp2() + a.exp2(); // two separate Exp2 nodes, same structure
    let y = (x * a.exp2()).output();
    let mut g = cx.snapshot();
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Exp2)), 3);
    assert!(Cse.run(&mut g));
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Exp2)), 1);
    // Views on edges are part of the structure: a permuted read is not merged.
    let cx2 = Graph::new();
    let m = cx2.tensor("m", (2, 2));
    let _ = (m.sqrt() + m.permute(&[1, 0]).sqrt()).output();
    let mut g2 = cx2.snapshot();
    Cse.run(&mut g2);
    assert_eq!(count(&g2, |o| *o == Op::Unary(UnaryOp::Sqrt)), 2);
    let data = vec![0.0, 1.0, 2.0, 3.0];
    let want: Vec<f32> = data
        .iter()
        .map(|v: &f32| 2.0 * v.exp2() * v.exp2())
        .collect();
    assert_eq!(run(&cx, CompileOptions::default(), &[(a, data)], y), want);
}

/// Merged duplicates that are outputs, or that user handles name, leave those pointing at
/// the node kept (`GraphData::replace_nodes`, one pass for all of them).
#[test]
fn cse_keeps_outputs_and_handles_of_merged_nodes() {
    let cx = Graph::new();
    let a = cx.tensor("a", 3);
    let p = a.exp2().output();
    let q = a.exp2().output();
    let r = (a.exp2() * 2.0).output();
    let mut g = cx.snapshot();
    assert!(Cse.run(&mut g));
    assert_eq!(count(&g, |o| *o == Op::Unary(UnaryOp::Exp2)), 1);
    assert_eq!(
        g.outputs.len(),
        2,
        "p and q are one output now, r the other"
    );
    for id in &g.outputs {
        assert!(
            g.node_ids().any(|n| n == *id),
            "output {id:?} is a live node"
        );
    }
    let data = vec![0.5f32, 1.0, -2.0];
    let mut rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(a, &data).unwrap();
    rt.run().unwrap();
    let want: Vec<f32> = data.iter().map(|v| v.exp2()).collect();
    assert_eq!(rt.get::<f32>(p).unwrap(), want);
    assert_eq!(rt.get::<f32>(q).unwrap(), want);
    let want2: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
    assert_eq!(rt.get::<f32>(r).unwrap(), want2);
}

#[test]
fn dead_nodes_are_removed_but_inputs_kept() {
    let cx = Graph::new();
    let a = cx.tensor("a", 3);
    let unused = cx.tensor("unused", 3);
    let _dead = (a.sin() + unused).sqrt();
    let _ = a.exp2().output();
    let mut g = cx.snapshot();
    assert!(DeadNodeElimination.run(&mut g));
    assert_eq!(
        count(&g, |o| matches!(o, Op::Unary(UnaryOp::Sin | UnaryOp::Sqrt))),
        0
    );
    assert_eq!(count(&g, |o| matches!(o, Op::Input { .. })), 2);
    assert!(!DeadNodeElimination.run(&mut g), "second run finds nothing");
}

#[test]
fn arithmetic_identities_are_removed() {
    let cx = Graph::new();
    let a = cx.tensor("a", 3);
    let x = ((a + 0.0) * 1.0).recip().recip().exp2().log2();
    let y = (-(-x)).output();
    let g = optimised(&cx);
    // Only the input remains: the output handle now points at it.
    assert_eq!(g.node_ids().count(), 1, "{}", luminal::display::to_dot(&g));
    assert_eq!(
        run(
            &cx,
            CompileOptions::default(),
            &[(a, vec![1.5, -2.0, 0.25])],
            y
        ),
        vec![1.5, -2.0, 0.25]
    );
}

#[test]
fn exp2_log2_cancels_only_for_non_negative_inputs() {
    let cx = Graph::new();
    let a = cx.tensor("a", 2);
    let _ = a.log2().exp2().output(); // a may be negative: must stay
    let g = optimised(&cx);
    assert_eq!(count(&g, |o| matches!(o, Op::Unary(_))), 2);
    let cx = Graph::new();
    let a = cx.tensor("a", 2);
    let _ = a.sqrt().log2().exp2().output(); // sqrt(a) >= 0 or NaN: cancels
    let g = optimised(&cx);
    assert_eq!(count(&g, |o| matches!(o, Op::Unary(_))), 1);
}

#[test]
fn multiply_by_zero_becomes_a_constant() {
    let cx = Graph::new();
    let a = cx.tensor("a", 3);
    let y = (a.sin() * 0.0 + 2.0).output();
    let g = optimised(&cx);
    assert_eq!(count(&g, |o| matches!(o, Op::Unary(_) | Op::Binary(_))), 0);
    assert_eq!(
        run(
            &cx,
            CompileOptions::default(),
            &[(a, vec![1.0, 2.0, 3.0])],
            y
        ),
        vec![2.0; 3]
    );
}

#[test]
fn constants_fold_including_reductions() {
    let cx = Graph::new();
    let c = (cx.full((2, 5), 3.0).sum(1) * 2.0).sqrt(); // sqrt(15 * 2)
    let y = c.output();
    let mut g = cx.snapshot();
    Looped(ConstantFold).run(&mut g);
    DeadNodeElimination.run(&mut g);
    assert_eq!(count(&g, |o| !matches!(o, Op::Constant { .. })), 0);
    let got = run(&cx, CompileOptions::default(), &[], y);
    assert_eq!(got, vec![(30.0f64).sqrt() as f32; 2]);
    // Without passes the same values come out of the full computation.
    assert_eq!(
        run(
            &cx,
            CompileOptions {
                optimize: false,
                ..CompileOptions::default()
            },
            &[],
            y
        ),
        got
    );
}

#[test]
fn padded_constant_is_not_folded_as_uniform() {
    let cx = Graph::new();
    let a = cx.tensor("a", 4);
    let ones = cx.ones(2).pad_axis(0, 1, 1); // [0, 1, 1, 0]
    let y = (a * ones).output();
    let g = optimised(&cx);
    assert_eq!(count(&g, |o| *o == Op::Binary(BinaryOp::Mul)), 1);
    assert_eq!(
        run(
            &cx,
            CompileOptions::default(),
            &[(a, vec![5.0, 6.0, 7.0, 8.0])],
            y
        ),
        vec![0.0, 6.0, 7.0, 0.0]
    );
}

#[test]
fn handles_stay_valid_and_results_match_unoptimised() {
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 4));
    let w = cx.tensor("w", (4, 2));
    let h = x.matmul(w);
    let out1 = (h.relu() + h.relu() * 1.0).output();
    let out2 = h.softmax(-1).output();
    let xs: Vec<f32> = (0..12).map(|i| i as f32 * 0.3 - 1.5).collect();
    let ws: Vec<f32> = (0..8).map(|i| 0.7 - i as f32 * 0.2).collect();
    for opts in [
        CompileOptions::default(),
        CompileOptions {
            optimize: false,
            ..CompileOptions::default()
        },
    ] {
        let mut rt = cx.compile(ReferenceBackend, opts).unwrap();
        rt.set(x, &xs).unwrap();
        rt.set(w, &ws).unwrap();
        rt.run().unwrap();
        let o1: Vec<f32> = rt.get(out1).unwrap();
        let o2: Vec<f32> = rt.get(out2).unwrap();
        // Hand-computed: h = x @ w.
        for r in 0..3 {
            let h: Vec<f32> = (0..2)
                .map(|c| (0..4).map(|k| xs[r * 4 + k] * ws[k * 2 + c]).sum())
                .collect();
            for c in 0..2 {
                assert!((o1[r * 2 + c] - 2.0 * h[c].max(0.0)).abs() < 1e-5);
                let m = h[0].max(h[1]);
                let s = (h[c] - m).exp() / ((h[0] - m).exp() + (h[1] - m).exp());
                assert!((o2[r * 2 + c] - s).abs() < 1e-6);
            }
        }
    }
}

#[test]
fn dot_shows_ops_shapes_and_dtypes() {
    let cx = Graph::new();
    let a = cx.tensor("a", (2, "seq"));
    let _ = a.permute(&[1, 0]).exp2().output();
    let dot = cx.to_dot();
    assert!(dot.starts_with("digraph"));
    assert!(dot.contains("Input(a)\\n[2, seq] f32"), "{dot}");
    assert!(dot.contains("Exp2\\n[seq, 2] f32"), "{dot}");
    assert!(
        dot.contains("strides"),
        "permuted edge shows its view: {dot}"
    );
    assert!(dot.contains("peripheries=2"));
    let rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    assert!(luminal::display::to_dot(rt.graph()).contains("Exp2"));
}
