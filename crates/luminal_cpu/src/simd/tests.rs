use super::*;

fn ulps(a: f32, b: f32) -> u32 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0;
    }
    if a.is_nan() || b.is_nan() || a.signum() != b.signum() {
        return u32::MAX;
    }
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

/// Every 97th f32 bit pattern (plus the specials), both signs.
fn samples() -> impl Iterator<Item = f32> {
    (0..u32::MAX / 97).map(|i| f32::from_bits(i * 97)).chain([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ])
}

#[test]
fn exp2_within_2_ulp() {
    for x in samples() {
        let want = (x as f64).exp2() as f32;
        let got = exp2::<true>(x);
        assert!(ulps(got, want) <= 2, "exp2({x:e}) = {got:e}, want {want:e}");
        let got = exp2::<false>(x);
        assert!(ulps(got, want) <= 2, "exp2({x:e}) = {got:e}, want {want:e}");
    }
}

#[test]
fn log2_within_2_ulp() {
    for x in samples() {
        let want = (x as f64).log2() as f32;
        let got = log2::<true>(x);
        assert!(ulps(got, want) <= 2, "log2({x:e}) = {got:e}, want {want:e}");
        let got = log2::<false>(x);
        assert!(ulps(got, want) <= 2, "log2({x:e}) = {got:e}, want {want:e}");
    }
}

#[test]
fn sin_close_to_libm() {
    for x in samples() {
        let want = (x as f64).sin();
        let got = unary_one::<true>(UnaryOp::Sin, x) as f64;
        if want.is_nan() {
            assert!(got.is_nan(), "sin({x:e}) = {got:e}");
            continue;
        }
        // Absolute error 2^-24 plus 2 ulp relative (the reduction is exact to ~1e-11
        // of |x| below SIN_MAX).
        let tol = 6e-8 + 2.5e-7 * want.abs() + 1e-11 * (x as f64).abs();
        assert!(
            (got - want).abs() <= tol,
            "sin({x:e}) = {got:e}, want {want:e}"
        );
    }
}

/// The AVX2 chain tiles' `exp2` is the scalar one, bit for bit, on every 97th f32.
#[cfg(target_arch = "x86_64")]
#[test]
fn exp2_avx2_matches_scalar() {
    if !crate::simd::half::fast() {
        return;
    }
    let xs: Vec<f32> = samples().collect();
    for c in xs.chunks_exact(8) {
        let mut got = [0f32; 8];
        // SAFETY: AVX2 and FMA were detected (`fast()`); `c` and `got` hold 8 floats.
        unsafe {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn run(c: &[f32], got: &mut [f32; 8]) {
                use std::arch::x86_64::*;
                let v = exp2_avx2::<true>(_mm256_loadu_ps(c.as_ptr()));
                _mm256_storeu_ps(got.as_mut_ptr(), v);
            }
            run(c, &mut got);
        }
        for (x, g) in c.iter().zip(got) {
            let want = exp2::<true>(*x);
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "exp2({x:e}) = {g:e}, want {want:e}"
            );
        }
    }
}

#[test]
fn slices_match_scalars() {
    let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.37).collect();
    let mut out = vec![0.0; xs.len()];
    for op in [
        UnaryOp::Exp2,
        UnaryOp::Log2,
        UnaryOp::Sin,
        UnaryOp::Sqrt,
        UnaryOp::Recip,
    ] {
        unary::<true>(op, &xs, &mut out);
        for (x, o) in xs.iter().zip(&out) {
            let want = unary_one::<true>(op, *x);
            assert!(o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()));
        }
    }
}

