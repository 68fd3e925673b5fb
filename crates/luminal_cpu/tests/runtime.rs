//! Fusion (kernel counts), dynamic dims, profiles and the typed errors of `CpuRuntime`.

use luminal::prelude::*;
use luminal::testing::uniform as noise;
use luminal_cpu::{CpuBackend, CpuRuntime};

fn compile(cx: &Graph) -> CpuRuntime {
    cx.compile(CpuBackend::default(), CompileOptions::default())
        .unwrap()
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 97) as f32 / 50.0 - 1.0)
        .collect()
}

/// Runs the same graph on the reference runtime and compares.
fn check_against_reference(cx: &Graph, inputs: &[(GraphTensor, Vec<f32>)], out: GraphTensor) {
    let mut rt = compile(cx);
    let mut re = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    for (t, d) in inputs {
        rt.set(*t, d).unwrap();
        re.set(*t, d).unwrap();
    }
    rt.run().unwrap();
    re.run().unwrap();
    let (a, b) = (rt.get::<f32>(out).unwrap(), re.get::<f32>(out).unwrap());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-4 + 1e-4 * y.abs(), "{x} vs {y}");
    }
}

#[test]
fn shared_producers_fuse_into_their_one_consumer_kernel() {
    // erf's polynomial reads `t` and `x/√2` several times; all of GELU is one loop.
    for tanh in [false, true] {
        let cx = Graph::new();
        let x = cx.tensor("x", (4, 300));
        let y = if tanh { x.gelu_tanh() } else { x.gelu() }.output();
        let rt = compile(&cx);
        assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
        check_against_reference(&cx, &[(x, ramp(1200))], y);
    }
    // A shared producer also read by an output stays a kernel of its own (and is right).
    let cx = Graph::new();
    let x = cx.tensor("x", 64);
    let t = (x * 2.0).exp();
    let a = t.output();
    let b = (t * t + t).output();
    let rt = compile(&cx);
    assert_eq!(rt.kernel_count(), 2, "{:?}", rt.kernel_names());
    check_against_reference(&cx, &[(x, ramp(64))], a);
    check_against_reference(&cx, &[(x, ramp(64))], b);
}

#[test]
fn softmax_is_one_kernel() {
    let cx = Graph::new();
    let x = cx.tensor("x", (8, 100));
    let y = x.softmax(1).output();
    let rt = compile(&cx);
    // One row kernel: max-reduce, exp (kept in a row register), sum-reduce, normalise.
    assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
    check_against_reference(&cx, &[(x, ramp(800))], y);
}

#[test]
fn rms_norm_is_one_kernel() {
    let cx = Graph::new();
    let x = cx.tensor("x", (8, 64));
    let y = x.rms_norm(1, 1e-5).output();
    let rt = compile(&cx);
    // One row kernel: sum of squares, then scale (the per-row sqrt/recip once per row).
    assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
    check_against_reference(&cx, &[(x, ramp(512))], y);
}

#[test]
fn norms_and_log_softmax_are_one_kernel() {
    for which in 0..3 {
        let cx = Graph::new();
        let x = cx.tensor("x", (6, 2, 70));
        let y = match which {
            0 => x.layer_norm(-1, 1e-5),
            1 => x.log_softmax(-1),
            _ => (x.softmax(-1) * 2.0 + x).exp().sum(-1),
        }
        .output();
        let rt = compile(&cx);
        assert_eq!(rt.kernel_count(), 1, "{which}: {:?}", rt.kernel_names());
        check_against_reference(&cx, &[(x, ramp(840))], y);
    }
}

#[test]
fn row_fusion_with_dynamic_rows_and_length() {
    let cx = Graph::new();
    let x = cx.tensor("x", ("a", "b"));
    let g = cx.tensor("g", "b");
    let y = (x.rms_norm(1, 1e-6) * g.expand(0, "a")).softmax(1).output();
    let mut rt = compile(&cx);
    let mut re = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
    for (a, b) in [(3usize, 5usize), (1, 1300), (7, 0), (0, 4), (40, 33)] {
        for r in [&mut rt as &mut dyn DynRuntime, &mut re] {
            r.dim("a", a);
            r.dim("b", b);
            r.put(x, ramp(a * b));
            r.put(g, ramp(b));
            r.go();
        }
        let (p, q) = (rt.get::<f32>(y).unwrap(), re.get::<f32>(y).unwrap());
        assert_eq!(p.len(), a * b);
        for (u, v) in p.iter().zip(&q) {
            assert!(
                (u - v).abs() <= 1e-5 + 1e-4 * v.abs(),
                "{a}x{b}: {u} vs {v}"
            );
        }
    }
}

