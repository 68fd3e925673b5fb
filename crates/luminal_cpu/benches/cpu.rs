//! `cargo bench -p luminal_cpu`: one markdown table, every row measured in this run, each
//! against a baseline measured on the same buffers (gemm called directly, on f16 data for
//! the f16 row and on the widened f32 data for the bf16 row, which gemm lacks; a plain
//! memcpy of the same bytes), at 1 and 2 threads.
//!
//! Timing: after a warm-up, ours and the baseline run alternately (so load from other
//! processes on a shared machine hits both alike) and each keeps its best time.
//! `LUMINAL_BENCH_REPS=<n>` multiplies the repetitions (default 1);
//! `LUMINAL_BENCH_FILTER=<substring>` runs only the rows whose name contains it.

use luminal::prelude::*;
use luminal_cpu::{CpuBackend, CpuRuntime};
use std::time::Instant;

fn time(f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Best times of `ours` and `base`, run alternately `reps` times after a warm-up.
fn compare(reps: usize, mut ours: impl FnMut(), mut base: impl FnMut()) -> (f64, f64) {
    let scale: usize = std::env::var("LUMINAL_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    ours();
    base();
    let (mut a, mut b) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps * scale.max(1) {
        a = a.min(time(&mut ours));
        b = b.min(time(&mut base));
    }
    (a, b)
}

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
        .collect()
}

fn compile(cx: &Graph, threads: usize) -> CpuRuntime {
    cx.compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap()
}

/// Runs baselines like the runtime runs kernels: on the caller for one thread, inside a
/// pool of `threads` otherwise.
struct Pool(Option<rayon::ThreadPool>);

impl Pool {
    fn new(threads: usize) -> Pool {
        Pool((threads > 1).then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        }))
    }
    fn install(&self, f: impl FnOnce() + Send) {
        match &self.0 {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}

/// Seconds per matmul through luminal, and through `gemm` directly on the same buffers.
/// `b_transposed`: the weight is stored `[n, k]` and used as `w.permute([1, 0])` (how
/// `Linear` keeps it).
fn matmul(
    (m, n, k): (usize, usize, usize),
    b_transposed: bool,
    threads: usize,
    reps: usize,
) -> (f64, f64) {
    matmul_views((m, n, k), false, b_transposed, threads, reps)
}

/// [`matmul`], where `a_transposed` also stores A as `[k, m]` and uses `a.permute([1, 0])`
/// (a weight gradient: activations transposed).
fn matmul_views(
    (m, n, k): (usize, usize, usize),
    a_transposed: bool,
    b_transposed: bool,
    threads: usize,
    reps: usize,
) -> (f64, f64) {
    let cx = Graph::new();
    let (a, av) = if a_transposed {
        let a = cx.tensor("a", (k, m));
        (a, a.permute(&[1, 0]))
    } else {
        let a = cx.tensor("a", (m, k));
        (a, a)
    };
    let (b, bv) = if b_transposed {
        let b = cx.tensor("b", (n, k));
        (b, b.permute(&[1, 0]))
    } else {
        let b = cx.tensor("b", (k, n));
        (b, b)
    };
    let _ = av.matmul(bv).output();
    let mut rt = compile(&cx, threads);
    let (ad, bd) = (data(m * k), data(k * n));
    rt.set(a, &ad).unwrap();
    rt.set(b, &bd).unwrap();
    let pool = Pool::new(threads);
    let mut dst = vec![0f32; m * n];
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // b's (column stride, row stride): along N, along K.
    let (cs_b, rs_b) = if b_transposed {
        (k as isize, 1)
    } else {
        (1, n as isize)
    };
    // a's (column stride, row stride): along K, along M.
    let (cs_a, rs_a) = if a_transposed {
        (m as isize, 1)
    } else {
        (1, k as isize)
    };
    compare(
        reps,
        || rt.run().unwrap(),
        || {
            pool.install(|| {
                // SAFETY: row-major m×k and m×n buffers of exactly those sizes; b holds
                // k×n elements addressed by (cs_b, rs_b).
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        dst.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        ad.as_ptr(),
                        cs_a,
                        rs_a,
                        bd.as_ptr(),
                        cs_b,
                        rs_b,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        par,
                    )
                }
            })
        },
    )
}