/// `chain` (every tile path, streamed or not, any output alignment) gives bit for bit
/// what applying its ops one at a time with the scalar functions gives.
#[test]
fn chains_match_op_by_op() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    // Zeros, infinities, NaNs (one signalling), overflow, and ties of both half types.
    let specials = [
        0.0,
        -0.0,
        f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e30,
        f32::MAX,
        -3.5,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        1.0 + 2f32.powi(-11),
        -(1.0 + 3.0 * 2f32.powi(-11)),
        65520.0,
    ];
    let value = |rand: &mut dyn FnMut(usize) -> usize| {
        if rand(6) == 0 {
            specials[rand(specials.len())]
        } else {
            (rand(20001) as f32 - 10000.0) / 997.0
        }
    };
    let kinds = [
        ChainOp::Binary {
            op: BinaryOp::Add,
            swap: false,
        },
        ChainOp::Binary {
            op: BinaryOp::Mul,
            swap: true,
        },
        ChainOp::Binary {
            op: BinaryOp::Mod,
            swap: false,
        },
        ChainOp::Binary {
            op: BinaryOp::Mod,
            swap: true,
        },
        ChainOp::Binary {
            op: BinaryOp::LessThan,
            swap: false,
        },
        ChainOp::Binary {
            op: BinaryOp::LessThan,
            swap: true,
        },
        ChainOp::Max,
        ChainOp::Unary(UnaryOp::Exp2),
        ChainOp::Unary(UnaryOp::Log2),
        ChainOp::Unary(UnaryOp::Sin),
        ChainOp::Unary(UnaryOp::Sqrt),
        ChainOp::Unary(UnaryOp::Recip),
        ChainOp::NotZero,
        ChainOp::Round(HalfKind::F16),
        ChainOp::Round(HalfKind::BF16),
        ChainOp::Fn(FnOp::GeluTanh),
        ChainOp::Fn(FnOp::GeluTanhGrad),
        ChainOp::Fn(FnOp::GeluErf),
    ];
    let levels: &[u8] = match (crate::simd::half::fast(), detected_isa() == Isa::Avx512) {
        (true, true) => &[0, 1, 2],
        (true, false) => &[0, 1],
        _ => &[0],
    };
    for case in 0..600 {
        // The first cases: one op on every special value (each in every position of a
        // tile, so every tile path meets it).
        let first = case < kinds.len();
        let n = if first { 200 } else { rand(300) };
        let a: Vec<f32> = (0..n)
            .map(|i| {
                if first {
                    specials[i % specials.len()]
                } else {
                    value(&mut rand)
                }
            })
            .collect();
        let vectors: Vec<Vec<f32>> = (0..3)
            .map(|_| (0..n).map(|_| value(&mut rand)).collect())
            .collect();
        enum B {
            None,
            S(f32),
            V(usize),
        }
        let mut spec = vec![];
        for _ in 0..if first { 1 } else { 1 + rand(16) } {
            // Mostly Add / Mul (the register paths), the rest evenly.
            let op = if first {
                kinds[case]
            } else if rand(2) == 0 {
                kinds[rand(2)]
            } else {
                kinds[rand(kinds.len())]
            };
            let b = match op {
                ChainOp::Binary { .. } | ChainOp::Max => {
                    if rand(2) == 0 {
                        B::S(value(&mut rand))
                    } else {
                        B::V(rand(3))
                    }
                }
                _ => B::None,
            };
            spec.push((op, b));
        }
        let ops: Vec<(ChainOp, Operand<'_>)> = spec
            .iter()
            .map(|(op, b)| {
                let b = match *b {
                    B::None => Operand::None,
                    B::S(s) => Operand::Scalar(s),
                    B::V(j) => Operand::Vector(&vectors[j]),
                };
                (*op, b)
            })
            .collect();
        let want: Vec<f32> = (0..n)
            .map(|i| {
                spec.iter().fold(a[i], |x, (op, b)| {
                    let y = match *b {
                        B::None => 0.0,
                        B::S(s) => s,
                        B::V(j) => vectors[j][i],
                    };
                    match *op {
                        ChainOp::Binary { op, swap: false } => binary_one(op, x, y),
                        ChainOp::Binary { op, swap: true } => binary_one(op, y, x),
                        ChainOp::Max => max_one(x, y),
                        ChainOp::Unary(u) => unary_one::<true>(u, x),
                        ChainOp::NotZero => (x != 0.0) as u8 as f32,
                        ChainOp::Round(kind) => crate::simd::half::round_one(kind, x),
                        ChainOp::Fn(f) => fn_one::<true>(f, x),
                    }
                })
            })
            .collect();
        for &level in levels {
            for stream in [false, level > 0] {
                let skew = rand(8);
                let mut buf = vec![f32::NAN; n + 8];
                let out = &mut buf[skew..skew + n];
                chain_with::<true>(&a, &ops, out, stream, level);
                store_fence();
                for i in 0..n {
                    let (got, w) = (out[i], want[i]);
                    assert!(
                        got.to_bits() == w.to_bits() || (got.is_nan() && w.is_nan()),
                        "case {case} (n {n}, level {level}, stream {stream}, skew {skew}): \
                         element {i} = {got:e}, want {w:e}; ops {:?}",
                        spec.iter().map(|s| s.0).collect::<Vec<_>>()
                    );
                }
            }
        }
    }
}

