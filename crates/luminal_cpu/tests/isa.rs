//! The op suite at every instruction-set level this CPU supports (the kernels are compiled
//! once per level: baseline, AVX2+FMA, AVX-512). One test function, because the level is
//! process-wide.

mod half_common;

use luminal::prelude::*;
use luminal_cpu::{detected_isa, set_max_isa, CpuBackend, Isa};

/// Unary specials through a fused kernel: the vector polynomials must match libm's
/// special values and stay within the suite's tolerance elsewhere.
fn specials() {
    let xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        126.9,
        127.9,
        128.0,
        -126.5,
        -149.0,
        -150.0,
        -200.0,
        1e-40,
        3.0e38,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        8191.0,
        8193.0,
        1e6,
        -1e7,
    ];
    let cx = Graph::new();
    let x = cx.tensor("x", xs.len());
    let outs = [x.exp2().output(), x.log2().output(), x.sin().output()];
    let mut rt = cx
        .compile(CpuBackend::with_threads(1), CompileOptions::default())
        .unwrap();
    rt.set(x, &xs).unwrap();
    rt.run().unwrap();
    let refs: [fn(f64) -> f64; 3] = [f64::exp2, f64::log2, f64::sin];
    for (o, f) in outs.iter().zip(refs) {
        let got = rt.get::<f32>(*o).unwrap();
        for (&x, &g) in xs.iter().zip(&got) {
            let want = f(x as f64) as f32;
            let ok = (g.is_nan() && want.is_nan())
                || g == want
                || ((g - want).abs() as f64) <= 1e-6 + 1e-6 * want.abs() as f64;
            assert!(ok, "{o:?}({x:e}) = {g:e}, want {want:e}");
        }
    }
}

#[test]
fn op_suite_at_every_isa_level() {
    let best = detected_isa();
    for isa in [Isa::Generic, Isa::Avx2, Isa::Avx512] {
        if isa > best {
            continue;
        }
        assert_eq!(set_max_isa(isa), isa);
        specials();
        for family in [
            "unary", "binary", "reduce", "movement", "nn", "conv", "index", "dtype", "dynamic",
        ] {
            luminal::testing::run_family(family, CpuBackend::default);
        }
        // Half kernels (F16C conversions at AVX2 and above, `half`'s below).
        half_common::check_unary_ops();
        half_common::check_binary_ops();
        for (i, c) in half_common::skinny_cases().iter().enumerate() {
            for dtype in half_common::HALVES {
                half_common::check_matmul(dtype, c, 2, 200 + i as u64);
            }
        }
    }
    set_max_isa(Isa::Avx512);
}