/// A plain memcpy of `bytes` bytes, run like the runtime runs kernels: rayon-chunked inside
/// a pool of `threads`, or on the caller for one thread.
struct Memcpy {
    src: Vec<f32>,
    dst: Vec<f32>,
    /// Where the copied ranges start in `src` / `dst` (see `new`).
    at: (usize, usize),
    n: usize,
    pool: Pool,
}

impl Memcpy {
    /// The source starts on a page boundary and the destination half a page past one.
    /// Without this the baseline is at the mercy of the allocator: on Zen 3, glibc's
    /// memcpy runs ~15× slower when the destination sits a few bytes after the source
    /// modulo 4 KiB (measured: 5 vs 80 GB/s for 288 KiB), which two adjacent heap
    /// allocations easily produce.
    fn new(bytes: usize, threads: usize) -> Memcpy {
        let n = bytes / 4;
        let (src, dst) = (data(n + 2048), vec![0f32; n + 2048]);
        let to_page = |p: *const f32| (4096 - p as usize % 4096) % 4096 / 4;
        let at = (to_page(src.as_ptr()), (to_page(dst.as_ptr()) + 512) % 1024);
        Memcpy {
            src,
            dst,
            at,
            n,
            pool: Pool::new(threads),
        }
    }
    fn run(&mut self) {
        use rayon::prelude::*;
        let src = &self.src[self.at.0..self.at.0 + self.n];
        let dst = &mut self.dst[self.at.1..self.at.1 + self.n];
        match &self.pool.0 {
            None => {
                for (d, s) in dst.chunks_mut(1 << 16).zip(src.chunks(1 << 16)) {
                    d.copy_from_slice(s)
                }
            }
            Some(p) => p.install(|| {
                dst.par_chunks_mut(1 << 16)
                    .zip(src.par_chunks(1 << 16))
                    .for_each(|(d, s)| d.copy_from_slice(s))
            }),
        }
        std::hint::black_box(&mut self.dst);
    }
}

/// Seconds per `[m, k] · [k, n]` matmul in f16 or bf16 through luminal, and of the
/// baseline on the same data: `gemm` called directly on the f16 buffers; for bf16 (which
/// gemm lacks) the f32 gemm on the data widened beforehand (conversion not timed).
fn half_matmul(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    threads: usize,
    reps: usize,
) -> (f64, f64) {
    use half::slice::HalfFloatSliceExt;
    let cx = Graph::new();
    let a = cx.input("a", (m, k), dtype);
    let b = cx.input("b", (k, n), dtype);
    let _ = a.matmul(b).output();
    let mut rt = compile(&cx, threads);
    let (ad, bd) = (data(m * k), data(k * n));
    let (a16, b16) = (
        ad.iter()
            .map(|&x| half::f16::from_f32(x))
            .collect::<Vec<_>>(),
        bd.iter()
            .map(|&x| half::f16::from_f32(x))
            .collect::<Vec<_>>(),
    );
    let (mut aw, mut bw) = (vec![0f32; m * k], vec![0f32; k * n]);
    if dtype == DType::F16 {
        rt.set(a, &a16).unwrap();
        rt.set(b, &b16).unwrap();
    } else {
        let (mut a_bf, mut b_bf) = (vec![half::bf16::ZERO; m * k], vec![half::bf16::ZERO; k * n]);
        a_bf.convert_from_f32_slice(&ad);
        b_bf.convert_from_f32_slice(&bd);
        a_bf.convert_to_f32_slice(&mut aw);
        b_bf.convert_to_f32_slice(&mut bw);
        rt.set(a, &a_bf).unwrap();
        rt.set(b, &b_bf).unwrap();
    }
    let pool = Pool::new(threads);
    let par = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let mut d16 = vec![half::f16::ZERO; m * n];
    let mut d32 = vec![0f32; m * n];
    compare(
        reps,
        || rt.run().unwrap(),
        || {
            pool.install(|| {
                // SAFETY: row-major m×k, k×n and m×n buffers of exactly those sizes, with
                // the matching strides.
                unsafe {
                    if dtype == DType::F16 {
                        gemm::gemm(
                            m,
                            n,
                            k,
                            d16.as_mut_ptr(),
                            1,
                            n as isize,
                            false,
                            a16.as_ptr(),
                            1,
                            k as isize,
                            b16.as_ptr(),
                            1,
                            n as isize,
                            half::f16::ZERO,
                            half::f16::ONE,
                            false,
                            false,
                            false,
                            par,
                        )
                    } else {
                        gemm::gemm(
                            m,
                            n,
                            k,
                            d32.as_mut_ptr(),
                            1,
                            n as isize,
                            false,
                            aw.as_ptr(),
                            1,
                            k as isize,
                            bw.as_ptr(),
                            1,
                            n as isize,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            par,
                        )
                    }
                }
            })
        },
    )
}

