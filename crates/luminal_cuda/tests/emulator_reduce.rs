//! Reductions over long rows (softmax, a norm's mean of squares, max, i32 and f16 sums,
//! strided and permuted rows, dynamic dims): on the host emulator (one thread per output),
//! through NVRTC where it loads (the cooperative kernels compile: shuffles and barriers in the
//! PTX), and on a GPU, where rows of 64 values or more run several threads per output
//! (`luminal_cuda::plan::threads_per_output`): results within a tolerance of the reference
//! backend (the tree sums in another order than the sequential loop) and of the same plan
//! with one thread per output (`CudaBackend::without_cooperative_reductions`). Without a GPU,
//! `HostEmulatorCooperative` runs the same cooperative kernels with each block's threads as
//! OpenMP threads.

mod common;
use common::data;
use luminal::prelude::*;
use luminal_cuda::{CudaBackend, HostEmulatorBackend, HostEmulatorCooperative};

/// One case: a graph, its inputs (tensor, element count), outputs and dim bindings.
struct Case<'a> {
    name: String,
    inputs: Vec<(GraphTensor<'a>, usize)>,
    outputs: Vec<GraphTensor<'a>>,
    dims: Vec<(&'static str, usize)>,
    /// Per output: the tolerance on a GPU, where sums go in another order (an f16 result
    /// may round to the neighbouring half).
    tols: Vec<f32>,
}

/// Softmax, `x * rsqrt(mean(x²) + eps) * w`, the mean of squares itself, and max, over the
/// last axis of `[rows, cols]`.
fn rows_case(cx: &Graph, rows: usize, cols: usize) -> Case<'_> {
    let x = cx.tensor("x", (rows, cols));
    let w = cx.tensor("w", (cols,));
    let sm = x.softmax(1).output();
    let ms = (x * x).mean(1).output();
    let rn = (x.rms_norm(1, 1e-5) * w.expand(0, rows)).output();
    let mx = x.max(1).output();
    Case {
        name: format!("rows {rows}x{cols}"),
        inputs: vec![(x, rows * cols), (w, cols)],
        outputs: vec![sm, ms, rn, mx],
        dims: vec![],
        tols: vec![1e-5; 4],
    }
}

/// Both dims dynamic: softmax and sum over `c` of `[r, c]`.
fn dynamic_case(cx: &Graph, r: usize, c: usize) -> Case<'_> {
    let x = cx.tensor("x", ("r", "c"));
    let sm = x.softmax(1).output();
    let s = (x.exp2() * 0.5).sum(1).output();
    Case {
        name: format!("dynamic {r}x{c}"),
        inputs: vec![(x, r * c)],
        outputs: vec![sm, s],
        dims: vec![("r", r), ("c", c)],
        tols: vec![1e-5; 2],
    }
}

/// Rows that are not contiguous (a permuted input: stride 3), a strided reduction (`inner > 1`:
/// one thread per output), i32 max and an f16 sum over long rows, one very long row.
fn views_case(cx: &Graph) -> Case<'_> {
    let a = cx.tensor("a", (5000, 3));
    let b = cx.tensor("b", (1, 100_000));
    let permuted = a.permute([1, 0]).sum(1).output(); // [3], rows of stride 3
    let strided = a.max(0).output(); // [3], inner = 3
    let ints = (a.permute([1, 0]) * 100.0)
        .cast(DType::I32)
        .max(1)
        .cast(DType::F32)
        .output();
    let halves = b.cast(DType::F16).sum(1).cast(DType::F32).output();
    let long = (b * b).sum(1).output();
    Case {
        name: "views".into(),
        inputs: vec![(a, 15000), (b, 100_000)],
        outputs: vec![permuted, strided, ints, halves, long],
        dims: vec![],
        tols: vec![1e-5, 0.0, 0.0, 1e-3, 1e-5],
    }
}

fn run<B: Backend>(cx: &Graph, backend: B, case: &Case) -> Vec<Vec<f32>> {
    let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
    for (name, v) in &case.dims {
        rt.set_dim(name, *v);
    }
    for (i, &(t, n)) in case.inputs.iter().enumerate() {
        rt.set(t, &data(n, 7 + i as u32)).unwrap();
    }
    rt.run().unwrap();
    case.outputs
        .iter()
        .map(|&o| rt.get_f32(o).unwrap())
        .collect()
}

