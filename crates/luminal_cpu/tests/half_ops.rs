//! f16 / bf16 elementwise ops and reductions on the CPU backend, against the reference
//! runtime, op by op and fused.
//!
//! The fused interpreter computes each half op in f32 and rounds the result to the half
//! type. For `+`, `×`, `%`, `sqrt` and `1/x` that equals the reference's single rounding of
//! the exact (f64) result: f32 carries at least `2p + 2` significand bits of a `p`-bit half
//! type (f16: 11, bf16: 8), which makes the double rounding innocuous, and products and
//! remainders of halves are exact in f32 anyway. Those are compared bit for bit. `exp2`,
//! `log2` and `sin` are polynomial approximations within 2 f32 ulps, so after rounding to
//! the half type they match the reference except next to a rounding tie: one half ulp of
//! tolerance. Half sums accumulate in f64 in the reference's order and round once: bit for
//! bit.

mod half_common;

use half_common::*;
use luminal::prelude::*;

#[test]
fn half_unary_ops_match_the_reference_on_every_bit_pattern() {
    check_unary_ops();
}

#[test]
fn half_binary_ops_match_the_reference_bit_for_bit() {
    check_binary_ops();
}

#[test]
fn half_sums_overflow_to_infinity_like_the_reference() {
    for dtype in HALVES {
        let max = special_values(dtype)[5];
        let cx = Graph::new();
        let a = cx.input("a", 6, dtype);
        let b = cx.input("b", 6, dtype);
        let y = (a + b).output();
        let mut rt = cpu(&cx, 1);
        let half_ulp = special_values(dtype)[7];
        let ad = HostData::from_f64(dtype, &[max, max, -max, max, max, max]);
        let bd = HostData::from_f64(
            dtype,
            &[
                max,
                half_ulp,
                -half_ulp,
                half_ulp / 2.0,
                -max,
                f64::INFINITY,
            ],
        );
        let want = run_both(&cx, &mut rt, &[(a, ad), (b, bd)]);
        let g = rt.get_data(y).unwrap().to_f64();
        assert_eq!(g[0], f64::INFINITY, "{dtype}");
        assert_eq!(
            g[1],
            f64::INFINITY,
            "{dtype}: the tie above the largest value"
        );
        assert_eq!(g[2], f64::NEG_INFINITY, "{dtype}");
        assert_eq!(g[3], max, "{dtype}: below the tie");
        assert_eq!(g[4], 0.0, "{dtype}");
        assert_close(
            dtype,
            &rt.get_data(y).unwrap(),
            &want.get_data(y).unwrap(),
            0.0,
            "sum",
        );
    }
}

#[test]
fn half_chains_fuse_into_one_kernel() {
    for dtype in HALVES {
        let n = 3 * 4096 + 77;
        let cx = Graph::new();
        let a = cx.input("a", n, dtype);
        let b = cx.input("b", n, dtype);
        let c = cx.input("c", n, dtype);
        // Correctly rounded ops only: bit for bit.
        let exact = (((a * b + c) % (a + 2.5)).sqrt() + (b * c).recip() * a - c * 0.1).output();
        let (ad, bd, cd) = (
            half_values(dtype, n, 10),
            half_values(dtype, n, 11),
            half_values(dtype, n, 12),
        );
        {
            let mut rt = cpu(&cx, 2);
            assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
            assert_all_fused(&rt, "elementwise");
            let want = run_both(
                &cx,
                &mut rt,
                &[(a, ad.clone()), (b, bd.clone()), (c, cd.clone())],
            );
            let (g, w) = (rt.get_data(exact).unwrap(), want.get_data(exact).unwrap());
            assert_eq!(g.dtype(), dtype);
            assert_close(dtype, &g, &w, 0.0, &format!("{dtype} exact chain"));
        }
        // A transcendental last: one half ulp.
        type Chain =
            for<'g> fn(GraphTensor<'g>, GraphTensor<'g>, GraphTensor<'g>) -> GraphTensor<'g>;
        let chains: [Chain; 4] = [
            |a, b, c| (a * b + c).exp2(),
            |a, b, _| (a * a + b * b).log2(),
            |a, _, c| (a * c * 3.0).sin(),
            |a, _, _| (a * 0.5).exp(),
        ];
        for (i, f) in chains.into_iter().enumerate() {
            let cx = Graph::new();
            let (x, y, z) = (
                cx.input("a", n, dtype),
                cx.input("b", n, dtype),
                cx.input("c", n, dtype),
            );
            let out = f(x, y, z).output();
            let mut rt = cpu(&cx, 2);
            assert_eq!(rt.kernel_count(), 1, "{:?}", rt.kernel_names());
            let want = run_both(
                &cx,
                &mut rt,
                &[(x, ad.clone()), (y, bd.clone()), (z, cd.clone())],
            );
            let (g, w) = (rt.get_data(out).unwrap(), want.get_data(out).unwrap());
            assert_close(dtype, &g, &w, 1.0, &format!("{dtype} chain {i}"));
        }
    }
}