/// Seconds per `[m, k] · [k, n]` product in f16 or bf16 through luminal (the weight stored
/// `[n, k]` and permuted when `b_transposed`, as `Linear` keeps it), and of the same graph
/// in f32 on the widened values (what the half product computes, with twice the bytes).
fn half_skinny(
    dtype: DType,
    (m, n, k): (usize, usize, usize),
    b_transposed: bool,
    threads: usize,
    reps: usize,
) -> (f64, f64) {
    let build = |dt: DType| {
        let cx = Graph::new();
        let a = cx.input("a", (m, k), dt);
        let b_shape = if b_transposed { (n, k) } else { (k, n) };
        let b = cx.input("b", b_shape, dt);
        let bv = if b_transposed { b.permute(&[1, 0]) } else { b };
        let _ = a.matmul(bv).output();
        let mut rt = compile(&cx, threads);
        let (ad, bd) = (data(m * k), data(k * n));
        let round =
            |v: &[f32]| HostData::from_f64(dtype, &v.iter().map(|&x| x as f64).collect::<Vec<_>>());
        let (ah, bh) = (round(&ad), round(&bd));
        if dt == DType::F32 {
            rt.set(a, &ah.to_f32()).unwrap();
            rt.set(b, &bh.to_f32()).unwrap();
        } else {
            rt.set_data(a, ah).unwrap();
            rt.set_data(b, bh).unwrap();
        }
        rt
    };
    let (mut half_rt, mut f32_rt) = (build(dtype), build(DType::F32));
    compare(reps, || half_rt.run().unwrap(), || f32_rt.run().unwrap())
}

/// Seconds of a graph run, and of a plain rayon-chunked memcpy of `copy_bytes` bytes.
fn graph_vs_memcpy(
    build: for<'g> fn(&'g Graph) -> Vec<GraphTensor<'g>>,
    copy_bytes: usize,
    threads: usize,
    reps: usize,
) -> (f64, f64) {
    let cx = Graph::new();
    let ins = build(&cx);
    let mut rt = compile(&cx, threads);
    for t in ins {
        let n: usize = t
            .shape()
            .iter()
            .map(|d| d.as_constant().unwrap() as usize)
            .product();
        rt.set(t, &data(n)).unwrap();
    }
    let mut copy = Memcpy::new(copy_bytes, threads);
    compare(reps, || rt.run().unwrap(), || copy.run())
}

/// Seconds of a half-precision graph run (inputs of `dtype`), and of a plain memcpy of
/// `copy_bytes` bytes.
fn half_graph_vs_memcpy(
    dtype: DType,
    build: for<'g> fn(&'g Graph, DType) -> Vec<GraphTensor<'g>>,
    copy_bytes: usize,
    threads: usize,
    reps: usize,
) -> (f64, f64) {
    let cx = Graph::new();
    let ins = build(&cx, dtype);
    let mut rt = compile(&cx, threads);
    for t in ins {
        let n: usize = t
            .shape()
            .iter()
            .map(|d| d.as_constant().unwrap() as usize)
            .product();
        let v: Vec<f64> = data(n).iter().map(|&x| x as f64).collect();
        rt.set_data(t, HostData::from_f64(dtype, &v)).unwrap();
    }
    let mut copy = Memcpy::new(copy_bytes, threads);
    compare(reps, || rt.run().unwrap(), || copy.run())
}

