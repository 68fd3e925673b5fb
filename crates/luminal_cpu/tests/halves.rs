//! f16 / bf16 on the CPU backend, against the reference runtime: matmuls (gemm on widened
//! operands, skinny kernels on the half weights; one rounding), casts (direct kernels; every
//! rounding edge case, and every one of the 65536 bit patterns for the half -> other
//! conversions), f16 weights cast to f32 inside an f32 graph, half ops through views and
//! gathers. Half elementwise ops and reductions are tested op by op in `half_ops.rs`.

mod half_common;

use half_common::*;
use luminal::prelude::*;

fn matmul_cases() -> Vec<MatmulCase> {
    vec![
        case(&[33, 65], &[65, 17], false, false),
        case(&[64, 300], &[300, 48], false, false),
        // Weights stored [N, K] (Linear), activations stored [K, M], both.
        case(&[40, 96], &[24, 96], false, true),
        case(&[96, 40], &[96, 24], true, false),
        case(&[96, 40], &[24, 96], true, true),
        // Batched, and a batch broadcast against one matrix.
        case(&[3, 20, 36], &[3, 36, 28], false, false),
        case(&[2, 3, 9, 16], &[2, 3, 12, 16], false, true),
        case(&[4, 20, 36], &[36, 28], false, false),
        // K = 1, M = 1 (skinny and matvec paths), N = 1, long K.
        case(&[30, 1], &[1, 40], false, false),
        case(&[1, 200], &[200, 300], false, false),
        case(&[1, 200], &[300, 200], false, true),
        case(&[5, 200], &[300, 200], false, true),
        case(&[37, 64], &[64, 1], false, false),
        case(&[4, 4096], &[4096, 8], false, false),
    ]
    .into_iter()
    .chain(skinny_cases())
    .collect()
}

#[test]
fn f16_matmul_matches_reference() {
    for (i, c) in matmul_cases().iter().enumerate() {
        for threads in [1, 2] {
            check_matmul(DType::F16, c, threads, 10 + i as u64);
        }
    }
}

#[test]
fn bf16_matmul_matches_reference() {
    for (i, c) in matmul_cases().iter().enumerate() {
        for threads in [1, 2] {
            check_matmul(DType::BF16, c, threads, 100 + i as u64);
        }
    }
}

#[test]
fn half_matmul_of_sliced_operands() {
    // Operands read from the middle of their buffers (the widened span starts past 0).
    for dtype in [DType::F16, DType::BF16] {
        let cx = Graph::new();
        let a = cx.input("a", (3, 40, 80), dtype);
        let b = cx.input("b", (90, 70), dtype);
        let av = a.slice(0, 1, 3).slice(1, 5, 37).slice(2, 10, 74);
        let bv = b.slice(0, 20, 84).slice(1, 3, 51);
        let y = av.matmul(bv).output();
        let mut rt = cpu(&cx, 2);
        assert_eq!(rt.kernel_names(), vec!["matmul".to_string()]);
        let mut want = reference(&cx);
        let (ad, bd) = (random(dtype, 3 * 40 * 80, 40), random(dtype, 90 * 70, 41));
        for (t, d) in [(a, ad), (b, bd)] {
            rt.set_data(t, d.clone()).unwrap();
            want.set_data(t, d).unwrap();
        }
        rt.run().unwrap();
        want.run().unwrap();
        let (g, r) = (rt.get_f32(y).unwrap(), want.get_f32(y).unwrap());
        assert_eq!(g.len(), 2 * 32 * 48);
        for (g, r) in g.iter().zip(&r) {
            // |a|, |b| < 1, K = 64: Σ|a||b| < 64.
            let tol = 64.0 * 2f32.powi(-7) + 2.0 * ulp(dtype, *r as f64) as f32;
            assert!((g - r).abs() <= tol, "{dtype}: {g} vs {r}");
        }
    }
}