#[test]
fn mixed_f32_and_half_graphs() {
    for dtype in HALVES {
        let n = 5000;
        let cx = Graph::new();
        let x = cx.tensor("x", n);
        let h = cx.input("h", n, dtype);
        let g = cx.input("g", n, dtype);
        // f32 math cast into a half product; half math cast into an f32 product; a half
        // comparison cast back into half math.
        let to_half = ((x * 3.0 + h.cast(DType::F32)).cast(dtype) * g).output();
        let to_f32 = ((h * g + h).cast(DType::F32) * x).output();
        let masked = (h.lt(g).cast(dtype) * h + g).output();
        let mut rt = cpu(&cx, 2);
        assert_eq!(rt.kernel_count(), 3, "{:?}", rt.kernel_names());
        assert_all_fused(&rt, "elementwise");
        let xd = HostData::F32(
            random(DType::F32, n, 20)
                .to_f32()
                .iter()
                .map(|v| v * 100.0)
                .collect(),
        );
        let (hd, gd) = (half_values(dtype, n, 21), half_values(dtype, n, 22));
        let want = run_both(&cx, &mut rt, &[(x, xd), (h, hd), (g, gd)]);
        for (name, o, out_dt) in [
            ("to_half", to_half, dtype),
            ("to_f32", to_f32, DType::F32),
            ("masked", masked, dtype),
        ] {
            let (gv, wv) = (rt.get_data(o).unwrap(), want.get_data(o).unwrap());
            assert_eq!(gv.dtype(), out_dt);
            // f32 ops and half ops are each correctly rounded: bit for bit.
            let (gv, wv) = (gv.to_f64(), wv.to_f64());
            for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
                assert!(
                    same_value(*a, *b),
                    "{dtype} {name}: element {i}: {a:e} vs {b:e}"
                );
            }
        }
    }
}

#[test]
fn half_reductions_match_the_reference_bit_for_bit() {
    for dtype in HALVES {
        let (rows, len, inner) = (9, 301, 7);
        let cx = Graph::new();
        let x = cx.input("x", (rows, len, inner), dtype);
        let y = cx.input("y", (rows, len, inner), dtype);
        let outs = [
            ("sum last", x.sum(2).output()),
            ("sum middle", x.sum(1).output()),
            ("sum first", x.sum(0).output()),
            ("max last", x.max(2).output()),
            ("max middle", x.max(1).output()),
            // A fused half product summed (not a matmul: no broadcast).
            ("sum of products", (x * y).sum(1).output()),
        ];
        let mut rt = cpu(&cx, 2);
        let names = rt.kernel_names();
        assert!(
            names.iter().all(|n| !n.starts_with("fallback")),
            "{names:?}"
        );
        assert!(
            names.contains(&"SumReduce(1)[Mul]".to_string()),
            "{names:?}"
        );
        // Moderate values with specials mixed in: infinities, NaN, the largest values (sums
        // overflow), subnormals.
        let (xd, yd) = (
            half_values(dtype, rows * len * inner, 30),
            half_values(dtype, rows * len * inner, 31),
        );
        let want = run_both(&cx, &mut rt, &[(x, xd), (y, yd)]);
        for (name, o) in outs {
            let (g, w) = (rt.get_data(o).unwrap(), want.get_data(o).unwrap());
            assert_close(dtype, &g, &w, 0.0, &format!("{dtype} {name}"));
        }
        // Finite moderate values, so the sums themselves (of products each rounded to the
        // half type, as the reference rounds its `Mul`) are compared.
        let (xd, yd) = (
            random(dtype, rows * len * inner, 32),
            random(dtype, rows * len * inner, 33),
        );
        let want = run_both(&cx, &mut rt, &[(x, xd), (y, yd)]);
        for (name, o) in outs {
            let (g, w) = (rt.get_data(o).unwrap(), want.get_data(o).unwrap());
            assert_close(dtype, &g, &w, 0.0, &format!("{dtype} {name}, finite"));
        }
    }
}