/// Object-safe slice of `Runtime` for looping over two runtimes.
trait DynRuntime {
    fn dim(&mut self, n: &str, v: usize);
    fn put(&mut self, t: GraphTensor, d: Vec<f32>);
    fn go(&mut self);
}
impl<R: Runtime> DynRuntime for R {
    fn dim(&mut self, n: &str, v: usize) {
        self.set_dim(n, v)
    }
    fn put(&mut self, t: GraphTensor, d: Vec<f32>) {
        self.set(t, &d).unwrap()
    }
    fn go(&mut self) {
        self.run().unwrap()
    }
}

/// A row of an f32 product does not depend on the rows computed with it: the first 10 rows
/// of a 34-row product equal a 10-row product bit for bit, at both precisions, on 1 and 2
/// threads (where the CPU has AMX, the choice of kernel depends on N and K only; a cached
/// prefill's positions then equal the full recompute's), and both are within f32 accuracy
/// (or PyTorch's "high" bound) of f64 sums.
#[test]
fn f32_product_rows_do_not_depend_on_the_row_count() {
    let (k, n) = (200, 160);
    let a = noise(34 * k, 1);
    let w = noise(k * n, 2);
    for precision in [
        luminal_cpu::MatmulPrecision::Highest,
        luminal_cpu::MatmulPrecision::High,
    ] {
        for threads in [1, 2] {
            let run = |m: usize| {
                let cx = Graph::new();
                let x = cx.tensor("x", (m, k));
                let wt = cx.tensor("w", (k, n));
                let y = x.matmul(wt).output();
                let backend = CpuBackend::with_threads(threads).matmul_precision(precision);
                let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
                rt.set(x, &a[..m * k]).unwrap();
                rt.set(wt, &w).unwrap();
                rt.run().unwrap();
                rt.get::<f32>(y).unwrap()
            };
            let (full, part) = (run(34), run(10));
            assert!(
                full[..10 * n] == part[..],
                "{precision:?}, {threads} threads: rows differ"
            );
            let rel = match precision {
                luminal_cpu::MatmulPrecision::Highest => 4.0 * f32::EPSILON as f64,
                luminal_cpu::MatmulPrecision::High => 2f64.powi(-15),
            };
            for i in 0..34 {
                for j in 0..n {
                    let (mut want, mut mag) = (0f64, 0f64);
                    for p in 0..k {
                        let t = a[i * k + p] as f64 * w[p * n + j] as f64;
                        want += t;
                        mag += t.abs();
                    }
                    let got = full[i * n + j] as f64;
                    assert!(
                        (got - want).abs() <= rel * mag,
                        "{precision:?} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn mlp_block_is_gemms_plus_fused_epilogues() {
    let cx = Graph::new();
    let x = cx.tensor("x", (4, 32));
    let w1 = cx.tensor("w1", (32, 64));
    let b1 = cx.tensor("b1", 64);
    let w2 = cx.tensor("w2", (64, 16));
    let h = (x.matmul(w1) + b1.expand(0, 4)).relu();
    let y = h.matmul(w2).output();
    let rt = compile(&cx);
    let names = rt.kernel_names();
    // The bias add and relu (`maximum` with 0: a max-reduce over a padded pair, lowered to
    // an elementwise max with the zero as an immediate) run as the first gemm's epilogue.
    assert_eq!(names, ["matmul+[Add,Max]", "matmul"], "{names:?}");
    check_against_reference(
        &cx,
        &[
            (x, ramp(128)),
            (w1, ramp(2048)),
            (b1, ramp(64)),
            (w2, ramp(1024)),
        ],
        y,
    );
}

#[test]
fn swiglu_mlp_runs_as_gemms_with_epilogues() {
    // Llama's MLP with its residual: x + down(silu(x·gate) * (x·up)). The gate·up product
    // absorbs silu and the multiply, the down product the residual add: three gemms and no
    // separate elementwise kernel. Sizes above a block and odd, on 1 and 2 threads.
    for threads in [1, 2] {
        let cx = Graph::new();
        let (s, d, h) = (37, 96, 160);
        let x = cx.tensor("x", (s, d));
        let wg = cx.tensor("wg", (h, d));
        let wu = cx.tensor("wu", (h, d));
        let wd = cx.tensor("wd", (d, h));
        let t = x.matmul(wg.permute(&[1, 0])).silu() * x.matmul(wu.permute(&[1, 0]));
        let y = (x + t.matmul(wd.permute(&[1, 0]))).output();
        let rt = cx
            .compile(CpuBackend::with_threads(threads), CompileOptions::default())
            .unwrap();
        let names = rt.kernel_names();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("matmul")), "{names:?}");
        assert_eq!(names.iter().filter(|n| n.starts_with("matmul+")).count(), 2);
        check_against_reference(
            &cx,
            &[
                (x, noise(s * d, 1)),
                (wg, noise(h * d, 2)),
                (wu, noise(h * d, 3)),
                (wd, noise(d * h, 4)),
            ],
            y,
        );
    }
}

#[test]
fn epilogues_on_batched_and_skinny_products() {
    // Batched scores scaled and biased by a broadcast mask (attention-like), M = 1 decode
    // products (skinny path) with a bias, and an epilogue that also reads a leaf through
    // a transposed view.
    let cx = Graph::new();
    let q = cx.tensor("q", (3, 5, 8));
    let k = cx.tensor("k", (3, 7, 8));
    let mask = cx.tensor("mask", (5, 7));
    let scores = (q.matmul(k.transpose(1, 2)) * 0.35 + mask.expand(0, 3)).output();
    let v = cx.tensor("v", (1, 64));
    let w = cx.tensor("w", (48, 64));
    let b = cx.tensor("b", (1, 48));
    let dec = (v.matmul(w.permute(&[1, 0])) + b).relu().output();
    let p = cx.tensor("p", (6, 4));
    let r = cx.tensor("r", (4, 6));
    let tr = (p.matmul(r)
        * r.permute(&[1, 0])
            .matmul(p.permute(&[1, 0]))
            .permute(&[1, 0]))
    .output();
    let rt = compile(&cx);
    let names = rt.kernel_names();
    assert_eq!(
        names.iter().filter(|n| n.starts_with("matmul+")).count(),
        3,
        "{names:?}"
    );
    let inputs = [
        (q, noise(120, 5)),
        (k, noise(168, 6)),
        (mask, noise(35, 7)),
        (v, noise(64, 8)),
        (w, noise(48 * 64, 9)),
        (b, noise(48, 10)),
        (p, noise(24, 11)),
        (r, noise(24, 12)),
    ];
    check_against_reference(&cx, &inputs, scores);
    check_against_reference(&cx, &inputs, dec);
    check_against_reference(&cx, &inputs, tr);
}

#[test]
fn shared_or_output_products_are_not_epilogues() {
    // A product read twice, or that is itself an output, keeps its own buffer.
    let cx = Graph::new();
    let a = cx.tensor("a", (9, 12));
    let b = cx.tensor("b", (12, 10));
    let m = a.matmul(b);
    let y1 = (m * m + 1.0).output();
    let m2 = a.matmul(b * 2.0).output();
    let y2 = (m2 - 3.0).output();
    let rt = compile(&cx);
    let names = rt.kernel_names();
    assert!(!names.iter().any(|n| n.starts_with("matmul+")), "{names:?}");
    let inputs = [(a, noise(108, 13)), (b, noise(120, 14))];
    check_against_reference(&cx, &inputs, y1);
    check_against_reference(&cx, &inputs, m2);
    check_against_reference(&cx, &inputs, y2);
}

#[test]
fn bool_logic_fuses_into_one_kernel() {
    // Comparisons of floats and of bools, not / and / or (Mul, Add then != 0), a bool
    // constant, and the mask applied in f32: one fused kernel, no reference fallback.
    let cx = Graph::new();
    let a = cx.tensor("a", (7, 300));
    let b = cx.tensor("b", (7, 300));
    let m = a
        .lt(b)
        .and(b.lt(0.25).not())
        .or(a.gt(0.5))
        .or(a.lt(-0.5).and(b.gt(-0.5)));
    let y = (m.cast(DType::F32) * a + b).output();
    let rt = compile(&cx);
    assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
    check_against_reference(&cx, &[(a, noise(2100, 21)), (b, noise(2100, 22))], y);
}

#[test]
fn elementwise_chain_is_one_kernel() {
    let cx = Graph::new();
    let a = cx.tensor("a", (3, 5));
    let b = cx.tensor("b", (5, 3));
    let y = ((a * 2.0 + b.permute(&[1, 0])).sin() * a + 1.0)
        .sqrt()
        .output();
    let rt = compile(&cx);
    assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
    check_against_reference(&cx, &[(a, ramp(15)), (b, ramp(15))], y);
}

#[test]
fn transposed_and_batched_matmuls_use_gemm() {
    let cx = Graph::new();
    let a = cx.tensor("a", (2, 5, 3));
    let b = cx.tensor("b", (2, 4, 3));
    let y = a.matmul(b.transpose(1, 2)).output();
    let rt = compile(&cx);
    assert_eq!(rt.kernel_names(), vec!["matmul".to_string()]);
    check_against_reference(&cx, &[(a, ramp(30)), (b, ramp(24))], y);
}

#[test]
fn matvec_layouts_match_reference() {
    // M = 1 products take the dot / axpy matvec path: both weight layouts, batched with
    // broadcast weights and per-batch operands, odd K and N.
    for (k, n) in [(5, 3), (37, 19), (64, 256), (300, 513)] {
        let cx = Graph::new();
        let x = cx.tensor("x", (1, k));
        let w = cx.tensor("w", (k, n));
        let wt = cx.tensor("wt", (n, k));
        let q = cx.tensor("q", (3, 1, k));
        let kv = cx.tensor("kv", (3, n, k));
        let y1 = x.matmul(w).output();
        let y2 = x.matmul(wt.permute(&[1, 0])).output();
        let y3 = q.matmul(kv.transpose(1, 2)).output();
        let y4 = q.matmul(w.expand(0, 3)).output();
        let mut rt = compile(&cx);
        let mut re = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        let ins = [
            (x, ramp(k)),
            (w, ramp(k * n)),
            (wt, ramp(n * k)),
            (q, ramp(3 * k)),
            (kv, ramp(3 * n * k)),
        ];
        for (t, d) in &ins {
            rt.set(*t, d).unwrap();
            re.set(*t, d).unwrap();
        }
        rt.run().unwrap();
        re.run().unwrap();
        for y in [y1, y2, y3, y4] {
            let (a, b) = (rt.get::<f32>(y).unwrap(), re.get::<f32>(y).unwrap());
            assert_eq!(a.len(), b.len());
            for (p, q) in a.iter().zip(&b) {
                assert!(
                    (p - q).abs() <= 1e-4 + 1e-5 * q.abs(),
                    "{k}x{n}: {p} vs {q}"
                );
            }
        }
    }
}

#[test]
fn dynamic_dims_without_recompiling() {
    let cx = Graph::new();
    let x = cx.tensor("x", ("seq", 16));
    let w = cx.tensor("w", (16, 8));
    let y = x.matmul(w).softmax(1).output();
    let mut rt = compile(&cx);
    let mut re = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    rt.set(w, &ramp(128)).unwrap();
    re.set(w, &ramp(128)).unwrap();
    for seq in [3usize, 1, 7, 7, 2] {
        rt.set_dim("seq", seq);
        re.set_dim("seq", seq);
        rt.set(x, &ramp(seq * 16)).unwrap();
        re.set(x, &ramp(seq * 16)).unwrap();
        rt.run().unwrap();
        re.run().unwrap();
        let (a, b) = (rt.get::<f32>(y).unwrap(), re.get::<f32>(y).unwrap());
        assert_eq!(a.len(), seq * 8);
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-5, "seq {seq}: {p} vs {q}");
        }
    }
}

#[test]
fn profile_lists_every_kernel() {
    let cx = Graph::new();
    let x = cx.tensor("x", (4, 4));
    let _ = (x.matmul(x) + 1.0).sum(1).output();
    let mut rt = compile(&cx);
    rt.set(x, &ramp(16)).unwrap();
    rt.set_profile(true);
    rt.run().unwrap();
    let p = rt.profile();
    assert!(p.contains("matmul") && p.contains("SumReduce"), "{p}");
}

#[test]
fn single_thread_backend_matches() {
    let cx = Graph::new();
    let x = cx.tensor("x", (64, 300));
    let y = x.softmax(1).output();
    let mut rt = cx
        .compile(CpuBackend::with_threads(1), CompileOptions::default())
        .unwrap();
    assert_eq!(rt.threads(), 1);
    rt.set(x, &ramp(64 * 300)).unwrap();
    rt.run().unwrap();
    let out = rt.get::<f32>(y).unwrap();
    let row: f32 = out[..300].iter().sum();
    assert!((row - 1.0).abs() < 1e-5);
}

// ------------------------------------------------------------------------ typed errors

#[test]
fn wrong_length_and_dtype() {
    let cx = Graph::new();
    let a = cx.tensor("a", (2, 3));
    let i = cx.input("i", 3, DType::I32);
    let b = (a * 2.0).output();
    let c = (i * 2).output();
    let mut rt = compile(&cx);
    assert_eq!(
        rt.set(a, &[1.0f32; 5]).unwrap_err(),
        LuminalError::WrongLength {
            tensor: "a".into(),
            expected: 6,
            got: 5
        }
    );
    assert!(matches!(
        rt.set(i, &[1.0f32, 2.0, 3.0]),
        Err(LuminalError::WrongDType { .. })
    ));
    rt.set(a, &[1.0f32; 6]).unwrap();
    rt.set(i, &[1i32, 2, 3]).unwrap();
    rt.run().unwrap();
    assert!(matches!(
        rt.get::<i32>(b),
        Err(LuminalError::WrongDType { .. })
    ));
    assert_eq!(rt.get::<i32>(c).unwrap(), vec![2, 4, 6]);
}

#[test]
fn dynamic_length_checked_at_run() {
    let cx = Graph::new();
    let a = cx.tensor("a", ("seq", 2));
    let b = (a + 1.0).output();
    let mut rt = compile(&cx);
    rt.set(a, &[1.0f32; 6]).unwrap();
    assert_eq!(rt.run(), Err(LuminalError::UnboundDim("seq".into())));
    rt.set_dim("seq", 2);
    assert!(matches!(
        rt.run(),
        Err(LuminalError::WrongLength {
            expected: 4,
            got: 6,
            ..
        })
    ));
    rt.set_dim("seq", 3);
    rt.run().unwrap();
    assert_eq!(rt.get::<f32>(b).unwrap(), vec![2.0; 6]);
}

#[test]
fn unknown_not_input_not_output_not_computed_missing() {
    let cx = Graph::new();
    let a = cx.tensor("a", 2);
    let b = cx.tensor("b", 2);
    let hidden = a.exp2();
    let shown = (hidden + b).output();
    let mut rt = compile(&cx);
    let other = Graph::new();
    let x = other.tensor("x", 2);
    assert!(matches!(
        rt.set(x, &[1.0f32, 2.0]),
        Err(LuminalError::UnknownTensor(_))
    ));
    assert!(matches!(
        rt.set(shown, &[1.0f32, 2.0]),
        Err(LuminalError::NotAnInput(_))
    ));
    assert!(matches!(
        rt.get::<f32>(shown),
        Err(LuminalError::NotComputed(_))
    ));
    rt.set(a, &[0.0f32, 1.0]).unwrap();
    assert_eq!(rt.run(), Err(LuminalError::MissingInput("b".into())));
    rt.set(b, &[1.0f32, 1.0]).unwrap();
    rt.run().unwrap();
    assert!(matches!(
        rt.get::<f32>(hidden),
        Err(LuminalError::NotAnOutput(_))
    ));
    assert_eq!(rt.get::<f32>(shown).unwrap(), vec![2.0, 3.0]);
    // Inputs persist across runs.
    rt.run().unwrap();
    assert_eq!(rt.get::<f32>(shown).unwrap(), vec![2.0, 3.0]);
}

#[test]
fn gather_index_out_of_range() {
    let cx = Graph::new();
    let table = cx.tensor("table", (3, 2));
    let ids = cx.input("ids", 2, DType::I32);
    let _ = table.embedding(ids).output();
    let mut rt = compile(&cx);
    rt.set(table, &[0.0f32; 6]).unwrap();
    rt.set(ids, &[0i32, 3]).unwrap();
    assert_eq!(
        rt.run(),
        Err(LuminalError::IndexOutOfRange {
            op: "Gather".into(),
            index: 3,
            size: 3
        })
    );
}

#[test]
fn products_split_over_the_pool_match_reference() {
    // Large enough products are cut into one gemm block per thread: along N when wide,
    // along M otherwise; with transposed and batched operands, on 2 and 3 threads.
    for threads in [2, 3] {
        for (batch, m, n, k) in [(1, 100, 200, 50), (2, 300, 40, 40), (1, 7, 1000, 33)] {
            let cx = Graph::new();
            let a = cx.tensor("a", (batch, m, k));
            let b = cx.tensor("b", (batch, n, k));
            let c = cx.tensor("c", (k, n));
            let y1 = a.matmul(b.transpose(1, 2)).output();
            let y2 = a.matmul(c.expand(0, batch)).output();
            let mut rt = cx
                .compile(CpuBackend::with_threads(threads), CompileOptions::default())
                .unwrap();
            let mut re = cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap();
            let ins = [
                (a, noise(batch * m * k, 5)),
                (b, noise(batch * n * k, 6)),
                (c, noise(k * n, 7)),
            ];
            for (t, d) in &ins {
                rt.set(*t, d).unwrap();
                re.set(*t, d).unwrap();
            }
            rt.run().unwrap();
            re.run().unwrap();
            for y in [y1, y2] {
                let (p, q) = (rt.get::<f32>(y).unwrap(), re.get::<f32>(y).unwrap());
                assert_eq!(p.len(), q.len());
                for (i, (p, q)) in p.iter().zip(&q).enumerate() {
                    assert!(
                        (p - q).abs() <= 1e-4 + 1e-5 * q.abs(),
                        "{threads} threads, {batch}x{m}x{n}x{k} [{i}]: {p} vs {q}"
                    );
                }
            }
        }
    }
}

/// GELU (both forms) never outputs a subnormal: the next product reading subnormal
/// activations runs several times slower (Whisper's last FFN product ran 8× slower with a
/// GELU whose far-negative tail was subnormal). Also the infinities, NaN and the tanh form
/// against its f64 formula.
#[test]
fn gelu_outputs_are_never_subnormal() {
    let mut xs: Vec<f32> = (-40 * 64..=40 * 64).map(|i| i as f32 / 64.0).collect();
    xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -1e30, 1e30]);
    let n = xs.len();
    for tanh in [false, true] {
        let cx = Graph::new();
        let x = cx.tensor("x", n);
        let y = if tanh { x.gelu_tanh() } else { x.gelu() }.output();
        let mut rt = compile(&cx);
        rt.set(x, &xs).unwrap();
        rt.run().unwrap();
        let ys = rt.get::<f32>(y).unwrap();
        for (&x, &y) in xs.iter().zip(&ys) {
            let form = if tanh { "gelu_tanh" } else { "gelu" };
            assert!(!y.is_subnormal(), "{form}({x}) = {y:e} is subnormal");
            if x.is_nan() || x == f32::NEG_INFINITY {
                // −inf gives NaN in both forms, as PyTorch's.
                assert!(y.is_nan(), "{form}({x}) = {y}");
            } else if x > 1e3 {
                assert_eq!(y, x, "{form}({x})");
            } else if x < -1e3 {
                assert!(y.abs() < 1e-26, "{form}({x}) = {y:e}");
            } else if tanh {
                let xd = x as f64;
                let want = 0.5
                    * xd
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3)))
                            .tanh());
                assert!(
                    (y as f64 - want).abs() <= 1e-6 * (1.0 + xd.abs()),
                    "{form}({x}) = {y:e}, want {want:e}"
                );
            } else if x >= 0.0 {
                assert!(y <= x && y >= 0.5 * x, "{form}({x}) = {y}");
            } else {
                assert!((-0.17..=0.0).contains(&y), "{form}({x}) = {y}");
            }
        }
    }
}

