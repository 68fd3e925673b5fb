//! Int8 dots in the span layout (`span_acts.rs`): the inner loop of wide products
//! (prefill, `M > 8`) with block-quantized weights, every format, with AVX-512 VNNI.
//!
//! The weight rows of a block of columns are unpacked once (`unpack.rs`: bytes `u`, and per
//! group of 16 a scale `a` and a bias `b`) into a panel in the span layout, and so are the
//! quantized activations. A span then contributes, per activation row,
//! `Σ_g a_g · dg_g · P_g + Σ_g b_g · sg_g` with `P_g` the integer dot of group `g`, which
//! four `vpdpbusd` leave in lane `g` of one vector: per 16 groups and row one conversion,
//! one multiply (`a · dg`) and two fused multiply-adds, against a conversion, a permute and
//! a multiply-add per four groups when the groups lie along the lanes (`legacy_dot.rs`,
//! `kquant_dot.rs`). The panel serves every chunk of up to [`MAX_R`] activation rows, so
//! its unpacking is shared by all `M` rows; a tail span serves `p` rows at once, each row
//! taking its own lanes; the rows' sums come out of one tree of permutes.
//!
//! One thread, N = 1536, M = 128, ns per 64 weights and activation row (`timing::int8_rows`
//! in `int8_matmul.rs`): the kernel alone, Q4_K 1.47 with the register-unpacking dots
//! (four rows a call, groups along the lanes) -> 0.64; the whole product (quantization,
//! panel fill, stores) Q4_K 0.84, Q4_0 (K = 576, a shared tail) 1.07, against 1.85 for
//! `gemm` on f32 activations.
//!
//! Signed quants (Q8_0) are stored offset by 128 (see `span_acts::finish_row`).

use super::int8::DotPath;
use super::span_acts::{SpanRow, SpanRows, SPAN};

/// Most activation rows one call dots with a weight row (a multiple of every tail pack's
/// row count).
pub(crate) const MAX_R: usize = 16;

/// Whether wide products take this kernel on `path`: with AVX-512 VNNI only. On AVX2 this
/// layout is slower than `gemm` on f32 activations (`vpmaddubsw` + `vpmaddwd`, one thread,
/// M = 128, ns per 64 weights and row: Q4_0 2.6 vs 2.1 for f32, Q8_0 3.4 vs 1.8, Q4_K 2.1
/// vs 1.8: the per-group scaling is paid per weight row); AVX2 takes the register tiles of
/// `tile_avx2.rs` instead, one lane a weight row.
pub(crate) fn wide_int8(path: DotPath) -> bool {
    path == DotPath::Vnni512
}

/// `out[r] = Σ w·x_r` of one weight row of the panel and each of the `x.rows ≤ MAX_R`
/// activation rows `x_r` (AVX-512 VNNI).
pub(crate) fn dot_rows(path: DotPath, w: SpanRow, x: SpanRows, out: &mut [f32]) {
    let n = x.l.spans();
    assert!(
        x.is_valid()
            && w.u.len() == n * SPAN
            && w.a.len() == n * 16
            && w.b.len() == n * 16
            && out.len() == x.rows
            && x.rows <= MAX_R,
        "span dot: {} weights against {} rows of {} activations",
        w.u.len(),
        x.rows,
        x.l.k
    );
    macro_rules! go {
        ($f:ident) => {
            match x.rows {
                1 => out.copy_from_slice(&$f::<1>(w, x)),
                2 => out.copy_from_slice(&$f::<2>(w, x)),
                3 => out.copy_from_slice(&$f::<3>(w, x)),
                4 => out.copy_from_slice(&$f::<4>(w, x)),
                5 => out.copy_from_slice(&$f::<5>(w, x)),
                6 => out.copy_from_slice(&$f::<6>(w, x)),
                7 => out.copy_from_slice(&$f::<7>(w, x)),
                8 => out.copy_from_slice(&$f::<8>(w, x)),
                9 => out.copy_from_slice(&$f::<9>(w, x)),
                10 => out.copy_from_slice(&$f::<10>(w, x)),
                11 => out.copy_from_slice(&$f::<11>(w, x)),
                12 => out.copy_from_slice(&$f::<12>(w, x)),
                13 => out.copy_from_slice(&$f::<13>(w, x)),
                14 => out.copy_from_slice(&$f::<14>(w, x)),
                15 => out.copy_from_slice(&$f::<15>(w, x)),
                _ => out.copy_from_slice(&$f::<16>(w, x)),
            }
        };
    }
    match path {
        // SAFETY: the path's features were detected at run time; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        DotPath::Vnni512 => unsafe { go!(spans_vnni) },
        _ => unreachable!("span dot without VNNI"),
    }
}