#[test]
fn half_sums_of_finite_values_match_the_reference_bit_for_bit() {
    // Without infinities or NaN, so the sums themselves are compared: rows longer than the
    // f16 exact-in-any-order bound (sequential f64 there), bf16 values of every magnitude.
    for (dtype, len) in [(DType::F16, 300), (DType::F16, 10_000), (DType::BF16, 3000)] {
        let rows = 6;
        let mut rng = Rng(len as u64);
        let v: Vec<f64> = (0..rows * len)
            .map(|_| loop {
                let x = from_bits(dtype, rng.next() as u16);
                if x.is_finite() {
                    break x;
                }
            })
            .collect();
        let cx = Graph::new();
        let x = cx.input("x", (rows, len), dtype);
        let s = x.sum(1).output();
        let m = x.mean(1).output();
        let mut rt = cpu(&cx, 2);
        let want = run_both(&cx, &mut rt, &[(x, HostData::from_f64(dtype, &v))]);
        for (name, o) in [("sum", s), ("mean", m)] {
            let (g, w) = (rt.get_data(o).unwrap(), want.get_data(o).unwrap());
            assert_close(dtype, &g, &w, 0.0, &format!("{dtype} {name} of {len}"));
        }
    }
}

#[test]
fn half_constants_over_dynamic_dims() {
    // `mean` over a dynamic axis divides by the dim: a half constant evaluated at launch,
    // rounded once; `recip` of it is a scalar step rounded to the half type.
    for dtype in HALVES {
        let cx = Graph::new();
        let x = cx.input("x", (3, "n"), dtype);
        let m = x.mean(1).output();
        let scaled = (x * cx
            .constant_expr(Expression::var("n"), dtype)
            .expand_to((3, "n")))
        .output();
        let mut rt = cpu(&cx, 2);
        let names = rt.kernel_names();
        assert!(
            names.iter().all(|n| !n.starts_with("fallback")),
            "{names:?}"
        );
        let mut want = reference(&cx);
        for n in [1usize, 7, 3001] {
            rt.set_dim("n", n);
            want.set_dim("n", n);
            let xd = half_values(dtype, 3 * n, n as u64);
            rt.set_data(x, xd.clone()).unwrap();
            want.set_data(x, xd).unwrap();
            rt.run().unwrap();
            want.run().unwrap();
            for (name, o) in [("mean", m), ("scaled", scaled)] {
                let (g, w) = (rt.get_data(o).unwrap(), want.get_data(o).unwrap());
                assert_close(dtype, &g, &w, 0.0, &format!("{dtype} {name}, n = {n}"));
            }
        }
    }
}

#[test]
fn half_softmax_and_norms_without_fallback() {
    for dtype in HALVES {
        let cx = Graph::new();
        let x = cx.input("x", (5, 96), dtype);
        let outs = [
            x.softmax(1).output(),
            x.layer_norm(1, 1e-5).output(),
            x.rms_norm(1, 1e-5).output(),
            x.gelu().output(),
            x.silu().output(),
        ];
        let mut rt = cpu(&cx, 2);
        let names = rt.kernel_names();
        assert!(
            names.iter().all(|n| !n.starts_with("fallback")),
            "{names:?}"
        );
        let xd = random(dtype, 5 * 96, 40);
        let want = run_both(&cx, &mut rt, &[(x, xd)]);
        for (i, o) in outs.into_iter().enumerate() {
            let (g, w) = (
                rt.get_data(o).unwrap().to_f64(),
                want.get_data(o).unwrap().to_f64(),
            );
            // Each transcendental may differ by a half ulp, which later ops carry on.
            for (a, b) in g.iter().zip(&w) {
                assert!(
                    (a - b).abs() <= 4.0 * ulp(dtype, b.abs().max(1.0)),
                    "{dtype} output {i}: {a} vs {b}"
                );
            }
        }
    }
}