/// `gelu_tanh`, its derivative (the form autograd builds, `dy · x.gelu_tanh_grad()`) and
/// the erf `gelu` are each evaluated as one function step (`GeluTanh`, `GeluTanhGrad`,
/// `GeluErf`) of a fused kernel, read through a permuted view too, and equal the reference
/// runtime's primops and the same graph with the `functions` pass switched off.
#[test]
fn gelu_forms_and_the_tanh_gradient_are_one_function_step() {
    let xs: Vec<f32> = (0..48 * 40)
        .map(|i| ((i * 7919) % 4001) as f32 / 200.0 - 10.0)
        .collect();
    let gs = noise(48 * 40, 5);
    let cx = Graph::new();
    let x = cx.tensor("x", (48, 40));
    let w = cx.tensor("w", (40, 48));
    let y = x.gelu_tanh() + x.permute(&[1, 0]).gelu_tanh().permute(&[1, 0]) + x.gelu() * 0.5;
    let loss = (y * w.permute(&[1, 0])).sum(1).sum(0);
    let dx = luminal::autograd::gradients(&[x], loss)[0].output();
    let y = y.output();
    let run = |backend: CpuBackend| {
        let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
        rt.set(x, &xs).unwrap();
        rt.set(w, &gs).unwrap();
        rt.run().unwrap();
        let names = rt.kernel_names().join(" ");
        (rt.get::<f32>(y).unwrap(), rt.get::<f32>(dx).unwrap(), names)
    };
    let (y_fn, dx_fn, names) = run(CpuBackend::default());
    assert!(
        names.contains("GeluTanh") && names.contains("GeluTanhGrad") && names.contains("GeluErf"),
        "{names}"
    );
    let (y_ops, dx_ops, names_ops) = run(CpuBackend::default().disable_rules(&["functions"]));
    assert!(
        names_ops.contains("Exp2") && !names_ops.contains("GeluTanh"),
        "{names_ops}"
    );
    let mut re = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    re.set(x, &xs).unwrap();
    re.set(w, &gs).unwrap();
    re.run().unwrap();
    let (y_ref, dx_ref) = (re.get::<f32>(y).unwrap(), re.get::<f32>(dx).unwrap());
    for (label, got, want) in [
        ("gelu_tanh", &y_fn, &y_ref),
        ("gradient", &dx_fn, &dx_ref),
        ("gelu_tanh (primops)", &y_ops, &y_ref),
        ("gradient (primops)", &dx_ops, &dx_ref),
    ] {
        for (i, (a, b)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{label} [{i}] (x = {}): {a} vs {b}",
                xs[i]
            );
        }
    }
}

