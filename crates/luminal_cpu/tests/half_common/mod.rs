//! Helpers shared by the half-precision tests (`halves.rs`, `half_ops.rs`, `isa.rs`).
#![allow(dead_code)]

use luminal::prelude::*;
use luminal_cpu::{CpuBackend, CpuRuntime};

/// xorshift64*: deterministic, no dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1), 2^-20 steps.
    pub fn float(&mut self) -> f64 {
        (self.next() >> 44) as f64 / (1u64 << 19) as f64 - 1.0
    }
}

pub fn random(dtype: DType, n: usize, seed: u64) -> HostData {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let v: Vec<f64> = (0..n).map(|_| rng.float()).collect();
    HostData::from_f64(dtype, &v)
}

pub fn cpu(cx: &Graph, threads: usize) -> CpuRuntime {
    cx.compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap()
}

pub fn reference(cx: &Graph) -> ReferenceRuntime {
    cx.compile(ReferenceBackend, CompileOptions::default())
        .unwrap()
}

pub fn assert_no_fallback(rt: &CpuRuntime) {
    let names = rt.kernel_names();
    assert!(
        names.iter().all(|n| !n.starts_with("fallback")),
        "{names:?}"
    );
}

/// Spacing of the half type `dtype` at `x` (its smallest subnormal near zero).
pub fn ulp(dtype: DType, x: f64) -> f64 {
    let (mantissa_bits, min_exp) = match dtype {
        DType::F16 => (10, -14),
        DType::BF16 => (7, -126),
        _ => unreachable!(),
    };
    let e = if x == 0.0 {
        min_exp
    } else {
        (x.abs().log2().floor() as i32).max(min_exp)
    };
    2f64.powi(e - mantissa_bits)
}

/// One half matmul `a · b`: operand shapes as stored and how each is viewed.
pub struct MatmulCase {
    pub a: Vec<usize>,
    pub b: Vec<usize>,
    /// Permute the last two axes of the stored operand before the matmul.
    pub a_t: bool,
    pub b_t: bool,
}

pub fn case(a: &[usize], b: &[usize], a_t: bool, b_t: bool) -> MatmulCase {
    MatmulCase {
        a: a.to_vec(),
        b: b.to_vec(),
        a_t,
        b_t,
    }
}

pub fn transposed<'g>(t: GraphTensor<'g>, yes: bool) -> GraphTensor<'g> {
    if yes {
        t.transpose(-1, -2)
    } else {
        t
    }
}

/// Checks `a · b` in `dtype` against the reference.
///
/// Tolerance, per output element: the reference rounds every product to the half type
/// (the `Mul` node's dtype; relative error `u` = 2^-11 for f16, 2^-8 for bf16), sums those
/// exactly and rounds once. We multiply exactly (half products are exact in f32), sum in
/// f32 (error at most `K·2^-24·Σ|a||b|`) and round once. So the two pre-rounding sums differ
/// by at most `(u + K·2^-24)·Σ|a||b|`, and the two roundings add at most one spacing of the
/// half type at the larger result (two spacings at the reference's, across a binade).
pub fn check_matmul(dtype: DType, c: &MatmulCase, threads: usize, seed: u64) {
    let cx = Graph::new();
    let a = cx.input("a", c.a.clone(), dtype);
    let b = cx.input("b", c.b.clone(), dtype);
    let (av, bv) = (transposed(a, c.a_t), transposed(b, c.b_t));
    let out = av.matmul(bv).output();
    // Σ|a||b| per output element, on the reference only.
    let abs_dot = av
        .cast(DType::F32)
        .abs()
        .matmul(bv.cast(DType::F32).abs())
        .output();
    let k = av.shape().last().unwrap().as_constant().unwrap() as f64;
    let (ad, bd) = (
        random(dtype, c.a.iter().product(), seed),
        random(dtype, c.b.iter().product(), seed + 1),
    );

    let mut want = reference(&cx);
    want.set_data(a, ad.clone()).unwrap();
    want.set_data(b, bd.clone()).unwrap();
    want.run().unwrap();
    let (want_v, bound) = (want.get_data(out).unwrap(), want.get_f32(abs_dot).unwrap());

    // The CPU runtime computes only `out` (a graph of its own, so `abs_dot` adds no kernels).
    let cx2 = Graph::new();
    let a2 = cx2.input("a", c.a.clone(), dtype);
    let b2 = cx2.input("b", c.b.clone(), dtype);
    let out2 = transposed(a2, c.a_t).matmul(transposed(b2, c.b_t)).output();
    let mut rt = cpu(&cx2, threads);
    assert_eq!(rt.kernel_names(), vec!["matmul".to_string()], "{dtype}");
    rt.set_data(a2, ad).unwrap();
    rt.set_data(b2, bd).unwrap();
    rt.run().unwrap();
    let got = rt.get_data(out2).unwrap();
    assert_eq!(got.dtype(), dtype);

    let u = match dtype {
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-8),
    };
    let (got, want_v) = (got.to_f64(), want_v.to_f64());
    assert_eq!(got.len(), want_v.len());
    for (i, ((&g, &w), &s)) in got.iter().zip(&want_v).zip(&bound).enumerate() {
        let tol = (u + k * 2f64.powi(-24)) * s as f64 + 2.0 * ulp(dtype, w);
        assert!(
            (g - w).abs() <= tol,
            "{dtype} {:?}x{:?} (t {} {}) threads {threads}: element {i}: {g} vs reference {w} (tolerance {tol})",
            c.a,
            c.b,
            c.a_t,
            c.b_t
        );
    }
}

