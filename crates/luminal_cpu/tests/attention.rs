//! The fused attention kernel (`attention` rule) against the reference runtime on the
//! primop graphs of `luminal_nn::causal_attention_windowed` and `luminal_nn::attention`
//! (bidirectional and cross attention with padding masks): prefill and decode through a
//! KV cache (keys read in place from the cache, f32 or f16, or decoded from q8_0 / q4_1
//! blocks), grouped-query heads, sliding windows, odd
//! sizes, one and two threads, and every instruction-set level the CPU has. With the rule
//! switched off the same graph runs on the generic kernels (and materialises the scores).

use luminal::prelude::*;
use luminal_cpu::{detected_isa, set_max_isa, CpuBackend, Isa};
use luminal_nn::{attention, causal_attention_windowed};

/// One case: `s` new queries at positions `past..past + s` over a cache of `max_ctx`.
#[derive(Clone, Copy, Debug)]
struct Case {
    s: usize,
    past: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    window: Option<usize>,
    max_ctx: usize,
}

fn data(n: usize, seed: usize) -> Vec<f32> {
    // A deterministic spread of values in [-2, 2) (no RNG crate needed).
    (0..n)
        .map(|i| {
            let x = (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % 10007;
            x as f32 / 10007.0 * 4.0 - 2.0
        })
        .collect()
}

/// Runs the case on `backend` (the reference when `None`); returns the output and the
/// kernel names.
/// With `cache` = `F16` the cache inputs are f16 (an f16 KV cache: the kernel reads the
/// halves in place; the reference widens them); with a block type, the data encoded into
/// its blocks (the kernel decodes them a block of rows at a time; the reference decodes
/// the whole input).
fn run(c: Case, backend: Option<CpuBackend>, cache: DType) -> (Vec<f32>, Vec<String>) {
    let cx = Graph::new();
    let q = cx.tensor("q", (1, c.hq, Expression::var("s"), c.d));
    let kc = cx.input("k_cache", (c.hkv, c.max_ctx, c.d), cache);
    let vc = cx.input("v_cache", (c.hkv, c.max_ctx, c.d), cache);
    let t = Expression::var("p") + Expression::var("s");
    let k = kc.slice(1, 0, t.clone()).unsqueeze(0);
    let v = vc.slice(1, 0, t).unsqueeze(0);
    let out = causal_attention_windowed(q, k, v, c.window).output();
    let qd = data(c.hq * c.s * c.d, 1);
    let kd = data(c.hkv * c.max_ctx * c.d, 2);
    let vd = data(c.hkv * c.max_ctx * c.d, 3);
    macro_rules! go {
        ($rt:expr) => {{
            let mut rt = $rt;
            rt.set_dim("s", c.s);
            rt.set_dim("p", c.past);
            rt.set(q, &qd).unwrap();
            for (t, d) in [(kc, &kd), (vc, &vd)] {
                let data = if cache == DType::F16 {
                    HostData::F16(d.iter().map(|&x| half::f16::from_f32(x)).collect())
                } else if cache.is_quantized() {
                    let mut b = luminal::ByteData::zeros(cache, d.len());
                    luminal::quant::encode(cache, d, b.make_mut());
                    HostData::Bytes(b)
                } else {
                    HostData::F32(d.clone())
                };
                rt.set_data(t, data).unwrap();
            }
            rt.run().unwrap();
            rt.get::<f32>(out).unwrap()
        }};
    }
    match backend {
        None => (
            go!(cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap()),
            vec![],
        ),
        Some(be) => {
            let rt = cx.compile(be, CompileOptions::default()).unwrap();
            let names = rt.kernel_names();
            (go!(rt), names)
        }
    }
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 2e-5 + 2e-5 * b.abs(),
            "{what}: element {i}: {a} vs {b}"
        );
    }
}

