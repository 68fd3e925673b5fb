//! Tests of the AMX f32 products against f64 references, and timings (ignored by
//! default).

use super::pack::split;
use super::*;
use MatmulPrecision::{High, Highest};

/// `v` as a row-major matrix of `cols` columns.
fn rows(v: &[f32], cols: usize) -> Mat {
    Mat {
        ptr: v.as_ptr(),
        rs: cols as isize,
        cs: 1,
    }
}

/// `v` as a column-major matrix of `rows` rows.
fn cols(v: &[f32], rows: usize) -> Mat {
    Mat {
        ptr: v.as_ptr(),
        rs: 1,
        cs: rows as isize,
    }
}

/// Row `i` of row-major `a` (`k` columns) times column `j` of row-major `b` (`n`
/// columns) in f64: the sum and the sum of the products' magnitudes.
fn f64_dot(a: &[f32], b: &[f32], (i, j): (usize, usize), k: usize, n: usize) -> (f64, f64) {
    (0..k)
        .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
        .fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()))
}

#[test]
fn pieces_hold_24_bits() {
    for &x in &[1.0f32, -3.14159265, 1e-20, 7.0e12, 0.1, -0.33333334] {
        let [h, m, l] = split(x);
        let back = |b: u16| f32::from_bits((b as u32) << 16) as f64;
        let sum = back(h) + back(m) + back(l);
        assert!(
            ((sum - x as f64) / x as f64).abs() < 2f64.powi(-24),
            "{x}: {sum}"
        );
    }
}

#[test]
fn products_match_f64_at_f32_accuracy() {
    if !hardware() {
        eprintln!("skipping: no AMX-BF16 here");
        return;
    }
    check_against_f64(Highest, 4.0 * f32::EPSILON as f64);
}

/// The three-pass form: within 2⁻¹⁵ of the sum of magnitudes (the dropped `mm` term and
/// the pieces' 16 bits: ~2⁻¹⁶ each).
#[test]
fn three_pass_products_match_f64_within_2_pow_minus_15() {
    if !hardware() {
        eprintln!("skipping: no AMX-BF16 here");
        return;
    }
    check_against_f64(High, 2f64.powi(-15));
}

/// Infinities, NaNs and values past bf16's range are refused by the pieces, and the
/// f32 product then comes from the SIMD kernel: `inf · 1` stays `inf` (the pieces would
/// give `inf · 0 = NaN` for the lower piece of 1.0), `3.39e38 · 1` stays finite, a NaN
/// spreads along its row only.
#[test]
fn values_the_pieces_cannot_carry_give_f32_results() {
    let (m, n, k) = (40, 160, 160);
    if !crate::kernels::matmul::gemm_f32::amx_for(n, k) {
        eprintln!("skipping: no AMX-BF16 here (or capped by LUMINAL_CPU_ISA / LUMINAL_AMX)");
        return;
    }
    for (bad, want) in [
        (f32::INFINITY, f32::INFINITY),
        (f32::NEG_INFINITY, f32::NEG_INFINITY),
        (3.39e38, 3.39e38 + 159.0),
        (f32::NAN, f32::NAN),
    ] {
        let mut a = vec![1f32; m * k];
        a[3 * k + 7] = bad;
        let b = vec![1f32; k * n];
        let am = rows(&a, k);
        let bm = rows(&b, n);
        for precision in [Highest, High] {
            let mut c = vec![0f32; m * n];
            assert!(!unsafe { sgemm(m, n, k, am, bm, c.as_mut_ptr(), n, precision, None) });
        }
        // Through the dispatcher, on AMX otherwise.
        let mut c = vec![0f32; m * n];
        unsafe { crate::kernels::matmul::gemm_f32::sgemm(m, n, k, am, bm, c.as_mut_ptr(), n) };
        for i in 0..m {
            for j in 0..n {
                let got = c[i * n + j];
                if i == 3 {
                    assert!(
                        got == want || (want.is_nan() && got.is_nan()),
                        "{bad}: ({i}, {j}) {got}"
                    );
                } else {
                    assert_eq!(got, k as f32, "{bad}: ({i}, {j})");
                }
            }
        }
    }
}