#[test]
fn half_matmul_with_dynamic_rows_reuses_its_scratch() {
    for dtype in [DType::F16, DType::BF16] {
        let cx = Graph::new();
        let x = cx.input("x", ("rows", 48), dtype);
        let w = cx.input("w", (32, 48), dtype);
        let y = x.matmul(w.permute(&[1, 0])).output();
        let mut rt = cpu(&cx, 2);
        let mut want = reference(&cx);
        assert_eq!(rt.kernel_names(), vec!["matmul".to_string()]);
        let wd = random(dtype, 32 * 48, 7);
        rt.set_data(w, wd.clone()).unwrap();
        want.set_data(w, wd).unwrap();
        for (step, rows) in [40usize, 3, 1, 64, 9].into_iter().enumerate() {
            let xd = random(dtype, rows * 48, 20 + step as u64);
            rt.set_dim("rows", rows);
            want.set_dim("rows", rows);
            rt.set_data(x, xd.clone()).unwrap();
            want.set_data(x, xd).unwrap();
            rt.run().unwrap();
            want.run().unwrap();
            let (g, r) = (rt.get_f32(y).unwrap(), want.get_f32(y).unwrap());
            assert_eq!(g.len(), rows * 32);
            for (g, r) in g.iter().zip(&r) {
                // |a|, |b| < 1, K = 48: Σ|a||b| < 48.
                let tol = 48.0 * 2f32.powi(-7) + 2.0 * ulp(dtype, *r as f64) as f32;
                assert!((g - r).abs() <= tol, "{dtype} rows {rows}: {g} vs {r}");
            }
        }
    }
}

/// f32 values at every rounding edge of f16 and bf16.
fn edge_values() -> Vec<f32> {
    let p = |e: i32| 2f32.powi(e);
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        f32::EPSILON,
        // f16 ties at 1: to even (down), to even (up), and just either side.
        1.0 + p(-11),
        1.0 + 3.0 * p(-11),
        f32::from_bits((1.0 + p(-11)).to_bits() + 1),
        f32::from_bits((1.0 + p(-11)).to_bits() - 1),
        // bf16 ties at 1, and an f32 one ulp above a bf16 tie (low bits the reference
        // once dropped).
        1.0 + p(-8),
        1.0 + 3.0 * p(-8),
        f32::from_bits(0x3F80_8001),
        f32::from_bits(0x3F80_7FFF),
        -f32::from_bits(0x3F80_8001),
        // f16 overflow: 65504 is the largest, 65520 the tie to infinity.
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        1.0e5,
        // bf16 overflow: the largest bf16, the tie to infinity, just below it.
        f32::from_bits(0x7F7F_0000),
        f32::from_bits(0x7F7F_8000),
        f32::from_bits(0x7F7F_7FFF),
        // f16 subnormals: the smallest (2^-24), the tie below it to zero, just above that
        // tie, a tie between subnormals (3·2^-25: to even, 2^-23), the largest subnormal,
        // the smallest normal.
        p(-24),
        p(-25),
        f32::from_bits(p(-25).to_bits() + 1),
        3.0 * p(-25),
        1023.0 * p(-24),
        p(-14),
        -p(-24),
        p(-30),
        // bf16 subnormals are f32's: the smallest f32 subnormal, a tie, just above it.
        f32::from_bits(1),
        f32::from_bits(0x0000_8000),
        f32::from_bits(0x0000_8001),
        f32::from_bits(0x0001_8000),
        f32::from_bits(0x007F_FFFF),
        0.1,
        -0.3,
        3.3,
        1.0e-3,
    ];
    // Plus random bit patterns (every exponent, NaN payloads included).
    let mut rng = Rng(0xC0FFEE);
    v.extend((0..20_000).map(|_| f32::from_bits(rng.next() as u32)));
    v
}