const CASES: &[Case] = &[
    // Decode, long context, the SmolLM2 head layout.
    Case {
        s: 1,
        past: 700,
        hq: 9,
        hkv: 3,
        d: 64,
        window: None,
        max_ctx: 800,
    },
    // Decode at position 0 and a short one.
    Case {
        s: 1,
        past: 0,
        hq: 4,
        hkv: 2,
        d: 16,
        window: None,
        max_ctx: 8,
    },
    Case {
        s: 1,
        past: 5,
        hq: 2,
        hkv: 1,
        d: 8,
        window: None,
        max_ctx: 8,
    },
    // A few rows over a cache (speculative / small chunk), sliding window.
    Case {
        s: 3,
        past: 300,
        hq: 6,
        hkv: 2,
        d: 32,
        window: Some(100),
        max_ctx: 320,
    },
    // Prefill: odd sizes, several query tiles and key blocks, no grouping.
    Case {
        s: 77,
        past: 0,
        hq: 3,
        hkv: 3,
        d: 24,
        window: None,
        max_ctx: 80,
    },
    // Chunked prefill after earlier tokens, grouped heads, window.
    Case {
        s: 45,
        past: 160,
        hq: 9,
        hkv: 3,
        d: 64,
        window: Some(64),
        max_ctx: 211,
    },
    // Several query tiles and key blocks per tile, over earlier tokens; with a window
    // (whole key blocks skipped).
    Case {
        s: 150,
        past: 300,
        hq: 4,
        hkv: 2,
        d: 64,
        window: None,
        max_ctx: 450,
    },
    Case {
        s: 150,
        past: 300,
        hq: 4,
        hkv: 2,
        d: 64,
        window: Some(200),
        max_ctx: 460,
    },
    // Decode deep in the context: several key blocks in each thread's split.
    Case {
        s: 1,
        past: 3000,
        hq: 9,
        hkv: 3,
        d: 64,
        window: None,
        max_ctx: 3001,
    },
    // Window of 1: each query sees only itself.
    Case {
        s: 19,
        past: 2,
        hq: 2,
        hkv: 1,
        d: 4,
        window: Some(1),
        max_ctx: 21,
    },
];

fn check_cases(isa: Isa) {
    // Quantized caches (q8_0, and q4_1 for a block type with minimums) where the head
    // dim is a whole number of blocks.
    for (&c, cache) in CASES.iter().flat_map(|c| {
        let quantized = if c.d % 32 == 0 {
            vec![DType::Q8_0, DType::Q4_1]
        } else {
            vec![]
        };
        [DType::F32, DType::F16]
            .into_iter()
            .chain(quantized)
            .map(move |t| (c, t))
    }) {
        let (want, _) = run(c, None, cache);
        for threads in [1, 2] {
            let (got, names) = run(c, Some(CpuBackend::with_threads(threads)), cache);
            assert!(
                names.iter().any(|n| n.starts_with("attention")),
                "{c:?}: no attention kernel in {names:?}"
            );
            close(
                &got,
                &want,
                &format!("{c:?}, {cache:?} cache, {threads} threads, {isa:?}"),
            );
        }
        let off = CpuBackend::with_threads(2).disable_rules(&["attention"]);
        let (got, names) = run(c, Some(off), cache);
        assert!(
            !names.iter().any(|n| n.starts_with("attention")),
            "{names:?}"
        );
        close(&got, &want, &format!("{c:?}, rule off"));
    }
}

/// Every case, causal and bidirectional / cross ([`BI_CASES`]: padding masks, no mask,
/// `t != s`, batch > 1), at every instruction-set level (one test: the level is
/// process-wide).
#[test]
fn attention_matches_reference_at_every_isa() {
    let best = detected_isa();
    for isa in [Isa::Generic, Isa::Avx2, Isa::Avx512] {
        if isa > best {
            continue;
        }
        set_max_isa(isa);
        check_cases(isa);
        check_bi_cases(isa);
    }
    set_max_isa(best);
}