/// `reduce_short_rows` gives each row exactly what a fresh `Acc` fed the row gives (sum and
/// max, rows of 1 to 130 values and a few longer, any row count, with zeros of both signs,
/// infinities and NaNs among the values).
#[test]
fn short_rows_reduce_like_the_accumulator() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let specials = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30];
    let lens = (1..=130).chain([191, 256, 333, 512]);
    for c in lens {
        for rows in [1, 3, 8, 9, 17] {
            let vals: Vec<f32> = (0..rows * c)
                .map(|_| match rand(40) {
                    0 => specials[rand(specials.len())],
                    // Mostly negative rows now and then, so max meets -inf and -0 runs.
                    1..=3 => -(rand(1000) as f32),
                    _ => (rand(20001) as f32 - 10000.0) / 997.0,
                })
                .collect();
            fn check<const MAX: bool>(vals: &[f32], c: usize, rows: usize) {
                let mut got = vec![f32::NAN; rows];
                reduce_short_rows::<MAX>(vals, c, &mut got);
                for (r, row) in vals.chunks_exact(c).enumerate() {
                    let mut acc = Acc::<MAX>::new();
                    acc.add_slice(row);
                    let want = acc.finish();
                    assert!(
                        got[r].to_bits() == want.to_bits() || (got[r].is_nan() && want.is_nan()),
                        "{} of row {r} (c {c}, rows {rows}): {:e}, want {want:e}",
                        if MAX { "max" } else { "sum" },
                        got[r]
                    );
                }
            }
            check::<false>(&vals, c, rows);
            check::<true>(&vals, c, rows);
        }
    }
}

/// The AVX-512 function path (`fn_slice` with fused multiply-adds on an AVX-512 CPU: a
/// reciprocal estimate refined once, a clamped `2^w`) stays within a few ulp of the primops'
/// arithmetic (the path taken elsewhere, `F = false`) for every function, over the whole
/// range GELU sees and at the specials; and a value does not depend on where it sits: alone
/// (`fn_one`), in a slice's body or in its masked tail, the same bits.
#[test]
fn function_steps_on_avx512_match_the_primop_arithmetic() {
    if detected_isa() != Isa::Avx512 || isa() != Isa::Avx512 {
        return;
    }
    let mut xs: Vec<f32> = (-45 * 256..=45 * 256).map(|i| i as f32 / 256.0).collect();
    xs.extend([
        1e-30, -1e-30, 0.0, -0.0, 1e3, -1e3, 1e30, -1e30, 3e38, -3e38,
    ]);
    let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    for op in [FnOp::GeluTanh, FnOp::GeluTanhGrad, FnOp::GeluErf] {
        let mut fast = vec![0f32; xs.len()];
        let mut exact = vec![0f32; xs.len()];
        fn_slice::<true>(op, &xs, &mut fast);
        fn_slice::<false>(op, &xs, &mut exact);
        for (i, &x) in xs.iter().enumerate() {
            let (a, b) = (fast[i], exact[i]);
            assert!(!a.is_subnormal(), "{op:?}({x}) = {a:e} is subnormal");
            let close =
                a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 2e-6 * b.abs() + 1e-30;
            assert!(close, "{op:?}({x}): {a:e} on AVX-512, {b:e} by the primops");
            assert_eq!(
                fn_one::<true>(op, x).to_bits(),
                a.to_bits(),
                "{op:?}({x}) alone and in a slice"
            );
        }
        for &x in &specials {
            let (mut a, mut b) = ([0f32], [0f32]);
            fn_slice::<true>(op, &[x], &mut a);
            fn_slice::<false>(op, &[x], &mut b);
            assert!(
                a[0].to_bits() == b[0].to_bits() || (a[0].is_nan() && b[0].is_nan()),
                "{op:?}({x}): {} on AVX-512, {} by the primops",
                a[0],
                b[0]
            );
        }
        // Every tail length: the masked lanes compute what the full ones do.
        for len in 1..=33 {
            let part = &xs[1000..1000 + len];
            let mut out = vec![0f32; len];
            fn_slice::<true>(op, part, &mut out);
            for (j, (&o, &f)) in out.iter().zip(&fast[1000..1000 + len]).enumerate() {
                assert_eq!(o.to_bits(), f.to_bits(), "{op:?} len {len} [{j}]");
            }
        }
    }
}