#[test]
fn casts_from_f32_round_like_the_reference() {
    let xs = edge_values();
    for dtype in [DType::F16, DType::BF16] {
        let cx = Graph::new();
        let x = cx.tensor("x", xs.len());
        let y = x.cast(dtype).output();
        let mut rt = cpu(&cx, 2);
        assert_eq!(rt.kernel_names(), vec![format!("cast[f32->{dtype}]")]);
        let mut want = reference(&cx);
        rt.set(x, &xs).unwrap();
        want.set(x, &xs).unwrap();
        rt.run().unwrap();
        want.run().unwrap();
        let (got, reference) = (
            rt.get_data(y).unwrap().to_f64(),
            want.get_data(y).unwrap().to_f64(),
        );
        for (i, &x) in xs.iter().enumerate() {
            // `half`'s f32 conversions round to nearest even from the full f32: an
            // independent check of both runtimes.
            let independent = match dtype {
                DType::F16 => f16::from_f32(x).to_f64(),
                _ => bf16::from_f32(x).to_f64(),
            };
            assert!(
                same_value(got[i], reference[i]) && same_value(got[i], independent),
                "{dtype}: cast of {x:e} ({:#010x}): {} vs reference {} vs half {}",
                x.to_bits(),
                got[i],
                reference[i],
                independent
            );
        }
    }
}

#[test]
fn casts_from_halves_match_the_reference_on_every_bit_pattern() {
    for (from, to) in [
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F16, DType::BF16),
        (DType::BF16, DType::F16),
    ] {
        let cx = Graph::new();
        let x = cx.input("x", 65536, from);
        let y = x.cast(to).output();
        let mut rt = cpu(&cx, 2);
        assert_no_fallback(&rt);
        let mut want = reference(&cx);
        rt.set_data(x, all_bit_patterns(from)).unwrap();
        want.set_data(x, all_bit_patterns(from)).unwrap();
        rt.run().unwrap();
        want.run().unwrap();
        let (g, w) = (rt.get_data(y).unwrap(), want.get_data(y).unwrap());
        assert_eq!(g.dtype(), to);
        let (g, w) = (g.to_f64(), w.to_f64());
        for i in 0..65536 {
            assert!(
                same_value(g[i], w[i]),
                "{from}->{to}: pattern {i:#06x}: {} vs reference {}",
                g[i],
                w[i]
            );
        }
    }
}

#[test]
fn casts_through_views_match_the_reference() {
    // Permuted, sliced and padded reads of f32 and f16 data, cast both ways.
    for (from, to) in [
        (DType::F32, DType::F16),
        (DType::F32, DType::BF16),
        (DType::F16, DType::F32),
        (DType::BF16, DType::F16),
    ] {
        let cx = Graph::new();
        let x = cx.input("x", (30, 70), from);
        let v = x
            .permute(&[1, 0])
            .slice(0, 3, 67)
            .pad(&[(2, 1), (0, 3)], 0.0);
        let y = v.cast(to).output();
        let mut rt = cpu(&cx, 2);
        assert_no_fallback(&rt);
        let mut want = reference(&cx);
        let data = HostData::from_f64(
            from,
            &random(DType::F32, 30 * 70, 3)
                .to_f64()
                .iter()
                .map(|v| v * 1000.0)
                .collect::<Vec<_>>(),
        );
        rt.set_data(x, data.clone()).unwrap();
        want.set_data(x, data).unwrap();
        rt.run().unwrap();
        want.run().unwrap();
        assert_eq!(
            rt.get_data(y).unwrap(),
            want.get_data(y).unwrap(),
            "{from}->{to}"
        );
    }
}

#[test]
fn f16_weights_cast_to_f32_in_an_f32_graph() {
    // An MLP layer whose weights are stored f16 (and bias bf16): cast to f32, matmul and
    // epilogue in f32, the result handed back as f16.
    let cx = Graph::new();
    let x = cx.tensor("x", (16, 96));
    let w = cx.input("w", (64, 96), DType::F16);
    let bias = cx.input("bias", 64, DType::BF16);
    let h = x.matmul(w.cast(DType::F32).permute(&[1, 0])) + bias.cast(DType::F32).expand(0, 16);
    let y = h.relu().cast(DType::F16).output();
    let z = (x * 0.5).sum(1).output();
    let mut rt = cpu(&cx, 2);
    let names = rt.kernel_names();
    assert_no_fallback(&rt);
    // The bias add and relu run as the matmul's epilogue.
    assert!(names.contains(&"matmul+[Add,Max]".to_string()), "{names:?}");
    assert!(names.contains(&"cast[f32->f16]".to_string()), "{names:?}");
    let mut want = reference(&cx);
    let xd: Vec<f32> = random(DType::F32, 16 * 96, 1).to_f32();
    let (wd, bd) = (random(DType::F16, 64 * 96, 2), random(DType::BF16, 64, 3));
    rt.set(x, &xd).unwrap();
    want.set(x, &xd).unwrap();
    rt.set_data(w, wd.clone()).unwrap();
    want.set_data(w, wd).unwrap();
    rt.set_data(bias, bd.clone()).unwrap();
    want.set_data(bias, bd).unwrap();
    rt.run().unwrap();
    want.run().unwrap();
    let (g, r) = (rt.get_data(y).unwrap(), want.get_data(y).unwrap());
    assert_eq!(g.dtype(), DType::F16);
    for (g, r) in g.to_f64().iter().zip(r.to_f64()) {
        // f32 sums of 96 terms below 1 in magnitude, then one f16 rounding each.
        let tol = 96.0 * 2f64.powi(-22) + ulp(DType::F16, r);
        assert!((g - r).abs() <= tol, "{g} vs {r}");
    }
    let (g, r) = (rt.get_f32(z).unwrap(), want.get_f32(z).unwrap());
    for (g, r) in g.iter().zip(&r) {
        assert!((g - r).abs() <= 1e-5, "{g} vs {r}");
    }
}