/// Plain self-attention (no cache, `t = s`), as `Attention::forward` builds it: q, k, v
/// are permuted views of one projection each.
#[test]
fn uncached_attention_uses_the_kernel() {
    let (s, h, d) = (13, 4, 8);
    let cx = Graph::new();
    let x = cx.tensor("x", (1, s, h * d));
    fn heads(t: GraphTensor<'_>, s: usize, h: usize, d: usize) -> GraphTensor<'_> {
        t.reshape((1, s, h, d)).permute(&[0, 2, 1, 3])
    }
    let q = heads(x * 0.5, s, h, d);
    let k = heads(x.sin(), s, h, d);
    let v = heads(x * x, s, h, d);
    let out = causal_attention_windowed(q, k, v, None).output();
    let xd = data(s * h * d, 7);
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    reference.set(x, &xd).unwrap();
    reference.run().unwrap();
    let want = reference.get::<f32>(out).unwrap();
    let mut rt = cx
        .compile(CpuBackend::with_threads(2), CompileOptions::default())
        .unwrap();
    // q (`x * 0.5`, private to the attention) is evaluated by the kernel itself.
    assert!(
        rt.kernel_names().iter().any(|n| n == "attention+[Mul]"),
        "{:?}",
        rt.kernel_names()
    );
    rt.set(x, &xd).unwrap();
    rt.run().unwrap();
    close(&rt.get::<f32>(out).unwrap(), &want, "uncached");
}

/// A query computed by a private elementwise tree (a rotary embedding: the halves of the
/// projection swapped through two masked views, times cos / sin tables at the position)
/// is evaluated by the attention kernel into its arena: no kernel or buffer of its own.
/// Decode and prefill rows through a KV cache, one and two threads, against the reference.
#[test]
fn elementwise_query_evaluated_by_the_kernel() {
    let (hq, hkv, d, max_ctx) = (6, 2, 16, 96);
    for (s, past) in [(1usize, 40usize), (1, 0), (21, 30)] {
        for threads in [1, 2] {
            let cx = Graph::new();
            let x = cx.tensor("x", (1, hq, Expression::var("s"), d));
            let cos = cx.tensor("cos", (Expression::var("s"), d));
            let sin = cx.tensor("sin", (Expression::var("s"), d));
            let kc = cx.tensor("k_cache", (hkv, max_ctx, d));
            let vc = cx.tensor("v_cache", (hkv, max_ctx, d));
            let swapped = x
                .slice(-1, d / 2, d)
                .concat_along(x.slice(-1, 0, d / 2), -1);
            let q = x * cos.expand_to(x.shape()) + swapped * sin.expand_to(x.shape());
            let t = Expression::var("p") + Expression::var("s");
            let k = kc.slice(1, 0, t.clone()).unsqueeze(0);
            let v = vc.slice(1, 0, t).unsqueeze(0);
            let out = causal_attention_windowed(q, k, v, None).output();
            let inputs = [
                (x, data(hq * s * d, 11)),
                (cos, data(s * d, 12)),
                (sin, data(s * d, 13)),
                (kc, data(hkv * max_ctx * d, 14)),
                (vc, data(hkv * max_ctx * d, 15)),
            ];
            let mut want = cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap();
            let mut rt = cx
                .compile(CpuBackend::with_threads(threads), CompileOptions::default())
                .unwrap();
            let names = rt.kernel_names();
            assert!(
                names.iter().any(|n| n.starts_with("attention+["))
                    && !names
                        .iter()
                        .any(|n| n.starts_with("elementwise[") && n != "elementwise[]"),
                "{names:?}"
            );
            for (t, d) in &inputs {
                want.set(*t, d).unwrap();
                rt.set(*t, d).unwrap();
            }
            want.set_dim("s", s);
            want.set_dim("p", past);
            rt.set_dim("s", s);
            rt.set_dim("p", past);
            want.run().unwrap();
            rt.run().unwrap();
            close(
                &rt.get::<f32>(out).unwrap(),
                &want.get::<f32>(out).unwrap(),
                &format!("s {s} past {past}, {threads} threads"),
            );
        }
    }
}

/// One case of bidirectional / cross attention (`luminal_nn::attention`): `b` sequences,
/// `h` heads, `s` queries over `t` keys, each sequence's keys `0..len[i]` real and the rest
/// padding (no mask when `lens` is `None`).
#[derive(Clone, Copy, Debug)]
struct BiCase {
    b: usize,
    h: usize,
    s: usize,
    t: usize,
    d: usize,
    lens: Option<&'static [usize]>,
}

/// Runs `c` on `backend` (the reference when `None`): q, k and v are the head-split views
/// of `[b, s|t, h·d]` projections, as `MultiHeadAttention` builds them.
fn run_bi(c: BiCase, backend: Option<CpuBackend>) -> (Vec<f32>, Vec<String>) {
    let cx = Graph::new();
    let seq = Expression::var("s");
    let keys = Expression::var("t");
    let x = cx.tensor("x", (c.b, seq.clone(), c.h * c.d));
    let mem = cx.tensor("mem", (c.b, keys.clone(), c.h * c.d));
    fn heads<'g>(t: GraphTensor<'g>, n: Expression, c: BiCase) -> GraphTensor<'g> {
        t.reshape(vec![c.b.into(), n, c.h.into(), c.d.into()])
            .permute(&[0, 2, 1, 3])
    }
    let q = heads(x * 0.7, seq, c);
    let k = heads(mem.sin() * 2.0, keys.clone(), c);
    let v = heads(mem * 1.5, keys.clone(), c);
    let mask = c.lens.map(|_| cx.tensor("mask", (c.b, keys)));
    let out = attention(q, k, v, mask).output();
    let xd = data(c.b * c.s * c.h * c.d, 11);
    let md = data(c.b * c.t * c.h * c.d, 12);
    let maskd: Vec<f32> = c.lens.map_or(vec![], |lens| {
        lens.iter()
            .flat_map(|&n| (0..c.t).map(move |j| if j < n { 1.0 } else { 0.0 }))
            .collect()
    });
    macro_rules! go {
        ($rt:expr) => {{
            let mut rt = $rt;
            rt.set_dim("s", c.s);
            rt.set_dim("t", c.t);
            rt.set(x, &xd).unwrap();
            rt.set(mem, &md).unwrap();
            if let Some(m) = mask {
                rt.set(m, &maskd).unwrap();
            }
            rt.run().unwrap();
            rt.get::<f32>(out).unwrap()
        }};
    }
    match backend {
        None => (
            go!(cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap()),
            vec![],
        ),
        Some(be) => {
            let rt = cx.compile(be, CompileOptions::default()).unwrap();
            let names = rt.kernel_names();
            (go!(rt), names)
        }
    }
}