pub fn same_value(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Every f16 or bf16 bit pattern.
pub fn all_bit_patterns(dtype: DType) -> HostData {
    match dtype {
        DType::F16 => HostData::F16((0..=u16::MAX).map(f16::from_bits).collect()),
        _ => HostData::BF16((0..=u16::MAX).map(bf16::from_bits).collect()),
    }
}

/// Products the skinny half kernels take (weights read in place): every row count up to 8
/// against `[N, K]` weights with K and N off the vector widths, `M = 1` against `[K, N]`
/// weights, batched and broadcast-batch forms of both.
pub fn skinny_cases() -> Vec<MatmulCase> {
    vec![
        case(&[2, 77], &[45, 77], false, true),
        case(&[3, 40], &[33, 40], false, true),
        case(&[4, 9], &[100, 9], false, true),
        case(&[6, 130], &[70, 130], false, true),
        case(&[7, 31], &[20, 31], false, true),
        case(&[8, 33], &[9, 33], false, true),
        case(&[8, 520], &[64, 520], false, true),
        case(&[1, 13], &[13, 1003], false, false),
        case(&[1, 300], &[300, 7], false, false),
        case(&[4, 1, 24], &[4, 50, 24], false, true),
        case(&[3, 2, 40], &[40, 50], false, false),
        case(&[3, 1, 40], &[40, 50], false, false),
        case(&[2, 3, 1, 40], &[2, 1, 61, 40], false, true),
    ]
}

/// Values of `dtype` that exercise every path of a half op: both zeros, both infinities,
/// NaN, the largest finite value and the half-spacing that overflows it, subnormals (the
/// smallest, the largest), the smallest normal, and ties of the rounding.
pub fn special_values(dtype: DType) -> Vec<f64> {
    let p = |e: i32| 2f64.powi(e);
    let (max, half_ulp_at_max, sub_min, sub_max, normal_min, tie) = match dtype {
        DType::F16 => (65504.0, 16.0, p(-24), 1023.0 * p(-24), p(-14), 1.0 + p(-10)),
        _ => (
            (2.0 - p(-7)) * p(127),
            p(119),
            p(-133),
            127.0 * p(-133),
            p(-126),
            1.0 + p(-7),
        ),
    };
    vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        max,
        -max,
        half_ulp_at_max,
        sub_min,
        -sub_min,
        sub_max,
        normal_min,
        1.0,
        -1.0,
        tie,
        0.5,
        3.0,
        -7.5,
    ]
}

/// `n` values of `dtype`: a quarter random bit patterns (any exponent, NaN payloads,
/// subnormals), a quarter moderate (|x| < 8), the rest the special values cycled.
pub fn half_values(dtype: DType, n: usize, seed: u64) -> HostData {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let specials = special_values(dtype);
    let v: Vec<f64> = (0..n)
        .map(|i| match i % 4 {
            0 => from_bits(dtype, rng.next() as u16),
            1 | 2 => rng.float() * 8.0,
            _ => specials[(i / 4 + seed as usize) % specials.len()],
        })
        .collect();
    HostData::from_f64(dtype, &v)
}

/// The half value with bits `b`, as f64.
pub fn from_bits(dtype: DType, b: u16) -> f64 {
    match dtype {
        DType::F16 => f16::from_bits(b).to_f64(),
        _ => bf16::from_bits(b).to_f64(),
    }
}

/// Asserts `got` equals `want` element by element (NaN equals NaN; -0 and +0 differ),
/// or, with `ulps > 0`, lies within that many spacings of `dtype` at `want` (infinities
/// and NaN must match exactly).
pub fn assert_close(dtype: DType, got: &HostData, want: &HostData, ulps: f64, what: &str) {
    assert_eq!(got.dtype(), want.dtype(), "{what}");
    let (g, w) = (got.to_f64(), want.to_f64());
    assert_eq!(g.len(), w.len(), "{what}");
    for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
        let ok = same_value(g, w)
            || (ulps > 0.0
                && g.is_finite()
                && w.is_finite()
                && (g - w).abs() <= ulps * ulp(dtype, w));
        assert!(ok, "{what}: element {i}: {g:e} vs reference {w:e}");
    }
}