#[test]
fn half_data_read_by_an_f32_tree_is_one_fused_kernel() {
    let cx = Graph::new();
    let x = cx.tensor("x", 4096);
    let w = cx.input("w", 4096, DType::BF16);
    let v = cx.input("v", 4096, DType::F16);
    let y = ((x * w.cast(DType::F32)).exp() + v.cast(DType::F32)).output();
    let mut rt = cpu(&cx, 2);
    let names = rt.kernel_names();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with("elementwise"), "{names:?}");
    let mut want = reference(&cx);
    let xd = random(DType::F32, 4096, 4).to_f32();
    let (wd, vd) = (random(DType::BF16, 4096, 5), random(DType::F16, 4096, 6));
    rt.set(x, &xd).unwrap();
    want.set(x, &xd).unwrap();
    rt.set_data(w, wd.clone()).unwrap();
    want.set_data(w, wd).unwrap();
    rt.set_data(v, vd.clone()).unwrap();
    want.set_data(v, vd).unwrap();
    rt.run().unwrap();
    want.run().unwrap();
    let (g, r) = (rt.get_f32(y).unwrap(), want.get_f32(y).unwrap());
    for (g, r) in g.iter().zip(&r) {
        assert!((g - r).abs() <= 1e-5 * r.abs().max(1.0), "{g} vs {r}");
    }
}

#[test]
fn half_ops_through_views_match_the_reference_bit_for_bit() {
    for dtype in [DType::F16, DType::BF16] {
        let cx = Graph::new();
        let a = cx.input("a", (12, 20), dtype);
        let b = cx.input("b", (12, 20), dtype);
        let ids = cx.input("ids", 5, DType::I32);
        let s = (((a * a + b * b).sqrt() - a * b) % (b + 2.0))
            .sum(1)
            .output();
        let m = a.permute(&[1, 0]).contiguous().max(0).output();
        let g = a.embedding(ids).output();
        let lt = a.lt(b).output();
        let mut rt = cpu(&cx, 2);
        let mut want = reference(&cx);
        let (ad, bd) = (random(dtype, 240, 8), random(dtype, 240, 9));
        let idd = [3i32, 0, 11, 3, 7];
        for (t, d) in [(a, ad), (b, bd)] {
            rt.set_data(t, d.clone()).unwrap();
            want.set_data(t, d).unwrap();
        }
        rt.set(ids, &idd).unwrap();
        want.set(ids, &idd).unwrap();
        rt.run().unwrap();
        want.run().unwrap();
        let names = rt.kernel_names();
        assert!(
            names.iter().all(|n| !n.starts_with("fallback")),
            "{names:?}"
        );
        for t in [s, m, g, lt] {
            // Correctly rounded ops, f64 sums, exact max, copies: equal, bit for bit.
            assert_eq!(
                rt.get_data(t).unwrap(),
                want.get_data(t).unwrap(),
                "{dtype}"
            );
        }
        assert_eq!(rt.get_data(g).unwrap().dtype(), dtype);
        // Outputs read back in their own dtype only.
        assert!(rt.get::<f32>(s).is_err());
    }
}

