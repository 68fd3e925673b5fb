//! Chains of reductions (`lower::reduce_chain`): `sum` / `max` over several axes is one
//! kernel (adjacent axes as one axis of their product, separated ones moved behind the
//! kept dims), within f32 rounding of the reference runtime and of the unmerged kernels;
//! a product's sum stays a product.

use luminal::prelude::*;
use luminal::testing::uniform as random;
use luminal_cpu::CpuBackend;

mod compare;
use compare::{check_tol, outputs};

fn reduce_kernels(names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| n.contains("Reduce("))
        .cloned()
        .collect()
}

/// Checks `outs` against the reference runtime, and against the CPU backend with the
/// pass switched off (one reduction kernel per axis there); returns the reduction
/// kernels' names with the pass.
fn check(
    cx: &Graph,
    inputs: &[(GraphTensor, Vec<f32>)],
    dims: &[(&str, usize)],
    outs: &[GraphTensor],
) -> Vec<String> {
    let host: Vec<_> = inputs
        .iter()
        .map(|(t, d)| (*t, HostData::F32(d.clone())))
        .collect();
    let names = check_tol(cx, &host, dims, outs, 1e-5);
    let (with, _) = outputs(cx, CpuBackend::with_threads(2), inputs, dims, outs);
    let (without, plain) = outputs(
        cx,
        CpuBackend::with_threads(2).disable_rules(&["reduce_chain"]),
        inputs,
        dims,
        outs,
    );
    assert!(
        reduce_kernels(&plain).iter().all(|n| !n.contains('+')),
        "{plain:?}"
    );
    for (a, b) in with.iter().zip(&without) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }
    reduce_kernels(&names)
}

#[test]
fn reductions_over_adjacent_axes_are_one_kernel() {
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 5, 6, 7));
    let inner = x.sum([1, 2, 3]).output();
    let outer = x.sum([0, 1]).output();
    let max = x.max([2, 3]).output();
    let names = check(
        &cx,
        &[(x, random(3 * 5 * 6 * 7, 1))],
        &[],
        &[inner, outer, max],
    );
    let mut names: Vec<_> = names
        .iter()
        .map(|n| n.split('[').next().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["MaxReduce(2+3)", "SumReduce(0+1)", "SumReduce(1+2+3)"],
        "{names:?}"
    );
}

/// A batch norm's statistics and a convolution's bias gradient: `[N, C, H, W]` summed
/// over N, H and W (a dynamic batch), and a mean over separated axes.
#[test]
fn reductions_over_separated_axes_are_one_kernel() {
    let cx = Graph::new();
    let x = cx.tensor("x", ("b", 3, 5, 6));
    let bias_grad = x.sum([0, 2, 3]).output();
    let y = cx.tensor("y", (4, 6, 5));
    let mean = y.mean([0, 2]).output();
    let names = check(
        &cx,
        &[(x, random(4 * 3 * 5 * 6, 2)), (y, random(4 * 6 * 5, 3))],
        &[("b", 4)],
        &[bias_grad, mean],
    );
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("SumReduce(0+2+3)")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("SumReduce(0+2)")),
        "{names:?}"
    );
}

/// Mixed ops do not merge (`sum` of a `max`), and a product's sum stays a product.
#[test]
fn other_reductions_and_products_stay_apart() {
    let cx = Graph::new();
    let x = cx.tensor("x", (4, 6, 5));
    let mixed = x.max(2).sum(1).output();
    let a = cx.tensor("a", (2, 8, 16));
    let w = cx.tensor("w", (16, 32));
    let summed = a.matmul(w).sum([1, 2]).output();
    let host = [
        (x, random(4 * 6 * 5, 4)),
        (a, random(2 * 8 * 16, 5)),
        (w, random(16 * 32, 6)),
    ];
    let names = check(&cx, &host, &[], &[mixed, summed]);
    let all = outputs(&cx, CpuBackend::with_threads(1), &host, &[], &[mixed]).1;
    assert!(all.iter().any(|n| n.starts_with("matmul")), "{all:?}");
    assert!(
        names.iter().any(|n| n.starts_with("MaxReduce(2)")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("SumReduce(1)")),
        "{names:?}"
    );
}

/// Chains through a reshape or a `keepdim` view of a reduction's result are not merged
/// (the merged axes would be counted on the wrong shape), and neither are leaves read
/// over other dims permuted: values as the reference's.
#[test]
fn chains_through_reshapes_keep_their_axes() {
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 4, 5));
    let keep0 = x.sum_keepdim(0).sum(1).output();
    let keep1 = x.sum_keepdim(1).sum(2).output();
    let b = cx.tensor("b", (2, 3, 4, 6));
    let flat = b.sum(2).reshape(vec![6, 6]).sum(0).output();
    let y = cx.tensor("y", (6, 4, 5));
    let inlined = (y * 2.0).reshape(vec![4, 6, 5]).sum(2).sum(0).output();
    let host = [
        (x, random(3 * 4 * 5, 7)),
        (b, random(2 * 3 * 4 * 6, 8)),
        (y, random(6 * 4 * 5, 9)),
    ];
    check(&cx, &host, &[], &[keep0, keep1, flat, inlined]);
}