fn half_chain(cx: &Graph, dtype: DType) -> Vec<GraphTensor<'_>> {
    let x = cx.input("x", N, dtype);
    let y = cx.input("y", N, dtype);
    let _ = ((((x * 1.5 + 0.5) * y + x) * 0.25) + y).output();
    vec![x, y]
}
fn half_row_sums(cx: &Graph, dtype: DType) -> Vec<GraphTensor<'_>> {
    let x = cx.input("x", (ROWS, COLS), dtype);
    let _ = x.sum(1).output();
    vec![x]
}

const N: usize = 16 << 20;
const ROWS: usize = 4096;
const COLS: usize = 2048;

fn chain(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", N);
    let y = cx.tensor("y", N);
    let _ = ((((x * 1.5 + 0.5) * y + x) * 0.25) + y).output();
    vec![x, y]
}
fn add2(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", N);
    let y = cx.tensor("y", N);
    let _ = (x + y).output();
    vec![x, y]
}
fn softmax(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", (ROWS, COLS));
    let _ = x.softmax(1).output();
    vec![x]
}
/// Attention-score rows of a small training step: 4096 rows of 64.
const SHORT_ROWS: usize = 4096;
const SHORT_COLS: usize = 64;
fn softmax_short(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", (SHORT_ROWS, SHORT_COLS));
    let _ = x.softmax(1).output();
    vec![x]
}
fn layer_norm_short(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", (SHORT_ROWS, SHORT_COLS));
    let _ = x.layer_norm(1, 1e-5).output();
    vec![x]
}
/// GELU over an FFN activation of a small training step (1024 tokens × 256).
const ACT: usize = 1024 * 256;
fn gelu(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", ACT);
    let _ = x.gelu().output();
    vec![x]
}
fn gelu_tanh(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", ACT);
    let _ = x.gelu_tanh().output();
    vec![x]
}
fn rms(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let x = cx.tensor("x", (ROWS, COLS));
    let _ = x.rms_norm(1, 1e-5).output();
    vec![x]
}
const CONCAT_ROWS: usize = 4096;
const CONCAT_COLS: usize = 1024;
fn concat_last(cx: &Graph) -> Vec<GraphTensor<'_>> {
    let a = cx.tensor("a", (CONCAT_ROWS, CONCAT_COLS));
    let b = cx.tensor("b", (CONCAT_ROWS, CONCAT_COLS));
    let _ = GraphTensor::concat(&[a, b], 1).output();
    vec![a, b]
}

const VOCAB: usize = 49152;
const EMBED: usize = 576;
const GATHERED: usize = 128;

/// Seconds of an embedding lookup (`GATHERED` spread-out rows of a `VOCAB×EMBED` f32
/// table), and of a plain memcpy of the gathered bytes.
fn gather_vs_memcpy(threads: usize, reps: usize) -> (f64, f64) {
    let cx = Graph::new();
    let table = cx.tensor("table", (VOCAB, EMBED));
    let ids = cx.input("ids", GATHERED, DType::I32);
    let _ = table.embedding(ids).output();
    let mut rt = compile(&cx, threads);
    rt.set(table, &data(VOCAB * EMBED)).unwrap();
    let picks: Vec<i32> = (0..GATHERED)
        .map(|i| ((i * 7919 + 13) % VOCAB) as i32)
        .collect();
    rt.set(ids, &picks).unwrap();
    let mut copy = Memcpy::new(GATHERED * EMBED * 4, threads);
    compare(reps, || rt.run().unwrap(), || copy.run())
}

/// A table row of a product measured at 1 and 2 threads: GFLOP/s, the ratio to the
/// baseline's time at each, and the 2-thread speedup (`r`: (ours, baseline) seconds).
fn flops_row(name: &str, flops: f64, r: &[(f64, f64)], baseline: &str) -> String {
    format!(
        "| {name} | {:.1} GFLOP/s | {:.1} GFLOP/s | {:.2}× {baseline} | {:.2}× {baseline} | {:.2}× |",
        flops / r[0].0 / 1e9,
        flops / r[1].0 / 1e9,
        r[0].1 / r[0].0,
        r[1].1 / r[1].0,
        r[0].0 / r[1].0
    )
}

