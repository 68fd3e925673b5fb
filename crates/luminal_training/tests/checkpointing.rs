//! Gradient checkpointing (`Graph::checkpoint`): the gradients are those of the plain graph
//! (whose rules are checked against PyTorch in `torch_grads.rs`), the recomputed segments
//! survive the generic passes, and the CPU memory plan shrinks by the activations the
//! segments no longer keep.

use luminal::autograd::Autograd;
use luminal::prelude::*;
use luminal_cpu::CpuBackend;

const D: usize = 32;
const H: usize = 128;
const B: usize = 64;
const LAYERS: usize = 6;

fn values(n: usize, seed: u32) -> Vec<f32> {
    // A small deterministic generator (xorshift) scaled to ±0.25.
    let mut s = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32 - 0.5) * 0.5
        })
        .collect()
}

struct Net<'g> {
    x: GraphTensor<'g>,
    params: Vec<GraphTensor<'g>>,
    grads: Vec<GraphTensor<'g>>,
    loss: GraphTensor<'g>,
}

/// A stack of residual MLP blocks `x + W2·gelu(W1·x + b1)`, each block checkpointed when
/// `checkpoint` is on; mean-squared output as the loss.
fn build<'g>(cx: &'g Graph, checkpoint: bool) -> Net<'g> {
    let x = cx.tensor("x", (B, D));
    let mut h = x;
    let mut params = vec![];
    for l in 0..LAYERS {
        let w1 = cx.tensor(&format!("w1.{l}"), (D, H));
        let b1 = cx.tensor(&format!("b1.{l}"), H);
        let w2 = cx.tensor(&format!("w2.{l}"), (H, D));
        params.extend([w1, b1, w2]);
        let block = |h: GraphTensor<'g>| {
            let a = (h.matmul(w1) + b1.expand(0, B)).gelu();
            h + a.matmul(w2)
        };
        h = if checkpoint {
            cx.checkpoint(|| block(h))
        } else {
            block(h)
        };
    }
    let loss = (h * h).mean([0, 1]).output();
    let grads = Autograd::new(&params, loss)
        .grads(&params)
        .into_iter()
        .map(|g| g.output())
        .collect();
    Net {
        x,
        params,
        grads,
        loss,
    }
}

fn run<R: Runtime>(net: &Net, mut rt: R) -> (Vec<f32>, Vec<Vec<f32>>, R) {
    rt.set(net.x, &values(B * D, 1)).unwrap();
    for (i, p) in net.params.iter().enumerate() {
        let n = p
            .shape()
            .iter()
            .map(|d| d.as_constant().unwrap() as usize)
            .product();
        rt.set(*p, &values(n, 10 + i as u32)).unwrap();
    }
    rt.run().unwrap();
    let loss = rt.get(net.loss).unwrap();
    let grads = net.grads.iter().map(|g| rt.get(*g).unwrap()).collect();
    (loss, grads, rt)
}

fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

#[test]
fn checkpointed_gradients_equal_plain_on_reference() {
    let (cp, plain) = (Graph::new(), Graph::new());
    let (a, b) = (build(&cp, true), build(&plain, false));
    let opts = CompileOptions::default;
    let (la, ga, _) = run(&a, cp.compile(ReferenceBackend, opts()).unwrap());
    let (lb, gb, _) = run(&b, plain.compile(ReferenceBackend, opts()).unwrap());
    // The same ops on the same values in the same order: bit for bit.
    assert_eq!(la, lb);
    for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
        assert_eq!(x, y, "gradient {i}");
    }
}

#[test]
fn recomputation_survives_the_passes_and_shrinks_the_cpu_plan() {
    let (cp, plain) = (Graph::new(), Graph::new());
    let (a, b) = (build(&cp, true), build(&plain, false));
    let ra = cp
        .compile(CpuBackend::with_threads(1), CompileOptions::default())
        .unwrap();
    let rb = plain
        .compile(CpuBackend::with_threads(1), CompileOptions::default())
        .unwrap();
    // CSE must not fold the recomputed blocks back into the forward ones: the checkpointed
    // graph keeps more nodes after the generic passes.
    let nodes = |rt: &luminal_cpu::CpuRuntime| rt.graph().node_ids().count();
    assert!(
        nodes(&ra) > nodes(&rb),
        "recomputed nodes were merged away: {} vs {} nodes",
        nodes(&ra),
        nodes(&rb)
    );
    let (la, ga, ra) = run(&a, ra);
    let (lb, gb, rb) = run(&b, rb);
    assert_close(&la, &lb, 1e-5, "loss");
    for (i, (x, y)) in ga.iter().zip(&gb).enumerate() {
        assert_close(x, y, 1e-4, &format!("gradient {i}"));
    }
    // Without checkpoints each block keeps its [B, H] pre-activation (and GELU's inner
    // values) for the backward pass; with them only one block's worth is alive at a time.
    let (with, without) = (ra.buffer_bytes(), rb.buffer_bytes());
    let activation = B * H * 4;
    eprintln!("CPU plan: {without} bytes plain, {with} bytes checkpointed");
    assert!(
        with + (LAYERS - 2) * activation <= without,
        "checkpointing saved {} bytes, expected at least {}",
        without as i64 - with as i64,
        (LAYERS - 2) * activation
    );
}

#[test]
fn nested_and_gradient_free_segments() {
    let cx = Graph::new();
    let x = cx.tensor("x", (4, 3));
    let w = cx.tensor("w", (3, 3));
    let c = cx.tensor("c", (4, 3));
    // A segment no gradient flows through, and one nested in another.
    let frozen = cx.checkpoint(|| (c * 2.0).exp());
    let y = cx.checkpoint(|| {
        let inner = cx.checkpoint(|| x.matmul(w).tanh());
        (inner * frozen).matmul(w).sin()
    });
    let loss = y.sum([0, 1]).output();
    let dw = Autograd::new(&[w], loss).grad(w).output();

    let plain = Graph::new();
    let (px, pw, pc) = (
        plain.tensor("x", (4, 3)),
        plain.tensor("w", (3, 3)),
        plain.tensor("c", (4, 3)),
    );
    let py = (px.matmul(pw).tanh() * (pc * 2.0).exp()).matmul(pw).sin();
    let pl = py.sum([0, 1]).output();
    let pdw = Autograd::new(&[pw], pl).grad(pw).output();

    let mut r1 = cx
        .compile(CpuBackend::with_threads(1), CompileOptions::default())
        .unwrap();
    let mut r2 = plain
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    r1.set(x, &values(12, 3)).unwrap();
    r1.set(w, &values(9, 4)).unwrap();
    r1.set(c, &values(12, 5)).unwrap();
    r2.set(px, &values(12, 3)).unwrap();
    r2.set(pw, &values(9, 4)).unwrap();
    r2.set(pc, &values(12, 5)).unwrap();
    r1.run().unwrap();
    r2.run().unwrap();
    assert_close(
        &r1.get::<f32>(dw).unwrap(),
        &r2.get::<f32>(pdw).unwrap(),
        1e-5,
        "dw",
    );
}
