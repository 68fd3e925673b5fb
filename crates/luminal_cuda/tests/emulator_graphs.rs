//! Runs captured into a graph and replayed (CUDA graphs; the host emulator records and
//! replays its launches the same way): a run whose launches (functions, grids, buffer
//! addresses, scalars, products) equal the previous run's is captured, and replayed while they
//! stay the same. Dims are read from a table in device memory, so a replay with new dim
//! values (a decode step's position) and new input data computes the new result. Every result
//! is compared with the reference backend; `gpu_graphs` runs the same on a GPU.

mod common;
use common::data;
use luminal::prelude::*;
use luminal_cuda::plan::{Executor, PlanRuntime};
use luminal_cuda::{CudaBackend, HostEmulatorBackend};

fn close(what: &str, want: &[f32], got: &[f32]) {
    assert_eq!(want.len(), got.len(), "{what}");
    for (i, (a, b)) in want.iter().zip(got).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
            "{what} element {i}: want {a}, got {b}"
        );
    }
}

/// A window of 4 rows of a state-like table at a dynamic offset `p`, scaled and summed: the
/// same launches for every `p` (only the dims table changes), so every run after the first
/// two replays the graph captured on the second.
fn window<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: B) {
    let cx = Graph::new();
    let big = cx.tensor("big", (20, 8));
    let p = Expression::var("p");
    let w = big.slice(0, p.clone(), p + 4);
    let y = (w * 2.0 + 1.0).output();
    let s = w.sum(1).output();
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (run, p) in [0usize, 3, 7, 16, 5, 9].into_iter().enumerate() {
        // New data every other run (same size: written into the same buffer).
        let v = data(160, 1 + (run / 2) as u32);
        reference.set_dim("p", p);
        rt.set_dim("p", p);
        reference.set(big, &v).unwrap();
        rt.set(big, &v).unwrap();
        reference.run().unwrap();
        rt.run().unwrap();
        for t in [y, s] {
            close(
                &format!("window p={p}"),
                &reference.get_f32(t).unwrap(),
                &rt.get_f32(t).unwrap(),
            );
        }
    }
    let (replays, captures) = rt.graph_replays();
    // Run 1 issues, run 2 captures and replays, runs 3-6 replay.
    assert_eq!((replays, captures), (5, 1), "replays, captures");
}

/// A product whose operand window moves with `p` (the cuBLAS call's offsets change: a new
/// signature each run, so nothing replays) and a shape that changes (`s`): results stay right,
/// and the graph is captured again once the launches repeat.
fn changing<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: B) {
    let cx = Graph::new();
    let big = cx.tensor("big", (20, 8));
    let w8 = cx.tensor("w", (8, 5));
    let p = Expression::var("p");
    let s = Expression::var("s");
    let x = big.slice(0, p.clone(), p + s);
    let y = x.matmul(w8).output();
    let z = (x.exp() * 0.5).output();
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    let (vb, vw) = (data(160, 3), data(40, 4));
    reference.set(big, &vb).unwrap();
    rt.set(big, &vb).unwrap();
    reference.set(w8, &vw).unwrap();
    rt.set(w8, &vw).unwrap();
    for (p, s) in [
        (0, 4),
        (1, 4),
        (1, 4),
        (1, 4),
        (2, 4),
        (2, 3),
        (2, 3),
        (2, 3),
        (0, 4),
    ] {
        for (d, v) in [("p", p), ("s", s)] {
            reference.set_dim(d, v);
            rt.set_dim(d, v);
        }
        reference.run().unwrap();
        rt.run().unwrap();
        for t in [y, z] {
            close(
                &format!("changing p={p} s={s}"),
                &reference.get_f32(t).unwrap(),
                &rt.get_f32(t).unwrap(),
            );
        }
    }
    let (replays, captures) = rt.graph_replays();
    println!("changing launches: {replays} replays, {captures} captures");
    // (1, 4) three times and (2, 3) three times: each captured on its second run and
    // replayed on its third.
    assert_eq!(captures, 2, "captures");
    assert_eq!(replays, 4, "replays");
}

/// A step that depends only on an input set once (a weight's reduction here; a dequantizing
/// cast in a model) runs in the first run only, and again after that input is set again.
fn static_steps<E: Executor, B: Backend<Runtime = PlanRuntime<E>>>(backend: B) {
    let cx = Graph::new();
    let w = cx.tensor("w", (6, 9));
    let x = cx.tensor("x", (6, "n"));
    let ws = w.sum(1).expand(1, Expression::var("n"));
    let y = (x * ws).output();
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    let mut launches = vec![];
    for (run, n) in [3usize, 3, 5, 5].into_iter().enumerate() {
        if run == 0 || run == 3 {
            let v = data(54, 7 + run as u32);
            reference.set(w, &v).unwrap();
            rt.set(w, &v).unwrap();
        }
        let v = data(6 * n, 9 + run as u32);
        reference.set_dim("n", n);
        rt.set_dim("n", n);
        reference.set(x, &v).unwrap();
        rt.set(x, &v).unwrap();
        reference.run().unwrap();
        rt.run().unwrap();
        close(
            &format!("static steps run {run}"),
            &reference.get_f32(y).unwrap(),
            &rt.get_f32(y).unwrap(),
        );
        launches.push(rt.launches());
    }
    // The reduction of `w` runs in runs 0 and 3 (after `w` is set again) only.
    assert_eq!(launches, [2, 1, 1, 2], "launches per run");
}

#[test]
fn static_steps_run_once_per_input_version() {
    static_steps(HostEmulatorBackend);
}

#[test]
fn replays_with_new_dims_and_data() {
    window(HostEmulatorBackend);
}

#[test]
fn new_launches_are_captured_again() {
    changing(HostEmulatorBackend);
}

#[test]
fn gpu_graphs() {
    match CudaBackend::new(0) {
        Ok(b) => {
            window(b.clone());
            changing(b.clone());
            static_steps(b);
        }
        Err(e) => eprintln!("skipping the GPU graph tests: {e}"),
    }
}