fn main() {
    let filter = std::env::var("LUMINAL_BENCH_FILTER").unwrap_or_default();
    let wanted = |name: &str| name.contains(filter.as_str());
    let mut rows: Vec<String> = vec![];
    let gb = |bytes: f64, s: f64| bytes / s / 1e9;
    for &(m, n, k, transposed, reps) in &[
        (256, 256, 256, false, 50),
        (1024, 1024, 1024, false, 5),
        (2048, 2048, 512, false, 4),
        (4096, 1536, 384, true, 6),
        (4096, 384, 1536, true, 6),
        (4096, 384, 384, true, 12),
        (32, 3072, 768, true, 100),
        (16, 4096, 4096, true, 20),
        (1, 1536, 576, false, 2000),
        (1, 1536, 576, true, 2000),
        (1, 49152, 576, true, 20),
    ] {
        let flops = 2.0 * (m * n * k) as f64;
        let name = if m == 1 {
            let layout = if transposed {
                "[N,K] weight"
            } else {
                "[K,N] weight"
            };
            format!("matvec {m}×{k}·{k}×{n} ({layout})")
        } else {
            format!("matmul {m}×{n}×{k}")
        };
        if !wanted(&name) {
            continue;
        }
        let r: Vec<(f64, f64)> = [1, 2]
            .iter()
            .map(|&t| matmul((m, n, k), transposed, t, reps))
            .collect();
        rows.push(flops_row(&name, flops, &r, "gemm"));
    }
    // A training step's products (the tiny GPT of `examples/tiny_gpt.rs`: 1024 tokens, width
    // 64, FFN 256): forward `x·Wᵀ`, input gradient `dy·W`, weight gradient `dyᵀ·x`.
    for &(m, n, k, at, bt) in &[
        (1024, 192, 64, false, true),
        (1024, 256, 64, false, true),
        (1024, 64, 256, false, true),
        (1024, 64, 192, false, false),
        (1024, 256, 64, false, false),
        (1024, 64, 256, false, false),
        (192, 64, 1024, true, false),
        (256, 64, 1024, true, false),
        (64, 256, 1024, true, false),
    ] {
        let layout = match (at, bt) {
            (false, true) => "x·Wᵀ",
            (false, false) => "dy·W",
            _ => "dyᵀ·x",
        };
        let name = format!("train matmul {m}×{n}×{k} ({layout})");
        if !wanted(&name) {
            continue;
        }
        let flops = 2.0 * (m * n * k) as f64;
        let r: Vec<(f64, f64)> = [1, 2]
            .iter()
            .map(|&t| matmul_views((m, n, k), at, bt, t, 200))
            .collect();
        rows.push(flops_row(&name, flops, &r, "gemm"));
    }
    for (dtype, baseline) in [(DType::F16, "gemm f16"), (DType::BF16, "gemm f32")] {
        let (m, n, k) = (1024, 1024, 1024);
        let name = format!("matmul {dtype} {m}×{n}×{k}");
        if !wanted(&name) {
            continue;
        }
        let flops = 2.0 * (m * n * k) as f64;
        let r: Vec<(f64, f64)> = [1, 2]
            .iter()
            .map(|&t| half_matmul(dtype, (m, n, k), t, 5))
            .collect();
        rows.push(flops_row(&name, flops, &r, baseline));
    }
    for (dtype, transposed) in [
        (DType::F16, true),
        (DType::BF16, true),
        (DType::F16, false),
        (DType::BF16, false),
    ] {
        let (m, n, k) = (1, 1536, 576);
        let layout = if transposed { "[N,K]" } else { "[K,N]" };
        let name = format!("matvec {dtype} {m}×{k}·{k}×{n} ({layout} weight)");
        if !wanted(&name) {
            continue;
        }
        let flops = 2.0 * (m * n * k) as f64;
        let r: Vec<(f64, f64)> = [1, 2]
            .iter()
            .map(|&t| half_skinny(dtype, (m, n, k), transposed, t, 300))
            .collect();
        rows.push(flops_row(&name, flops, &r, "f32 matvec"));
    }
    type Build = for<'g> fn(&'g Graph) -> Vec<GraphTensor<'g>>;
    // Bytes = inputs read + output written; the memcpy copies half that many bytes (so it
    // reads and writes the same total).
    let concat_bytes = 4 * CONCAT_ROWS * CONCAT_COLS * 4;
    let short = 2 * SHORT_ROWS * SHORT_COLS * 4;
    let cases: [(&str, Build, usize, usize); 9] = [
        ("elementwise chain (6 ops) 16M", chain, 3 * N * 4, 20),
        ("elementwise add (1 op) 16M", add2, 3 * N * 4, 20),
        ("softmax 4096×2048", softmax, 2 * ROWS * COLS * 4, 20),
        ("rms_norm 4096×2048", rms, 2 * ROWS * COLS * 4, 20),
        (
            "concat 2×[4096,1024] last axis",
            concat_last,
            concat_bytes,
            20,
        ),
        ("softmax 4096×64 (short rows)", softmax_short, short, 300),
        (
            "layer_norm 4096×64 (short rows)",
            layer_norm_short,
            short,
            300,
        ),
        ("gelu (erf) 256K", gelu, 2 * ACT * 4, 300),
        ("gelu_tanh 256K", gelu_tanh, 2 * ACT * 4, 300),
    ];
    for (name, build, bytes, reps) in cases {
        if !wanted(name) {
            continue;
        }
        let r: Vec<(f64, f64)> = [1, 2]
            .iter()
            .map(|&th| graph_vs_memcpy(build, bytes / 2, th, reps))
            .collect();
        rows.push(format!(
            "| {name} | {:.1} GB/s | {:.1} GB/s | {:.2}× memcpy | {:.2}× memcpy | {:.2}× |",
            gb(bytes as f64, r[0].0),
            gb(bytes as f64, r[1].0),
            r[0].1 / r[0].0,
            r[1].1 / r[1].0,
            r[0].0 / r[1].0
        ));
    }
    type HalfBuild = for<'g> fn(&'g Graph, DType) -> Vec<GraphTensor<'g>>;
    for dtype in [DType::F16, DType::BF16] {
        // Bytes = inputs read + output written (2 bytes an element).
        let half_cases: [(String, HalfBuild, usize); 2] = [
            (
                format!("elementwise chain (6 ops) {dtype} 16M"),
                half_chain,
                3 * N * 2,
            ),
            (
                format!("sum rows {dtype} 4096×2048"),
                half_row_sums,
                (ROWS * COLS + ROWS) * 2,
            ),
        ];
        for (name, build, bytes) in half_cases {
            if !wanted(&name) {
                continue;
            }
            let r: Vec<(f64, f64)> = [1, 2]
                .iter()
                .map(|&th| half_graph_vs_memcpy(dtype, build, bytes / 2, th, 8))
                .collect();
            rows.push(format!(
                "| {name} | {:.1} GB/s | {:.1} GB/s | {:.2}× memcpy | {:.2}× memcpy | {:.2}× |",
                gb(bytes as f64, r[0].0),
                gb(bytes as f64, r[1].0),
                r[0].1 / r[0].0,
                r[1].1 / r[1].0,
                r[0].0 / r[1].0
            ));
        }
    }
    let name = format!("embedding gather {GATHERED} rows of {VOCAB}×{EMBED}");
    if wanted(&name) {
        // Bytes = rows read + output written; the baseline copies the gathered bytes once.
        let bytes = 2 * GATHERED * EMBED * 4;
        let r: Vec<(f64, f64)> = [1, 2].iter().map(|&t| gather_vs_memcpy(t, 200)).collect();
        rows.push(format!(
            "| {name} | {:.1} GB/s | {:.1} GB/s | {:.2}× memcpy | {:.2}× memcpy | {:.2}× |",
            gb(bytes as f64, r[0].0),
            gb(bytes as f64, r[1].0),
            r[0].1 / r[0].0,
            r[1].1 / r[1].0,
            r[0].0 / r[1].0
        ));
    }
    println!("| benchmark | 1 thread | 2 threads | ratio (1 thread) | ratio (2 threads) | 2-thread speedup |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