/// A product taller than `A_GROUP_BYTES` of pieces runs in row groups: rows on both
/// sides of the group boundary and the last rows against f64.
#[test]
fn tall_products_run_in_row_groups() {
    if !hardware() {
        eprintln!("skipping: no AMX-BF16 here");
        return;
    }
    let (m, n, k) = (6000, 40, 1024);
    let group = A_GROUP_BYTES / (k * 3 * 2) / 32 * 32;
    assert!(group < m, "the product must span two groups");
    let vals = crate::kernels::matmul::testing::vals;
    let (a, b) = (vals(m * k, 3), vals(k * n, 4));
    let mut c = vec![f32::NAN; m * n];
    let am = rows(&a, k);
    let bm = rows(&b, n);
    assert!(unsafe { sgemm(m, n, k, am, bm, c.as_mut_ptr(), n, Highest, None) });
    for i in [0, group - 1, group, group + 1, m - 1] {
        for j in 0..n {
            let (want, mag) = f64_dot(&a, &b, (i, j), k, n);
            let got = c[i * n + j] as f64;
            assert!(
                (got - want).abs() <= 4.0 * f32::EPSILON as f64 * mag,
                "({i}, {j}): want {want}, got {got}"
            );
        }
    }
    assert!(c.iter().all(|x| x.is_finite()), "every element written");
}

/// [`sgemm`] at `precision` against f64 sums on odd shapes (K across several chunks, row
/// and column blocks with edges), A and B row-major and column-major: each element
/// within `rel` of the sum of the magnitudes of its products.
fn check_against_f64(precision: MatmulPrecision, rel: f64) {
    let vals = crate::kernels::matmul::testing::vals;
    for &(m, n, k) in &[
        (32, 32, 32),
        (37, 45, 70),
        (64, 100, 384),
        (129, 33, 1000),
        (100, 1500, 200),
    ] {
        let (a, b) = (vals(m * k, 1), vals(k * n, 2));
        // B transposed in memory too: element (r, c) at c·k + r; A likewise: (i, p) at
        // p·m + i.
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let at: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
        let a_layouts = [
            (rows(&a, k), "A row-major"),
            (cols(&at, m), "A column-major"),
        ];
        let b_layouts = [
            (rows(&b, n), "B row-major"),
            (cols(&bt, k), "B column-major"),
        ];
        for ((am, a_label), (bm, b_label)) in a_layouts
            .iter()
            .flat_map(|a| b_layouts.iter().map(move |b| (*a, *b)))
        {
            let label = format!("{a_label}, {b_label}");
            let mut c = vec![f32::NAN; m * (n + 3)];
            assert!(unsafe { sgemm(m, n, k, am, bm, c.as_mut_ptr(), n + 3, precision, None) });
            for i in 0..m {
                for j in 0..n {
                    let (want, mag) = f64_dot(&a, &b, (i, j), k, n);
                    let got = c[i * (n + 3) + j] as f64;
                    assert!(
                        (got - want).abs() <= rel * mag.max(1e-30),
                        "{label} {m}x{n}x{k} ({i}, {j}): want {want}, got {got}"
                    );
                }
            }
            // The padding columns of C are not written.
            assert!(c[n].is_nan(), "{label}: wrote past the row");
        }
    }
}

/// One thread, BERT-sized and Llama-sized products: AMX against the AVX-512 kernel
/// (`cargo test --release -p luminal_cpu --lib amx_speed -- --ignored --nocapture`).
#[test]
#[ignore]
fn amx_speed() {
    if !hardware() {
        eprintln!("skipping: no AMX-BF16 here");
        return;
    }
    for &(m, n, k) in &[
        (2048, 1536, 384),
        (2048, 384, 1536),
        (512, 2048, 2048),
        (128, 576, 576),
        // The tiny GPT's training products (forward, dX, dW).
        (1024, 192, 64),
        (1024, 64, 256),
        (64, 192, 1024),
        (512, 64, 64),
    ] {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
            .collect();
        let c = vec![0f32; m * n];
        let am = rows(&a, k);
        let bm = rows(&b, n);
        let time = |f: &dyn Fn(*mut f32)| {
            f(c.as_ptr() as *mut f32);
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                f(c.as_ptr() as *mut f32);
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        };
        let t_amx = time(&|c| assert!(unsafe { sgemm(m, n, k, am, bm, c, n, Highest, None) }));
        let t_high = time(&|c| assert!(unsafe { sgemm(m, n, k, am, bm, c, n, High, None) }));
        let t_simd =
            time(&|c| unsafe { super::super::gemm_f32::sgemm_simd(m, n, k, am, bm, c, n) });
        let gf = |t: f64| 2.0 * (m * n * k) as f64 / t / 1e9;
        println!(
            "{m}x{n}x{k}: AMX 6 passes {:.2} ms ({:.0} GFLOP/s), 3 passes {:.2} ms ({:.0}), \
             AVX-512 {:.2} ms ({:.0}); AVX-512 / AMX {:.2}x, {:.2}x",
            t_amx * 1e3,
            gf(t_amx),
            t_high * 1e3,
            gf(t_high),
            t_simd * 1e3,
            gf(t_simd),
            t_simd / t_amx,
            t_simd / t_high
        );
    }
}