/// An inference layer norm with an affine weight and bias over a residual sum (a BERT
/// block's `LayerNorm(x·W + b + r)`) runs as one row loop with the weight and bias as its
/// in-place epilogue (`layer_norm+[Mul,Add]`); where `x̂` has a second reader the affine
/// stays a kernel of its own. Rows of 384 and of 37; against the reference runtime, and
/// the same graph with the `epilogues` pass and the `layer_norm` rule switched off.
#[test]
fn inference_layer_norm_takes_its_affine_as_an_epilogue() {
    for (rows, len, second_reader) in [(40usize, 384usize, false), (9, 37, false), (9, 37, true)] {
        let cx = Graph::new();
        let a = cx.tensor("a", (rows, 16));
        let w = cx.tensor("w", (16, len));
        let bias = cx.tensor("bias", len);
        let r = cx.tensor("r", (rows, len));
        let (g, b) = (cx.tensor("g", len), cx.tensor("b", len));
        let x = a.matmul(w) + bias.expand_to((rows, len)) + r;
        let xh = x.layer_norm(-1, 1e-12);
        let y = (xh * g.expand_to((rows, len)) + b.expand_to((rows, len))).output();
        let extra = second_reader.then(|| (xh * 2.0).sum(1).output());
        let inputs = [
            (a, noise(rows * 16, 1)),
            (w, noise(16 * len, 2)),
            (bias, noise(len, 3)),
            (
                r,
                noise(rows * len, 4).iter().map(|v| v * 4.0 + 1.0).collect(),
            ),
            (g, noise(len, 5)),
            (b, noise(len, 6)),
        ];
        // y (and the second reader's value), and the kernel names (none for the reference).
        fn eval<R: Runtime>(
            mut rt: R,
            inputs: &[(GraphTensor<'_>, Vec<f32>)],
            outs: &[GraphTensor<'_>],
        ) -> (Vec<f32>, R) {
            for (t, v) in inputs {
                rt.set(*t, v).unwrap();
            }
            rt.run().unwrap();
            let got = outs
                .iter()
                .flat_map(|&o| rt.get::<f32>(o).unwrap())
                .collect();
            (got, rt)
        }
        let outs: Vec<GraphTensor<'_>> = std::iter::once(y).chain(extra).collect();
        let run = |backend: Option<CpuBackend>| match backend {
            Some(be) => {
                let (got, rt) = eval(
                    cx.compile(be, CompileOptions::default()).unwrap(),
                    &inputs,
                    &outs,
                );
                (got, rt.kernel_names())
            }
            None => {
                let rt = cx
                    .compile(ReferenceBackend, CompileOptions::default())
                    .unwrap();
                (eval(rt, &inputs, &outs).0, vec![])
            }
        };
        let (want, _) = run(None);
        let (fast, names) = run(Some(CpuBackend::with_threads(2)));
        let fused = names.iter().any(|k| k == "layer_norm+[Mul,Add]");
        assert_eq!(fused, !second_reader, "{names:?}");
        assert!(
            names.iter().any(|k| k.starts_with("layer_norm")),
            "{names:?}"
        );
        let (off, off_names) = run(Some(
            CpuBackend::with_threads(2).disable_rules(&["epilogues", "layer_norm"]),
        ));
        assert!(
            !off_names.iter().any(|k| k.starts_with("layer_norm")),
            "{off_names:?}"
        );
        for (label, got) in [("epilogue", &fast), ("rules off", &off)] {
            assert_eq!(got.len(), want.len());
            for (i, (x, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (x - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{label} rows {rows} len {len} [{i}]: {x} vs {w}"
                );
            }
        }
    }
}

/// A layer norm of a training step runs as one row loop (`layer_norm`), and the gradient
/// autograd builds for it as another (`layer_norm_grad`, also where it feeds a sum of
/// gradients: a residual stream), with rows of 64 and of 37 (a remainder past the 16-lane
/// sums); both equal the reference runtime and the same graph with the rule switched off.
#[test]
fn layer_norm_and_its_gradient_are_row_loops() {
    for (rows, len) in [(48usize, 64usize), (9, 37)] {
        let n = rows * len;
        let xs: Vec<f32> = noise(n, 3).iter().map(|v| v * 3.0 + 0.5).collect();
        let (ws, us) = (noise(len, 4), noise(n, 5));
        let cx = Graph::new();
        let x = cx.tensor("x", (rows, len));
        let w = cx.tensor("w", len);
        let u = cx.tensor("u", (rows, len));
        // x + LN(x)·w: the norm's input is also read by the residual sum (x's gradient
        // is the sum of both paths).
        let h = x + x.layer_norm(-1, 1e-5) * w.expand_to((rows, len));
        let loss = (h * u).sum(1).sum(0);
        let grads = luminal::autograd::gradients(&[x, w], loss);
        let (dx, dw) = (grads[0].output(), grads[1].output());
        let h = h.output();
        let run = |backend: CpuBackend| {
            let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
            rt.set(x, &xs).unwrap();
            rt.set(w, &ws).unwrap();
            rt.set(u, &us).unwrap();
            rt.run().unwrap();
            let names = rt.kernel_names();
            let got = [h, dx, dw].map(|t| rt.get::<f32>(t).unwrap());
            (got, names)
        };
        let (fast, names) = run(CpuBackend::default());
        assert!(
            names.iter().any(|k| k == "layer_norm") && names.iter().any(|k| k == "layer_norm_grad"),
            "{names:?}"
        );
        let (ops, names_ops) = run(CpuBackend::default().disable_rules(&["layer_norm"]));
        assert!(
            !names_ops.iter().any(|k| k.starts_with("layer_norm")),
            "{names_ops:?}"
        );
        let mut re = cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap();
        re.set(x, &xs).unwrap();
        re.set(w, &ws).unwrap();
        re.set(u, &us).unwrap();
        re.run().unwrap();
        for (i, label) in ["h", "dx", "dw"].iter().enumerate() {
            let want = re.get::<f32>([h, dx, dw][i]).unwrap();
            for (got, which) in [(&fast[i], "layer_norm kernels"), (&ops[i], "primops")] {
                for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 2e-5 * (1.0 + b.abs()),
                        "{label}[{j}] ({which}, rows of {len}): {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// Epilogues that are a chain of adds and multiplies by leaves and constants (a bias, a
/// residual, a scale) run in place row by row; checked on 1 and 2 threads (2 threads split
/// a wide product by columns, so rows are pieces), on batched rows, and with a leaf that
/// is neither a row bias nor a linear read (a per-batch bias: the block path).
#[test]
fn bias_and_residual_epilogues_row_by_row() {
    for threads in [1, 2] {
        let cx = Graph::new();
        let (bt, s, d, h) = (3, 37, 96, 160);
        let x = cx.tensor("x", (bt, s, d));
        let w = cx.tensor("w", (h, d));
        let b = cx.tensor("b", h);
        let r = cx.tensor("r", (bt, s, h));
        let pb = cx.tensor("pb", (bt, 1, h));
        let biased = ((x.matmul(w.permute(&[1, 0])) + b.expand_to((bt, s, h))) * 0.5 + r).output();
        // The same product of x with w's negation (a product of its own).
        let scaled = (x.matmul((-w).permute(&[1, 0])) * 2.0 + pb.expand_to((bt, s, h))).output();
        // A GELU after the bias (an encoder's FFN), and a product times the GELU
        // derivative of a leaf (the gradient through a GELU).
        let w2 = w * 0.5;
        let gelu = (x.matmul(w2.permute(&[1, 0])) + b.expand_to((bt, s, h)))
            .gelu()
            .output();
        let w3 = w * 0.25;
        let dgelu = (x.matmul(w3.permute(&[1, 0])) * r.gelu_tanh_grad()).output();
        let rt = cx
            .compile(CpuBackend::with_threads(threads), CompileOptions::default())
            .unwrap();
        let names = rt.kernel_names();
        assert!(
            names.iter().filter(|n| n.starts_with("matmul+")).count() == 4,
            "{names:?}"
        );
        let inputs = [
            (x, noise(bt * s * d, 21)),
            (w, noise(h * d, 22)),
            (b, noise(h, 23)),
            (r, noise(bt * s * h, 24)),
            (pb, noise(bt * h, 25)),
        ];
        check_against_reference(&cx, &inputs, biased);
        check_against_reference(&cx, &inputs, scaled);
        check_against_reference(&cx, &inputs, gelu);
        check_against_reference(&cx, &inputs, dgelu);
    }
}

/// Column reductions of a short row-major buffer (bias gradients) split their rows over
/// the threads and combine the partial results: sums, maxima and a fused product, for
/// lengths that do not split evenly.
#[test]
fn column_reductions_split_by_rows() {
    for threads in [1, 2, 3] {
        for (rows, cols) in [(1000usize, 100usize), (1031, 64), (257, 512)] {
            let cx = Graph::new();
            let x = cx.tensor("x", (rows, cols));
            let y = cx.tensor("y", (rows, cols));
            let sum = x.sum(0).output();
            let max = x.max(0).output();
            let dot = (x * y).sum(0).output();
            let mut rt = cx
                .compile(CpuBackend::with_threads(threads), CompileOptions::default())
                .unwrap();
            let mut re = cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap();
            let (xs, ys) = (noise(rows * cols, 31), noise(rows * cols, 32));
            for (t, d) in [(x, &xs), (y, &ys)] {
                rt.set(t, d).unwrap();
                re.set(t, d).unwrap();
            }
            rt.run().unwrap();
            re.run().unwrap();
            for t in [sum, max, dot] {
                let (a, b) = (rt.get::<f32>(t).unwrap(), re.get::<f32>(t).unwrap());
                for (j, (p, q)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (p - q).abs() <= 1e-4 * (1.0 + q.abs()),
                        "{threads} threads, {rows}×{cols}, column {j}: {p} vs {q}"
                    );
                }
            }
        }
    }
}
