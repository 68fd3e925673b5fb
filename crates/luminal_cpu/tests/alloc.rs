//! After the first run for given dims, `run()` makes no heap allocation: buffers are planned
//! at compile time and reused. A counting global allocator checks it on an MLP graph.

use luminal::prelude::*;
use luminal::testing::CountingAlloc;
use luminal_cpu::{CpuBackend, CpuRuntime};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

/// Runs `rt` three times and returns the allocations made during the 2nd and 3rd runs.
fn allocs_in_runs_2_and_3(rt: &mut CpuRuntime) -> usize {
    rt.run().unwrap();
    GLOBAL.start();
    rt.run().unwrap();
    rt.run().unwrap();
    GLOBAL.stop()
}

/// Allocations during the 2nd and 3rd runs of an MLP (`with_matmul`) or of the same graph
/// with the matmuls replaced by elementwise products.
fn count_runs(
    keep: &mut Vec<CpuRuntime>,
    threads: usize,
    batch: usize,
    with_matmul: bool,
) -> usize {
    let cx = Graph::new();
    let x = cx.tensor("x", ("batch", 256));
    let w1 = cx.tensor("w1", (256, 512));
    let w2 = cx.tensor("w2", (512, 128));
    let y = if with_matmul {
        x.matmul(w1).relu().matmul(w2).softmax(1).output()
    } else {
        let h = (x.sum_keepdim(1) * w1.sum(0).expand(0, "batch")).relu();
        (h.sum_keepdim(1) * w2.max(0).expand(0, "batch"))
            .softmax(1)
            .output()
    };
    let mut rt = cx
        .compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap();
    rt.set(w1, &vec![0.01f32; 256 * 512]).unwrap();
    rt.set(w2, &vec![0.02f32; 512 * 128]).unwrap();
    rt.set_dim("batch", batch);
    rt.set(x, &vec![1.0f32; batch * 256]).unwrap();
    let n = allocs_in_runs_2_and_3(&mut rt);
    let out = rt.get::<f32>(y).unwrap();
    assert!((out[..128].iter().sum::<f32>() - 1.0).abs() < 1e-3);
    keep.push(rt);
    n
}

/// Allocations during the 2nd and 3rd runs of a graph of direct kernels: an embedding
/// gather of concatenated I32 ids (dynamic count), plus an `arange` iota, concatenated
/// with another f32 tensor.
fn count_direct_runs(keep: &mut Vec<CpuRuntime>, threads: usize, n: usize) -> usize {
    let cx = Graph::new();
    let table = cx.tensor("table", (64, 32));
    let ids = cx.input("ids", "n", DType::I32);
    let more = cx.input("more", 3, DType::I32);
    let extra = cx.tensor("extra", (5, 32));
    let all_ids = GraphTensor::concat(&[ids, more], 0);
    let rows = table.embedding(all_ids);
    let pos = cx.arange(Expression::var("n") + 3).expand(1, 32);
    let y = GraphTensor::concat(&[rows + pos, extra], 0).output();
    let mut rt = cx
        .compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap();
    let names = rt.kernel_names();
    for k in ["gather", "iota(affine)", "concat(0)"] {
        assert!(names.iter().any(|n| n == k), "no {k} kernel: {names:?}");
    }
    assert!(
        names.iter().all(|n| !n.starts_with("fallback")),
        "{names:?}"
    );
    rt.set(table, &vec![0.5f32; 64 * 32]).unwrap();
    rt.set(extra, &vec![2.0f32; 5 * 32]).unwrap();
    rt.set_dim("n", n);
    let picks: Vec<i32> = (0..n as i32).map(|i| i % 64).collect();
    rt.set(ids, &picks).unwrap();
    rt.set(more, &[63i32, 0, 1]).unwrap();
    let allocs = allocs_in_runs_2_and_3(&mut rt);
    let out = rt.get::<f32>(y).unwrap();
    assert_eq!(out.len(), (n + 3 + 5) * 32);
    assert_eq!(out[32 * (n + 1)], 0.5 + (n + 1) as f32);
    assert_eq!(out[32 * (n + 3)], 2.0);
    keep.push(rt);
    allocs
}

/// Allocations during the 2nd and 3rd runs of a half-precision layer: a matmul in `dtype`
/// (widened into the runtime's f32 scratch), a cast to f32, an f32 epilogue, a cast back.
fn count_half_runs(
    keep: &mut Vec<CpuRuntime>,
    threads: usize,
    batch: usize,
    dtype: DType,
) -> usize {
    let cx = Graph::new();
    let x = cx.input("x", ("batch", 256), dtype);
    let w = cx.input("w", (128, 256), dtype);
    let y = x
        .matmul(w.permute(&[1, 0]))
        .cast(DType::F32)
        .relu()
        .cast(dtype)
        .output();
    let mut rt = cx
        .compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap();
    let half = |v: f64, n: usize| HostData::from_f64(dtype, &vec![v; n]);
    rt.set_data(w, half(0.01, 128 * 256)).unwrap();
    rt.set_dim("batch", batch);
    rt.set_data(x, half(1.0, batch * 256)).unwrap();
    let n = allocs_in_runs_2_and_3(&mut rt);
    let out = rt.get_f32(y).unwrap();
    assert!((out[0] - 2.56).abs() < 0.02, "{}", out[0]);
    keep.push(rt);
    n
}