const BI_CASES: &[BiCase] = &[
    // BERT-like: padded batch, one sequence entirely padding (uniform weights, as
    // transformers), odd lengths.
    BiCase {
        b: 3,
        h: 4,
        s: 37,
        t: 37,
        d: 32,
        lens: Some(&[37, 20, 0]),
    },
    // Several query tiles and key blocks; whole key blocks padded in one sequence.
    BiCase {
        b: 2,
        h: 2,
        s: 130,
        t: 300,
        d: 32,
        lens: Some(&[300, 10]),
    },
    // Encoder self-attention without a mask (Whisper), several tiles and blocks.
    BiCase {
        b: 1,
        h: 3,
        s: 150,
        t: 150,
        d: 64,
        lens: None,
    },
    // Cross-attention, few queries over many keys (the decoder's steps): keys split
    // across threads; with and without a padding mask, batch > 1.
    BiCase {
        b: 1,
        h: 6,
        s: 1,
        t: 1500,
        d: 64,
        lens: None,
    },
    BiCase {
        b: 2,
        h: 3,
        s: 4,
        t: 700,
        d: 64,
        lens: Some(&[700, 300]),
    },
    // Cross-attention, many queries over a different number of keys; odd head dim.
    BiCase {
        b: 2,
        h: 2,
        s: 70,
        t: 33,
        d: 24,
        lens: Some(&[5, 33]),
    },
    BiCase {
        b: 2,
        h: 1,
        s: 9,
        t: 260,
        d: 8,
        lens: None,
    },
];

fn check_bi_cases(isa: Isa) {
    for &c in BI_CASES {
        let (want, _) = run_bi(c, None);
        for threads in [1, 2] {
            let (got, names) = run_bi(c, Some(CpuBackend::with_threads(threads)));
            assert!(
                names.iter().any(|n| n.starts_with("attention")),
                "{c:?}: no attention kernel in {names:?}"
            );
            close(&got, &want, &format!("{c:?}, {threads} threads, {isa:?}"));
        }
        let off = CpuBackend::with_threads(2).disable_rules(&["attention"]);
        let (got, names) = run_bi(c, Some(off));
        assert!(
            !names.iter().any(|n| n.starts_with("attention")),
            "{names:?}"
        );
        close(&got, &want, &format!("{c:?}, rule off"));
    }
}