/// Max relative difference (`|a - b| / (1 + |b|)`), asserting output `o`'s is within
/// `tols[o]`.
fn close(got: &[Vec<f32>], want: &[Vec<f32>], tols: &[f32], what: &str) -> f32 {
    let mut worst = 0f32;
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = tols[o];
        assert_eq!(g.len(), w.len(), "{what} output {o}: length");
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            let d = (a - b).abs() / (1.0 + b.abs());
            assert!(d <= tol, "{what} output {o}[{i}]: {a} vs {b}");
            worst = worst.max(d);
        }
    }
    worst
}

/// Every case, built in its own graph, checked with `check(graph, case)`.
fn for_each_case(mut check: impl FnMut(&Graph, &Case)) {
    // Threads per output on a GPU: 512, 512, 128, 128 (two outputs a block, the last block
    // half idle), 64 (four outputs a block, the last block partly idle), 32, 1.
    for (rows, cols) in [
        (3, 5000),
        (7, 4096),
        (5, 1023),
        (3, 1000),
        (1101, 600),
        (37, 100),
        (4, 33),
    ] {
        let cx = Graph::new();
        let case = rows_case(&cx, rows, cols);
        check(&cx, &case);
    }
    for (r, c) in [(3, 4097), (1, 64), (6, 9)] {
        let cx = Graph::new();
        let case = dynamic_case(&cx, r, c);
        check(&cx, &case);
    }
    let cx = Graph::new();
    let case = views_case(&cx);
    check(&cx, &case);
}

#[test]
fn emulator_long_reductions_match_the_reference() {
    for_each_case(|cx, case| {
        let want = run(cx, ReferenceBackend, case);
        let got = run(cx, HostEmulatorBackend, case);
        // One thread per output, summing in the reference's order.
        close(&got, &want, &vec![1e-5; want.len()], &case.name);
    });
}

/// The cooperative kernels (the source's GPU branch: lanes striding over the row, shuffles,
/// shared memory and barriers) on the emulator that runs each block's threads at once.
#[test]
fn emulator_cooperative_reductions_match_the_reference() {
    for_each_case(|cx, case| {
        let want = run(cx, ReferenceBackend, case);
        let seq = run(cx, HostEmulatorBackend, case);
        let t = std::time::Instant::now();
        let got = run(cx, HostEmulatorCooperative, case);
        let d = close(
            &got,
            &want,
            &case.tols,
            &format!("{} vs reference", case.name),
        );
        close(
            &got,
            &seq,
            &case.tols,
            &format!("{} vs sequential", case.name),
        );
        println!(
            "cooperative emulator {}: max rel diff {d:.1e} ({:.2} s)",
            case.name,
            t.elapsed().as_secs_f64()
        );
    });
}

/// NVRTC compiles every case's kernels (cooperative reductions included) where the library
/// loads: no GPU is needed, so this runs on a machine with the toolkit (or the
/// `nvidia-cuda-nvrtc` wheel's `lib` on `LD_LIBRARY_PATH`) and no device.
#[test]
fn nvrtc_compiles_cooperative_reductions() {
    if !luminal_cuda::nvrtc_available() {
        eprintln!("skipping the NVRTC compile check: NVRTC does not load");
        return;
    }
    let mut kernels = 0;
    for_each_case(|cx, case| {
        let rt = cx
            .compile(HostEmulatorBackend, CompileOptions::default())
            .unwrap();
        let ks: Vec<_> = rt.kernels().iter().collect();
        assert!(ks.iter().any(|k| k.cooperative), "{}", case.name);
        let ptx = luminal_cuda::device::nvrtc_ptx(&ks, "compute_90")
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert!(ptx.contains("shfl.sync.bfly"), "{}: no shuffles", case.name);
        assert!(ptx.contains("bar.sync"), "{}: no barrier", case.name);
        kernels += ks.len();
    });
    println!("nvrtc: {kernels} kernels compiled for compute_90");
}

/// On a GPU: cooperative reductions against the reference and against one thread per
/// output; skips, printing a line, where no driver or device loads.
#[test]
fn gpu_cooperative_reductions() {
    let b = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("skipping the GPU reduction test: {e}");
            return;
        }
    };
    for_each_case(|cx, case| {
        let want = run(cx, ReferenceBackend, case);
        let coop = run(cx, b.clone(), case);
        let seq = run(cx, b.clone().without_cooperative_reductions(), case);
        let t = &case.tols;
        let d_ref = close(&coop, &want, t, &format!("{} vs reference", case.name));
        let d_seq = close(&coop, &seq, t, &format!("{} vs sequential", case.name));
        close(
            &seq,
            &want,
            t,
            &format!("{} sequential vs reference", case.name),
        );
        println!(
            "gpu {}: max rel diff {d_ref:.1e} vs reference, {d_seq:.1e} vs one thread per output",
            case.name
        );
    });
}
