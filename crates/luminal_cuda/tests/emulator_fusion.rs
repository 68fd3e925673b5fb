//! Elementwise fusion on the host emulator (and, where one loads, on a GPU): chains and trees of elementwise nodes become one
//! kernel (no intermediate buffers), through views on the intermediate edges, casts,
//! constants, dynamic dims and into reductions; results equal the reference backend, and equal
//! the unfused plan (`HostEmulatorUnfused`) bit for bit (fused values are rounded to each
//! node's dtype as its buffer would hold them, and products are never contracted into FMAs).

mod common;
use common::data;
use luminal::graph::GraphData;
use luminal::prelude::*;
use luminal_cuda::codegen::Fusion;
use luminal_cuda::host::{HostExecutor, HostRuntime};
use luminal_cuda::plan::{Executor, PlanRuntime};
use luminal_cuda::{CudaBackend, HostEmulatorBackend, HostEmulatorUnfused};

/// The emulator with fusion, and without.
const EMU: (HostEmulatorBackend, HostEmulatorUnfused) = (HostEmulatorBackend, HostEmulatorUnfused);

/// The emulator fusing through broadcasts too ([`Fusion::Broadcast`]).
#[derive(Clone, Copy)]
struct EmulatorBroadcast;

impl Backend for EmulatorBroadcast {
    type Runtime = HostRuntime;
    fn compile(&self, graph: GraphData, _: &CompileOptions) -> luminal::Result<HostRuntime> {
        PlanRuntime::with_fusion(graph, HostExecutor::new(true), Fusion::Broadcast)
    }
}