/// Runs `rt` and the reference on the same inputs; returns the reference.
pub fn run_both(
    cx: &Graph,
    rt: &mut CpuRuntime,
    inputs: &[(GraphTensor<'_>, HostData)],
) -> ReferenceRuntime {
    let mut want = reference(cx);
    for (t, d) in inputs {
        rt.set_data(*t, d.clone()).unwrap();
        want.set_data(*t, d.clone()).unwrap();
    }
    rt.run().unwrap();
    want.run().unwrap();
    want
}

pub const HALVES: [DType; 2] = [DType::F16, DType::BF16];

/// Asserts every kernel of `rt` is named `prefix…`.
pub fn assert_all_fused(rt: &luminal_cpu::CpuRuntime, prefix: &str) {
    let names = rt.kernel_names();
    assert!(
        names.iter().all(|n| n.starts_with(prefix)),
        "expected only {prefix}… kernels: {names:?}"
    );
}

/// Every unary op on every f16 / bf16 bit pattern, fused: `sqrt`, `1/x` bit for bit,
/// `exp2`, `log2`, `sin` within one half ulp.
pub fn check_unary_ops() {
    type Op = for<'g> fn(GraphTensor<'g>) -> GraphTensor<'g>;
    let ops: [(&str, Op, f64); 5] = [
        ("Sqrt", |x| x.sqrt(), 0.0),
        ("Recip", |x| x.recip(), 0.0),
        ("Exp2", |x| x.exp2(), 1.0),
        ("Log2", |x| x.log2(), 1.0),
        ("Sin", |x| x.sin(), 1.0),
    ];
    for dtype in HALVES {
        let cx = Graph::new();
        let x = cx.input("x", 65536, dtype);
        let outs: Vec<_> = ops.iter().map(|(_, f, _)| f(x).output()).collect();
        let mut rt = cpu(&cx, 2);
        let names = rt.kernel_names();
        for (name, _, _) in &ops {
            assert!(names.contains(&format!("elementwise[{name}]")), "{names:?}");
        }
        assert_all_fused(&rt, "elementwise");
        let want = run_both(&cx, &mut rt, &[(x, all_bit_patterns(dtype))]);
        for ((name, _, ulps), o) in ops.iter().zip(&outs) {
            let (g, w) = (rt.get_data(*o).unwrap(), want.get_data(*o).unwrap());
            assert_close(dtype, &g, &w, *ulps, &format!("{dtype} {name}"));
        }
    }
}

/// Pairs over every kind of value: random bit patterns, moderate values, the special
/// values crossed with each other, and pairs that share an exponent (cancellation, ties).
pub fn pairs(dtype: DType, seed: u64) -> (HostData, HostData) {
    let specials = special_values(dtype);
    let s = specials.len();
    let mut a = half_values(dtype, 8192, seed).to_f64();
    let mut b = half_values(dtype, 8192, seed + 1).to_f64();
    let mut rng = Rng(seed | 1);
    for i in 0..s * s {
        a.push(specials[i / s]);
        b.push(specials[i % s]);
    }
    for _ in 0..4096 {
        let x = rng.next() as u16;
        // Same exponent, any sign and mantissa.
        let y = x ^ (rng.next() as u16 & if dtype == DType::F16 { 0x83FF } else { 0x807F });
        a.push(from_bits(dtype, x));
        b.push(from_bits(dtype, y));
    }
    (HostData::from_f64(dtype, &a), HostData::from_f64(dtype, &b))
}

/// Binary ops (and `-`, `/`, `maximum` built from them) on [`pairs`], fused, bit for bit.
pub fn check_binary_ops() {
    for dtype in HALVES {
        let (ad, bd) = pairs(dtype, 3);
        let n = ad.len();
        let cx = Graph::new();
        let a = cx.input("a", n, dtype);
        let b = cx.input("b", n, dtype);
        let outs = [
            ("Add", (a + b).output()),
            ("Mul", (a * b).output()),
            ("Mod", (a % b).output()),
            ("LessThan", a.lt(b).output()),
            ("Sub", (a - b).output()),
            ("Div", (a / b).output()),
            ("Max", a.maximum(b).output()),
        ];
        let mut rt = cpu(&cx, 2);
        assert_all_fused(&rt, "elementwise");
        let want = run_both(&cx, &mut rt, &[(a, ad), (b, bd)]);
        for (name, o) in outs {
            let (mut g, mut w) = (rt.get_data(o).unwrap(), want.get_data(o).unwrap());
            if name == "Max" {
                // Which zero `maximum(-0, ±0)` gives is unspecified (the reference's padded
                // pair turns -0 into +0; the f32 kernels keep the operand), as for f32.
                let unsigned = |h: HostData| {
                    let v: Vec<f64> = h
                        .to_f64()
                        .iter()
                        .map(|&x| if x == 0.0 { 0.0 } else { x })
                        .collect();
                    HostData::from_f64(dtype, &v)
                };
                (g, w) = (unsigned(g), unsigned(w));
            }
            assert_close(dtype, &g, &w, 0.0, &format!("{dtype} {name}"));
        }
    }
}