/// One span of weights (`wv`: four vectors, `a`, `b`: 16 groups) against one of
/// activations (`q`, `dg`, `sg`): `P · (a · dg) + b · sg` per group (lane).
///
/// # Safety
/// AVX-512 VNNI; the pointers address a whole span.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn span_vnni(
    wv: &[std::arch::x86_64::__m512i; 4],
    (a, b): (std::arch::x86_64::__m512, std::arch::x86_64::__m512),
    (q, dg, sg): (*const i8, *const f32, *const f32),
    acc: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let load = |t: usize| _mm512_loadu_si512(q.add(64 * t) as *const _);
    let zero = _mm512_setzero_si512();
    let p01 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, wv[0], load(0)), wv[1], load(1));
    let p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p01, wv[2], load(2)), wv[3], load(3));
    let c = _mm512_mul_ps(a, _mm512_loadu_ps(dg));
    // The bias first: both multiply-adds then accumulate in place.
    let acc = _mm512_fmadd_ps(b, _mm512_loadu_ps(sg), acc);
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), c, acc)
}

/// AVX-512 VNNI: per span the four weight vectors loaded once for all `R` rows; the tail
/// span once per pack of `p` rows, each row adding its own lanes.
///
/// # Safety
/// The CPU has the enabled features; `w` and `x` are consistent (checked by
/// [`dot_rows`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
unsafe fn spans_vnni<const R: usize>(w: SpanRow, x: SpanRows) -> [f32; R] {
    use std::arch::x86_64::*;
    let l = x.l;
    let weights = |s: usize| {
        let wp = w.u.as_ptr().add(SPAN * s);
        let wv: [__m512i; 4] =
            std::array::from_fn(|t| _mm512_loadu_si512(wp.add(64 * t) as *const _));
        let ab = (
            _mm512_loadu_ps(w.a.as_ptr().add(16 * s)),
            _mm512_loadu_ps(w.b.as_ptr().add(16 * s)),
        );
        (wv, ab)
    };
    let mut acc = [_mm512_setzero_ps(); R];
    for s in 0..l.full {
        let (wv, ab) = weights(s);
        for_rows!(R, |r| {
            acc[r] = span_vnni(&wv, ab, x.span(r, s), acc[r]);
        });
    }
    if l.gt > 0 {
        let (wv, ab) = weights(l.full);
        let mut tails = [_mm512_setzero_ps(); R];
        for (t, v) in tails.iter_mut().enumerate().take(R.div_ceil(l.p)) {
            *v = span_vnni(&wv, ab, x.pack(t), *v);
        }
        let lanes = (1u32 << l.gt) - 1;
        for_rows!(R, |r| {
            let m = (lanes << (r % l.p * l.gt)) as __mmask16;
            acc[r] = _mm512_mask_add_ps(acc[r], m, acc[r], tails[r / l.p]);
        });
    }
    let lo = row_sums(&acc[..R.min(8)]);
    let hi = if R > 8 { row_sums(&acc[8..]) } else { [0.0; 8] };
    std::array::from_fn(|r| if r < 8 { lo[r] } else { hi[r - 8] })
}

/// The lane sums of up to eight vectors (the rest taken as zero), by a tree of lane
/// permutes and adds (24 instructions for eight rows instead of eight reductions of eight).
///
/// # Safety
/// AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn row_sums(acc: &[std::arch::x86_64::__m512]) -> [f32; 8] {
    use std::arch::x86_64::*;
    let v: [__m512; 8] =
        std::array::from_fn(|r| acc.get(r).copied().unwrap_or(_mm512_setzero_ps()));
    // Output lane `i` (half `i / 8` from `a` then `b`, block `j / w` of `w` lanes, lane `k`)
    // takes lane `2w · block + from + k` of its source: `from = 0` and `from = w` are the two
    // halves of each `2w` lanes, whose sum halves the partial sums.
    let idx = |w: i32, from: i32| {
        let l: [i32; 16] = std::array::from_fn(|i| {
            let (half, j) = (i as i32 / 8, i as i32 % 8);
            16 * half + 2 * w * (j / w) + from + j % w
        });
        _mm512_loadu_si512(l.as_ptr() as *const _)
    };
    let fold = |w: i32, a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_permutex2var_ps(a, idx(w, 0), b),
            _mm512_permutex2var_ps(a, idx(w, w), b),
        )
    };
    // Width 8: lanes 0-7 partial sums of a, 8-15 of b; then width 4, 2, 1.
    let s01 = fold(8, v[0], v[1]);
    let s23 = fold(8, v[2], v[3]);
    let s45 = fold(8, v[4], v[5]);
    let s67 = fold(8, v[6], v[7]);
    let s0123 = fold(4, s01, s23);
    let s4567 = fold(4, s45, s67);
    let s = fold(2, s0123, s4567);
    let s = fold(1, s, s);
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm512_castps512_ps256(s));
    out
}