/// Allocations during the 2nd and 3rd runs of a half decode step: skinny products reading
/// the half weights in place (`[N, K]` and `[K, N]`), a fused half elementwise chain, and a
/// half reduction (f64 accumulators in the runtime's scratch).
fn count_half_decode_runs(keep: &mut Vec<CpuRuntime>, threads: usize, dtype: DType) -> usize {
    let cx = Graph::new();
    let x = cx.input("x", (1, 256), dtype);
    let w1 = cx.input("w1", (128, 256), dtype);
    let w2 = cx.input("w2", (128, 64), dtype);
    let v = cx.input("v", (40, 500), dtype);
    let h = x.matmul(w1.permute(&[1, 0]));
    let y = h.matmul(w2).output();
    let e = ((v * v + v).sqrt() * 0.5).exp2().output();
    let s = (v * v + 1.0).sum(1).output();
    let mut rt = cx
        .compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap();
    let names = rt.kernel_names();
    assert!(
        names.iter().all(|n| !n.starts_with("fallback")),
        "{names:?}"
    );
    let half = |v: f64, n: usize| HostData::from_f64(dtype, &vec![v; n]);
    rt.set_data(x, half(1.0, 256)).unwrap();
    rt.set_data(w1, half(0.01, 128 * 256)).unwrap();
    rt.set_data(w2, half(0.5, 128 * 64)).unwrap();
    rt.set_data(v, half(2.0, 40 * 500)).unwrap();
    let n = allocs_in_runs_2_and_3(&mut rt);
    // 256 · 0.01 rounds to 2.56 (in the half type), then 128 · 0.5 · that.
    let out = rt.get_f32(y).unwrap();
    assert!((out[0] - 163.8).abs() < 1.5, "{}", out[0]);
    let e0 = rt.get_f32(e).unwrap()[0];
    assert!((e0 - 2f32.powf(6f32.sqrt() / 2.0)).abs() < 0.02, "{e0}");
    let s0 = rt.get_f32(s).unwrap()[0];
    assert!((s0 - 2500.0).abs() <= 8.0, "{s0}");
    keep.push(rt);
    n
}

// One test function: the counter is global, so the cases must not run concurrently. Every
// runtime is kept alive to the end: a dropped runtime's pool threads exit in the background
// (allocating as they go) while the next case counts.
#[test]
fn second_and_third_runs_allocate_nothing() {
    let mut keep = vec![];
    for (threads, n) in [(1, 7), (2, 7), (2, 5000)] {
        assert_eq!(
            count_direct_runs(&mut keep, threads, n),
            0,
            "gather/iota/concat, {threads} threads, n = {n}"
        );
    }
    // Batch 1: the matmuls are matvecs (our axpy kernel on two threads, gemm's gemv on
    // one, which allocates nothing either), so nothing at all.
    for threads in [1, 2] {
        assert_eq!(
            count_runs(&mut keep, threads, 1, true),
            0,
            "{threads} threads, matvec"
        );
    }
    for (threads, batch) in [(1, 8), (2, 8), (2, 64)] {
        assert_eq!(
            count_runs(&mut keep, threads, batch, false),
            0,
            "{threads} threads, batch {batch}"
        );
        // The runtime allocates nothing, but `gemm` 0.18 allocates small `did_pack_lhs` flag
        // vectors inside each call (at most 2), and a product on a pool is split into one
        // single-threaded call per thread: 2 matmuls x 2 runs x threads x 2 at most.
        // Anything more is ours.
        let n = count_runs(&mut keep, threads, batch, true);
        assert!(
            n <= 8 * threads,
            "{threads} threads, batch {batch}: {n} allocations"
        );
    }
    // Half matmuls: the scratch is kept, so again nothing at batch 1, and at most gemm's
    // own flag vectors (1 matmul x 2 runs x threads calls x 2) otherwise.
    for dtype in [DType::F16, DType::BF16] {
        for threads in [1, 2] {
            let n = count_half_runs(&mut keep, threads, 1, dtype);
            assert_eq!(n, 0, "{dtype}, {threads} threads, matvec");
            let n = count_half_runs(&mut keep, threads, 16, dtype);
            assert!(n <= 4 * threads, "{dtype}, {threads} threads: {n}");
            let n = count_half_decode_runs(&mut keep, threads, dtype);
            assert_eq!(n, 0, "{dtype}, {threads} threads, half decode step");
        }
    }
}
