//! The attention gradient in one piece (`luminal::autograd::set_attention_grads`) on the
//! CPU backend's fused kernel (`attention_grad` rule, `kernels/attention/small.rs`)
//! against the reference runtime on the same graph: causal and sliding-window masks, head
//! widths 8, 16 and 32, a sequence length that is not a multiple of the kernel's 16-key
//! steps, one and two threads, every instruction-set level the CPU has. The reference
//! runtime's one-piece gradient is itself checked against the rule-by-rule one and finite
//! differences in `luminal`'s autograd tests.

use luminal::autograd::{gradients, set_attention_grads};
use luminal::prelude::*;
use luminal_cpu::{detected_isa, set_max_isa, CpuBackend, Isa};
use luminal_nn::causal_attention_windowed;

fn data(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104729) % 2000) as f32 / 1000.0 - 1.0) * 1.5)
        .collect()
}

/// `d qkv` of `sum(w · attention(qkv))` for qkv `[b, s, 3, h, d]`, and the kernel names.
fn run(
    (b, s, h, d): (usize, usize, usize, usize),
    window: Option<usize>,
    cpu: Option<CpuBackend>,
) -> (Vec<f32>, Vec<String>) {
    set_attention_grads(Some(true));
    let cx = Graph::new();
    let qkv = cx.tensor("qkv", (b, s, 3, h, d));
    let w = cx.tensor("w", (b, h, s, d));
    let head = |i: i64| qkv.slice(2, i, i + 1).squeeze(2).permute(&[0, 2, 1, 3]);
    let out = causal_attention_windowed(head(0), head(1), head(2), window);
    let loss = (out * w).sum(vec![0, 1, 2, 3]);
    let g = gradients(&[qkv], loss)[0].output();
    set_attention_grads(None);
    let inputs = [
        (qkv, data(b * s * 3 * h * d, 1)),
        (w, data(b * h * s * d, 2)),
    ];
    eval(&cx, &inputs, g, cpu)
}

/// `g` after one run with `inputs` set, on the CPU backend `cpu` (with its kernel names)
/// or on the reference runtime.
fn eval(
    cx: &Graph,
    inputs: &[(GraphTensor<'_>, Vec<f32>)],
    g: GraphTensor<'_>,
    cpu: Option<CpuBackend>,
) -> (Vec<f32>, Vec<String>) {
    match cpu {
        Some(be) => {
            let mut rt = cx.compile(be, CompileOptions::default()).unwrap();
            for (t, v) in inputs {
                rt.set(*t, v).unwrap();
            }
            rt.run().unwrap();
            (rt.get::<f32>(g).unwrap(), rt.kernel_names())
        }
        None => {
            let mut rt = cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap();
            for (t, v) in inputs {
                rt.set(*t, v).unwrap();
            }
            rt.run().unwrap();
            (rt.get::<f32>(g).unwrap(), vec![])
        }
    }
}

/// The CPU result used the fused kernel and matches the reference within 2e-5.
fn check((got, names): (Vec<f32>, Vec<String>), want: &[f32], what: &str) {
    assert!(
        names.iter().any(|n| n == "attention_grad"),
        "{what}: no attention_grad kernel in {names:?}"
    );
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 2e-5 * b.abs().max(1.0),
            "{what}, element {i}: {a} vs {b}"
        );
    }
}

#[test]
fn attention_gradient_kernel_matches_reference_at_every_isa() {
    let best = detected_isa();
    for isa in [Isa::Generic, Isa::Avx2, Isa::Avx512] {
        if isa > best {
            continue;
        }
        set_max_isa(isa);
        for (shape, window) in [
            ((2, 37, 3, 16), None),
            ((1, 20, 2, 8), None),
            ((2, 33, 2, 32), Some(5)),
        ] {
            let (want, _) = run(shape, window, None);
            for threads in [1, 2] {
                let got = run(shape, window, Some(CpuBackend::with_threads(threads)));
                let what = format!("{isa:?} {shape:?} {window:?} {threads} threads");
                check(got, &want, &what);
            }
        }
    }
    set_max_isa(best);
}

/// Bidirectional attention with a key-padding bias per batch row (`[b, 1, 1, t]`: not
/// shared by every head, and hiding the last keys from every query, so whole blocks of
/// keys receive no gradient).
fn run_padded(
    (b, s, h, d): (usize, usize, usize, usize),
    lens: &[usize],
    cpu: Option<CpuBackend>,
) -> (Vec<f32>, Vec<String>) {
    set_attention_grads(Some(true));
    let cx = Graph::new();
    let qkv = cx.tensor("qkv", (b, s, 3, h, d));
    let w = cx.tensor("w", (b, h, s, d));
    let pad = cx.tensor("pad", (b, s));
    let head = |i: i64| qkv.slice(2, i, i + 1).squeeze(2).permute(&[0, 2, 1, 3]);
    let (q, k, v) = (head(0), head(1), head(2));
    let scores = q.matmul(k.transpose(-1, -2)) * (1.0 / (d as f32).sqrt());
    let bias = pad.unsqueeze(1).unsqueeze(1).expand_to(scores.shape());
    let out = (scores + bias).softmax(-1).matmul(v);
    let loss = (out * w).sum(vec![0, 1, 2, 3]);
    let g = gradients(&[qkv], loss)[0].output();
    set_attention_grads(None);
    let pad_data: Vec<f32> = (0..b * s)
        .map(|i| {
            if i % s < lens[i / s] {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let inputs = [
        (qkv, data(b * s * 3 * h * d, 3)),
        (w, data(b * h * s * d, 4)),
        (pad, pad_data),
    ];
    eval(&cx, &inputs, g, cpu)
}

#[test]
fn attention_gradient_kernel_with_padding_masks() {
    for (shape, lens) in [
        ((2, 40, 2, 32), [20, 9]),
        ((2, 40, 2, 16), [40, 3]),
        ((2, 23, 2, 8), [5, 23]),
    ] {
        let (want, _) = run_padded(shape, &lens, None);
        let got = run_padded(shape, &lens, Some(CpuBackend::with_threads(2)));
        check(got, &want, &format!("{shape:?} {lens:?}"));
    }
}
