//! Side outputs (`lower::side_outputs`): an elementwise kernel of a product's result that
//! the product computes itself, over each finished block, when the result has other
//! readers too (a training step's GELU, whose gradient reads the pre-activation). Results
//! bit for bit those of the separate kernels, on 1 and 2 threads, and within f32 rounding
//! of the reference runtime; the fusion happens only where it is safe.

use luminal::prelude::*;
use luminal::testing::uniform as random;
use luminal_cpu::CpuBackend;

mod compare;
use compare::{check_tol, outputs};

/// Runs the graph with and without the pass on 1 and 2 threads: the same bits; returns
/// the kernel names with it.
fn same_without_the_pass(
    cx: &Graph,
    inputs: &[(GraphTensor, Vec<f32>)],
    outs: &[GraphTensor],
) -> Vec<String> {
    let host: Vec<_> = inputs
        .iter()
        .map(|(t, d)| (*t, HostData::F32(d.clone())))
        .collect();
    check_tol(cx, &host, &[], outs, 1e-4);
    let mut names = vec![];
    for threads in [1, 2] {
        let (with, n) = outputs(cx, CpuBackend::with_threads(threads), inputs, &[], outs);
        let (without, plain) = outputs(
            cx,
            CpuBackend::with_threads(threads).disable_rules(&["side"]),
            inputs,
            &[],
            outs,
        );
        assert!(plain.iter().all(|k| !k.contains("side:")), "{plain:?}");
        for (o, (a, b)) in with.iter().zip(&without).enumerate() {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_eq!(
                    x.to_bits(),
                    y.to_bits(),
                    "{threads} threads, output {o}, element {i}: {x} vs {y}"
                );
            }
        }
        names = n;
    }
    names
}

/// `h = x·W + b`, `g = gelu(h)`, read by a second product, and `h` read again (as the
/// GELU's gradient reads it): the GELU becomes the first product's side output.
#[test]
fn a_gelu_of_a_product_read_twice_is_the_products_side_output() {
    for (m, k, n, tanh) in [
        (256, 64, 256, true),
        (70, 48, 130, false),
        (1024, 64, 64, true),
    ] {
        let cx = Graph::new();
        let x = cx.tensor("x", (m, k));
        let w = cx.tensor("w", (k, n));
        let b = cx.tensor("b", n);
        let w2 = cx.tensor("w2", (n, 32));
        let h = x.matmul(w) + b.expand(0, m);
        let g = if tanh { h.gelu_tanh() } else { h.gelu() };
        let y = g.matmul(w2).output();
        let again = (h * 3.0).sum(1).output();
        let inputs = [
            (x, random(m * k, 1)),
            (w, random(k * n, 2)),
            (b, random(n, 3)),
            (w2, random(n * 32, 4)),
        ];
        let names = same_without_the_pass(&cx, &inputs, &[y, again]);
        assert!(
            names.iter().any(|k| k.contains("+side:elementwise")),
            "{m}×{k}×{n}: {names:?}"
        );
    }
}

/// Where the elementwise kernel also reads a value computed after the product, or its
/// result is a graph output, it stays a kernel of its own.
#[test]
fn no_side_output_where_it_would_read_a_later_value_or_be_a_graph_output() {
    let (m, k, n) = (64, 32, 48);
    let cx = Graph::new();
    let x = cx.tensor("x", (m, k));
    let w = cx.tensor("w", (k, n));
    let v = cx.tensor("v", (m, n));
    let w3 = cx.tensor("w3", (n, 16));
    let h = x.matmul(w);
    // A value that needs `h` itself (its column sums), then an elementwise kernel of `h`
    // and that value (read by a product, so it is a kernel of its own).
    let later = ((h * v).sum(0).expand(0, m) * 0.1).sin();
    let late = (h * later).matmul(w3).output();
    let kept = h.sin().output();
    let inputs = [
        (x, random(m * k, 5)),
        (w, random(k * n, 6)),
        (v, random(m * n, 7)),
        (w3, random(n * 16, 8)),
    ];
    let names = same_without_the_pass(&cx, &inputs, &[late, kept]);
    assert!(names.iter().all(|k| !k.contains("side:")), "{names:?}");
}

/// A layer norm whose output `x̂` is read by its affine weight and bias and again (as the
/// weight's gradient reads it): the affine becomes the norm kernel's side output. (Its
/// gradient, built here from primops and computed by row kernels, is checked too.)
#[test]
fn a_layer_norms_affine_is_the_norm_kernels_side_output() {
    for (rows, len) in [(1024, 64), (37, 96)] {
        let cx = Graph::new();
        let x = cx.tensor("x", (rows, len));
        let w = cx.tensor("w", len);
        let b = cx.tensor("b", len);
        let dy = cx.tensor("dy", (rows, len));
        let other = cx.tensor("other", (rows, len));
        let wo = cx.tensor("wo", (len, 16));
        let xhat = x.layer_norm(1, 1e-5);
        let y = (xhat * w.expand(0, rows) + b.expand(0, rows))
            .matmul(wo)
            .output();
        let wgrad = (xhat * dy).sum(0).output();
        let dx = (x.layer_norm_grad(xhat, dy, 1e-5) + other)
            .matmul(wo)
            .output();
        let inputs = [
            (x, random(rows * len, 11)),
            (w, random(len, 12)),
            (b, random(len, 13)),
            (dy, random(rows * len, 14)),
            (other, random(rows * len, 15)),
            (wo, random(len * 16, 16)),
        ];
        let names = same_without_the_pass(&cx, &inputs, &[y, wgrad, dx]);
        assert!(
            names.iter().any(|k| k.starts_with("layer_norm+side:")),
            "{rows}×{len}: {names:?}"
        );
    }
}

/// A side program that is not an affine chain (a sine), on the products' other paths: a
/// skinny product (its side output computed over the whole result afterwards), a deep
/// one split along K (the side program after the slices are added), and a plain one.
#[test]
fn a_general_side_program_on_skinny_deep_and_plain_products() {
    // (rows, depth, columns, A given transposed)
    for (m, k, n, deep) in [
        (4, 64, 96, false),
        (64, 1024, 64, true),
        (200, 48, 80, false),
    ] {
        let cx = Graph::new();
        let a = if deep {
            cx.tensor("a", (k, m))
        } else {
            cx.tensor("a", (m, k))
        };
        // The skinny product reads both operands along K: B given as `[n, k]`.
        let bt = cx.tensor("bt", (n, k));
        let w2 = cx.tensor("w2", (n, 16));
        let lhs = if deep { a.permute([1, 0]) } else { a };
        let h = lhs.matmul(bt.permute([1, 0]));
        let s = ((h * 0.1).sin() * h).matmul(w2).output();
        let again = (h * 3.0).sum(1).output();
        let inputs = [
            (a, random(m * k, 21)),
            (bt, random(n * k, 22)),
            (w2, random(n * 16, 23)),
        ];
        let names = same_without_the_pass(&cx, &inputs, &[s, again]);
        assert!(
            names.iter().any(|k| k.contains("+side:elementwise")),
            "{m}×{k}×{n}: {names:?}"
        );
    }
}