fn run<B: Backend>(
    cx: &Graph,
    backend: B,
    inputs: &[(GraphTensor<'_>, usize)],
    outputs: &[GraphTensor<'_>],
    dims: &[(&str, usize)],
) -> (Vec<Vec<f32>>, B::Runtime) {
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (name, v) in dims {
        rt.set_dim(name, *v);
    }
    for (i, &(t, n)) in inputs.iter().enumerate() {
        rt.set(t, &data(n, i as u32)).unwrap();
    }
    rt.run().unwrap();
    let outs = outputs.iter().map(|&o| rt.get_f32(o).unwrap()).collect();
    (outs, rt)
}

fn close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what} output {o}: length");
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-5 * b.abs() || (a.is_nan() && b.is_nan()),
                "{what} output {o}[{i}]: {a} vs {b}"
            );
        }
    }
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|o| o.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Runs on the reference, on `on.0` (fused) and `on.1` (unfused); returns the fused plan's
/// (kernels, launches).
fn check<E, F, U>(
    on: &(F, U),
    cx: &Graph,
    inputs: &[(GraphTensor<'_>, usize)],
    outputs: &[GraphTensor<'_>],
    dims: &[(&str, usize)],
) -> (usize, usize)
where
    E: Executor,
    F: Backend<Runtime = PlanRuntime<E>> + Clone,
    U: Backend<Runtime = PlanRuntime<E>> + Clone,
{
    let (want, _) = run(cx, ReferenceBackend, inputs, outputs, dims);
    let (fused, rt) = run(cx, on.0.clone(), inputs, outputs, dims);
    let (unfused, rt0) = run(cx, on.1.clone(), inputs, outputs, dims);
    close(&fused, &want, "fused vs reference");
    assert_eq!(bits(&fused), bits(&unfused), "fused vs unfused");
    assert!(rt.launches() <= rt0.launches());
    assert_eq!(rt0.fused_nodes(), 0);
    (rt.kernels().len(), rt.launches())
}

fn long_elementwise_chain_is_one_kernel<E, F, U>(on: &(F, U))
where
    E: Executor,
    F: Backend<Runtime = PlanRuntime<E>> + Clone,
    U: Backend<Runtime = PlanRuntime<E>> + Clone,
{
    let cx = Graph::new();
    let a = cx.tensor("a", (6, 10));
    let b = cx.tensor("b", (10, 6));
    let c = cx.tensor("c", (9,));
    // Unary, binary, constants, a cast through f16 and back, and views on intermediate
    // edges: permute, slice, pad of computed values, and a broadcast operand.
    let mut t = (a * 2.0 + 0.5).exp2().sin();
    t = t.permute([1, 0]) * b; // [10, 6]
    t = (t + 3.0).sqrt().recip();
    t = t.cast(DType::F16).cast(DType::F32);
    t = t.slice(0, 1, 9).pad_axis(1, 1, 2); // [8, 9]
    t = ((t + 2.0).log2() * c).sigmoid();
    let out = (t * 3.0 - 1.0).output();
    let (kernels, launches) = check(on, &cx, &[(a, 60), (b, 60), (c, 9)], &[out], &[]);
    assert_eq!((kernels, launches), (1, 1), "the chain is one kernel");
}

fn reduction_of_an_elementwise_expression_is_one_kernel<E, F, U>(on: &(F, U))
where
    E: Executor,
    F: Backend<Runtime = PlanRuntime<E>> + Clone,
    U: Backend<Runtime = PlanRuntime<E>> + Clone,
{
    let cx = Graph::new();
    let a = cx.tensor("a", (5, 7, 3));
    let b = cx.tensor("b", (7, 3));
    let e = (a.exp2() * b.expand(0, 5)).permute([0, 2, 1]) + 1.0;
    let s = e.sum(2).output(); // [5, 3]
    let m = (a.sin() * 2.0).max(1).output(); // [5, 3]
    let (kernels, launches) = check(on, &cx, &[(a, 105), (b, 21)], &[s, m], &[]);
    assert_eq!((kernels, launches), (2, 2));
}

fn shared_intermediates_and_outputs_keep_their_buffers<E, F, U>(on: &(F, U))
where
    E: Executor,
    F: Backend<Runtime = PlanRuntime<E>> + Clone,
    U: Backend<Runtime = PlanRuntime<E>> + Clone,
{
    let cx = Graph::new();
    let a = cx.tensor("a", (4, 9));
    let c = a.exp2(); // two readers: computed once into its buffer
    let d = (c + c.sin() * 0.5).output();
    let e = (a * 3.0).output(); // an output read by another node stays a buffer
    let f = (e + 1.0).sqrt().output();
    let (_, launches) = check(on, &cx, &[(a, 36)], &[d, e, f], &[]);
    // c, d (with the sine), e, f: four kernels; c and e read only `a` and run as one
    // combined launch (`LUMINAL_CUDA_COMBINE`), so three launches.
    assert_eq!(launches, 3);
}

fn dynamic_dims_fuse<E, F, U>(on: &(F, U))
where
    E: Executor,
    F: Backend<Runtime = PlanRuntime<E>> + Clone,
    U: Backend<Runtime = PlanRuntime<E>> + Clone,
{
    let cx = Graph::new();
    let a = cx.tensor("a", ("s", 6));
    let b = cx.tensor("b", (6,));
    let t = (a + b.expand(0, "s")).permute([1, 0]); // [6, s]
    let t = (t.exp2() * 0.25)
        .pad_axis(1, 0, 1)
        .slice(1, 1, Expression::from("s") + 1);
    let out = (t.sin() * 2.0 + 1.0).sum(0).output(); // [s]
    for s in [1, 5, 17] {
        let (kernels, _) = check(on, &cx, &[(a, 6 * s), (b, 6)], &[out], &[("s", s)]);
        assert_eq!(kernels, 1);
    }
}

fn softmax_and_norms_match<E, F, U>(on: &(F, U))
where
    E: Executor,
    F: Backend<Runtime = PlanRuntime<E>> + Clone,
    U: Backend<Runtime = PlanRuntime<E>> + Clone,
{
    let cx = Graph::new();
    let a = cx.tensor("a", (3, "n", 16));
    let w = cx.tensor("w", (16,));
    let sm = a.softmax(2).output();
    let rn = (a.rms_norm(2, 1e-5) * w.expand(0, "n").expand(0, 3))
        .silu()
        .output();
    for n in [1, 7] {
        check(on, &cx, &[(a, 48 * n), (w, 16)], &[sm, rn], &[("n", n)]);
    }
}

#[test]
fn emulator_long_elementwise_chain_is_one_kernel() {
    long_elementwise_chain_is_one_kernel(&EMU);
}

#[test]
fn emulator_reduction_of_an_elementwise_expression_is_one_kernel() {
    reduction_of_an_elementwise_expression_is_one_kernel(&EMU);
}

#[test]
fn emulator_shared_intermediates_and_outputs_keep_their_buffers() {
    shared_intermediates_and_outputs_keep_their_buffers(&EMU);
}

#[test]
fn emulator_dynamic_dims_fuse() {
    dynamic_dims_fuse(&EMU);
}

#[test]
fn emulator_softmax_and_norms_match() {
    softmax_and_norms_match(&EMU);
}

/// The cases again fusing through broadcasts.
#[test]
fn emulator_broadcast_fusion() {
    let on = (EmulatorBroadcast, HostEmulatorUnfused);
    long_elementwise_chain_is_one_kernel(&on);
    reduction_of_an_elementwise_expression_is_one_kernel(&on);
    shared_intermediates_and_outputs_keep_their_buffers(&on);
    dynamic_dims_fuse(&on);
    softmax_and_norms_match(&on);
}

/// The same cases on a GPU (fused vs `without_fusion`, bit for bit, and vs the reference);
/// skips, printing a line, where no driver or device loads.
#[test]
fn gpu_fusion() {
    let b = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("skipping the GPU fusion test: {e}");
            return;
        }
    };
    let on = (b.clone(), b.clone().without_fusion());
    long_elementwise_chain_is_one_kernel(&on);
    reduction_of_an_elementwise_expression_is_one_kernel(&on);
    shared_intermediates_and_outputs_keep_their_buffers(&on);
    dynamic_dims_fuse(&on);
    softmax_and_norms_match(&on);
    let on = (b.clone().with_fusion(Fusion::Broadcast), b.without_fusion());
    long_elementwise_chain_is_one_kernel(&on);
    reduction_of_an_elementwise_expression_is_one_kernel(&on);
    shared_intermediates_and_outputs_keep_their_buffers(&on);
    dynamic_dims_fuse(&on);
    softmax_and_norms_match(&on);
    println!(
        "gpu: fusion cases (on, broadcast) equal the unfused plan bit for bit and the reference"
    );
}
