//! Reductions whose layout the CPU backend changes: sums across rows of a row-major buffer
//! (a bias gradient: `[tokens, features]` summed over tokens, read through a transposed
//! view) run as column sums, and row kernels over short rows run a batch of rows per
//! evaluation. Both are compared with the reference runtime on random data, on 1 and 2
//! threads, with odd sizes (partial batches and column pieces), broadcasts and masks, and
//! the kernel names show which path ran.

use luminal::prelude::*;
use luminal::testing::uniform as random;

mod compare;

/// [`compare::check_tol`] for f32 inputs: the CPU backend (1 and 2 threads) against the
/// reference within `tol · (1 + |ref|)`; returns the CPU kernel names.
fn check(
    cx: &Graph,
    inputs: &[(GraphTensor, Vec<f32>)],
    dims: &[(&str, usize)],
    outs: &[GraphTensor],
    tol: f32,
) -> Vec<String> {
    let inputs: Vec<_> = inputs
        .iter()
        .map(|(t, d)| (*t, HostData::F32(d.clone())))
        .collect();
    compare::check_tol(cx, &inputs, dims, outs, tol)
}

#[test]
fn column_sums_of_row_major_buffers() {
    // (tokens, features): narrow rows (one task), wide rows (split in column pieces),
    // an odd width, and a dynamic token count.
    for &(t, f) in &[(1024usize, 64usize), (300, 1536), (257, 77), (33, 16)] {
        let cx = Graph::new();
        let x = cx.tensor("x", (t, f));
        let y = cx.tensor("y", (t, f));
        // As autograd builds a bias gradient (the summed axis moved last by a transpose),
        // and summed over axis 0 directly.
        let bias_grad = x.permute([1, 0]).sum(1).output();
        let direct = x.sum(0).output();
        // A norm-weight gradient: a product summed over tokens; and a max across rows.
        let weight_grad = (x * y).permute([1, 0]).sum(1).output();
        let col_max = x.permute([1, 0]).max(1).output();
        let names = check(
            &cx,
            &[(x, random(t * f, 1)), (y, random(t * f, 2))],
            &[],
            &[bias_grad, direct, weight_grad, col_max],
            1e-5 * t as f32,
        );
        assert!(
            names.iter().any(|n| n.contains("across rows")),
            "({t}, {f}): no column reduction in {names:?}"
        );
    }
    // Summed over the middle axis of a batch: [b, t, f] -> [b, f], and over two leading
    // axes at once through a transposed view.
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 200, 96));
    let a = x.sum(1).output();
    let b = x.permute([2, 0, 1]).sum(2).output();
    let c = x.permute([0, 2, 1]).sum(2).output();
    check(&cx, &[(x, random(3 * 200 * 96, 3))], &[], &[a, b, c], 1e-3);
    // Dynamic rows.
    let cx = Graph::new();
    let x = cx.tensor("x", ("t", 128));
    let s = x.permute([1, 0]).sum(1).output();
    check(&cx, &[(x, random(515 * 128, 4))], &[("t", 515)], &[s], 1e-3);
}

#[test]
fn row_kernels_over_short_rows_in_batches() {
    // Row lengths from 1 to a full block, row counts that leave a partial last batch.
    for &(rows, c) in &[
        (1000usize, 64usize),
        (37, 10),
        (4097, 1),
        (65, 3),
        (9, 2048),
        (5, 4096),
    ] {
        let cx = Graph::new();
        let x = cx.tensor("x", (rows, c));
        let g = cx.tensor("g", (rows, c));
        let w = cx.tensor("w", c);
        let sm = x.softmax(1);
        // The softmax backward (two reduce stages and row registers) and a layer norm with
        // a broadcast weight.
        let back = (sm * (g - (g * sm).sum(1).expand(1, c))).output();
        let ln = (x.layer_norm(1, 1e-5) * w.expand(0, rows)).output();
        let lse = x.exp().sum(1).log().output();
        let names = check(
            &cx,
            &[
                (x, random(rows * c, 5)),
                (g, random(rows * c, 6)),
                (w, random(c, 7)),
            ],
            &[],
            &[back, ln, lse],
            1e-4,
        );
        if c > 1 {
            assert!(
                names.iter().any(|n| n.starts_with("rows[")),
                "({rows}, {c}): no row kernel in {names:?}"
            );
        }
    }
    // Causal-masked attention scores [b, h, q, k] with dynamic length.
    let cx = Graph::new();
    let s = cx.tensor("s", (2, 3, "n", "n"));
    let p = s.softmax(3).output();
    check(
        &cx,
        &[(s, random(2 * 3 * 50 * 50, 8))],
        &[("n", 50)],
        &[p],
        1e-4,
    );
}

#[test]
fn reductions_over_short_rows() {
    // Rows of 1 to 9 elements (the short-row fold and the accumulator path on either side
    // of its limit), read directly and through a transpose, summed and maxed, with a row
    // count that does not fill the last block.
    for len in 1..=9usize {
        let rows = 5003;
        let cx = Graph::new();
        let x = cx.tensor("x", (rows, len));
        let xt = cx.tensor("xt", (len, rows));
        let s = x.sum(1).output();
        let m = x.max(1).output();
        let st = xt.permute([1, 0]).sum(1).output();
        check(
            &cx,
            &[(x, random(rows * len, 9)), (xt, random(rows * len, 10))],
            &[],
            &[s, m, st],
            1e-5,
        );
    }
}