/// Tile-product rates (measurements, ignored by default).
mod peak_probe {
    use super::*;
    use std::arch::asm;

    /// Tile-product rates on one thread with every operand in L1 (a measurement that
    /// asserts nothing; quoted in benches/README.md): no loads at all, the order by B piece
    /// used before [`TRAIL_F32`] (two B tiles, then two A tiles before each four products:
    /// 18 loads for 24 products, in bursts), and [`chunk`] itself over L1-resident tiles
    /// (`cargo test --release -p luminal_cpu --lib tmul_rates -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn tmul_rates() {
        if !available() {
            eprintln!("skipping: no AMX-BF16 here");
            return;
        }
        // 3 pieces × 2 panels × 2 K blocks of A and of B (24 KiB), and a 32 × 32 C.
        let buf = vec![0u16; 24 * TILE];
        let mut c = vec![0f32; 32 * 32];
        let reps = 300_000usize;
        let rate = |blocks: usize, secs: f64| {
            let macs = (blocks * 24 * 16 * 16 * 32) as f64;
            format!(
                "{:.0} GMAC/s ({:.0} GFLOP/s at f32 accuracy)",
                macs / secs / 1e9,
                2.0 * macs / secs / 1e9 / 6.0
            )
        };
        let p = buf.as_ptr();
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
            asm!("tileloadd tmm4, [{0} + {1}*1]", "tileloadd tmm5, [{0} + {1}*1]",
                 "tileloadd tmm6, [{0} + {1}*1]", "tileloadd tmm7, [{0} + {1}*1]",
                 in(reg) p, in(reg) 64usize, options(nostack, readonly));
            let t = std::time::Instant::now();
            for _ in 0..reps * 6 {
                asm!(
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    options(nostack, nomem)
                );
            }
            println!("no loads: {}", rate(reps, t.elapsed().as_secs_f64()));
            // `LOADS` tile loads before each four products, read by them.
            macro_rules! loads_then_products {
                ($name:literal, $($load:literal),*) => {{
                    let t = std::time::Instant::now();
                    for i in 0..reps * 6 {
                        let o = p.add((i & 1) * 8 * TILE);
                        $(asm!(concat!("tileloadd ", $load, ", [{0} + {1}*1]"),
                               in(reg) o.add(TILE * ($load.as_bytes()[3] - b'0') as usize),
                               in(reg) 64usize, options(nostack, readonly));)*
                        asm!("tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7",
                             "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                             options(nostack, nomem));
                    }
                    println!("{}: {}", $name, rate(reps, t.elapsed().as_secs_f64()));
                }};
            }
            loads_then_products!("1 load before every 4 products", "tmm4");
            loads_then_products!("2 loads before every 4 products", "tmm4", "tmm5");
            loads_then_products!(
                "4 loads before every 4 products",
                "tmm4",
                "tmm5",
                "tmm6",
                "tmm7"
            );
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for (bp, a_pieces) in [(0usize, 3usize), (1, 2), (2, 1)] {
                    asm!("tileloadd tmm6, [{0} + {1}*1]", "tileloadd tmm7, [{2} + {1}*1]",
                         in(reg) p.add((6 + 2 * bp) * TILE), in(reg) 64usize,
                         in(reg) p.add((7 + 2 * bp) * TILE), options(nostack, readonly));
                    for ap in 0..a_pieces {
                        asm!("tileloadd tmm4, [{0} + {2}*1]", "tileloadd tmm5, [{1} + {2}*1]",
                             "tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7",
                             "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                             in(reg) p.add(2 * ap * TILE), in(reg) p.add((2 * ap + 1) * TILE),
                             in(reg) 64usize, options(nostack, readonly));
                    }
                }
            }
            println!(
                "grouped by B piece: {}",
                rate(reps, t.elapsed().as_secs_f64())
            );
            // `chunk`: four K blocks per call (C loaded and stored once a call, as in a
            // product), over the same tiles: two distinct K blocks, each read twice.
            let ops = Operands {
                pa: p,
                mp: 2,
                pb: p.add(12 * TILE),
                np: 2,
                kb: 2,
            };
            let t = std::time::Instant::now();
            for _ in 0..reps / 4 {
                let c = (c.as_mut_ptr(), 32);
                chunk(&ops, 0, 0, 0, 2, &TRAIL_F32, Some(c), c);
                chunk(&ops, 0, 0, 0, 2, &TRAIL_F32, Some(c), c);
            }
            println!(
                "chunk (the trail): {}",
                rate(reps / 4 * 4, t.elapsed().as_secs_f64())
            );
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}