/// New cache rows that are an elementwise tree (a decode step's RoPE'd keys cast to the
/// cache's type) are evaluated straight into the state buffer: one `write_slice+[...]`
/// launch, no kernel of their own, the same values as the reference. A few rows (one task
/// on the calling thread) and many (parallel pieces), every float cache type.
#[test]
fn elementwise_rows_written_straight_into_the_state() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (heads, ctx, dim, s) in [(3usize, 10usize, 64usize, 1usize), (2, 300, 64, 256)] {
            for threads in [1, 2] {
                let cx = Graph::new();
                let cache = cx.input("cache", (heads, ctx, dim), dtype);
                let x = cx.input("x", (heads, s, dim), DType::F32);
                // Halves swapped (two masked views, as RoPE's rotation), then exact ops.
                let swapped = x
                    .slice(-1, dim / 2, dim)
                    .concat_along(x.slice(-1, 0, dim / 2), -1);
                let y = swapped * 3.0 + x * 0.5;
                let y = if dtype == DType::F32 {
                    y
                } else {
                    y.cast(dtype)
                };
                let updated = cache.write_slice(1, "pos", y).output();
                let mut rt = cpu(&cx, threads);
                let names = rt.kernel_names();
                assert!(
                    names.iter().any(|n| n.starts_with("write_slice+"))
                        && !names
                            .iter()
                            .any(|n| n.starts_with("cast") || n.starts_with("elementwise")),
                    "{dtype}: {names:?}"
                );
                let mut want = reference(&cx);
                let cd = random(dtype, heads * ctx * dim, 7);
                rt.set_data(cache, cd.clone()).unwrap();
                want.set_data(cache, cd).unwrap();
                for (i, pos) in [0, 3, ctx - s].into_iter().enumerate() {
                    let xd = random(DType::F32, heads * s * dim, 40 + i as u64);
                    rt.set_dim("pos", pos);
                    want.set_dim("pos", pos);
                    rt.set_data(x, xd.clone()).unwrap();
                    want.set_data(x, xd).unwrap();
                    rt.run().unwrap();
                    want.run().unwrap();
                    assert_eq!(
                        rt.get_data(updated).unwrap(),
                        want.get_data(updated).unwrap(),
                        "{dtype}, {heads}x{ctx}x{dim}, {s} rows at {pos}, {threads} threads"
                    );
                }
            }
        }
    }
}

#[test]
fn half_state_written_in_place() {
    // A KV-cache style state in f16: write rows in place, read the cache through a matmul.
    let cx = Graph::new();
    let cache = cx.input("cache", (8, 16), DType::F16);
    let row = cx.input("row", (1, 16), DType::F16);
    let q = cx.input("q", (2, 16), DType::F16);
    let updated = cache.write_slice(0, "pos", row);
    let scores = q.matmul(updated.permute(&[1, 0])).output();
    let mut rt = cpu(&cx, 1);
    let mut want = reference(&cx);
    let (cd, qd) = (random(DType::F16, 128, 11), random(DType::F16, 32, 12));
    for (t, d) in [(cache, cd), (q, qd)] {
        rt.set_data(t, d.clone()).unwrap();
        want.set_data(t, d).unwrap();
    }
    for pos in [0usize, 5, 7] {
        let rd = random(DType::F16, 16, 30 + pos as u64);
        rt.set_dim("pos", pos);
        want.set_dim("pos", pos);
        rt.set_data(row, rd.clone()).unwrap();
        want.set_data(row, rd).unwrap();
        rt.run().unwrap();
        want.run().unwrap();
        let (g, r) = (rt.get_f32(scores).unwrap(), want.get_f32(scores).unwrap());
        for (g, r) in g.iter().zip(&r) {
            let tol = 16.0 * 2f32.powi(-10) + 2.0 * ulp(DType::F16, *r as f64) as f32;
            assert!((g - r).abs() <= tol, "pos {pos}: {g} vs {r}");
        }
        assert_eq!(
            rt.get_data(updated).unwrap(),
            want.get_data(updated).unwrap()
        );
    }
}
