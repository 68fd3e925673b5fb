//! The x86-64 register-tile microkernels (AVX-512 and AVX2) of the f32 GEMM.

use std::arch::x86_64::*;

/// One register-tile microkernel per ISA: an `MR × 2·LANES` tile of C kept in `2·MR`
/// vector accumulators; each k step loads two B vectors and broadcasts each of the `MR`
/// A values into two FMAs. Then the tile is stored (or added to C).
macro_rules! microkernel {
    ($name:ident, $feature:literal, $mr:literal, $lanes:literal,
     $zero:ident, $load:ident, $store:ident, $splat:ident, $fma:ident, $add:ident) => {
        #[target_feature(enable = $feature)]
        pub unsafe fn $name(
            kc: usize,
            ap: *const f32,
            bp: *const f32,
            c: *mut f32,
            c_rs: usize,
            overwrite: bool,
        ) {
            let mut acc = [$zero(); 2 * $mr];
            let mut a = ap;
            let mut b = bp;
            for _ in 0..kc {
                let b0 = $load(b);
                let b1 = $load(b.add($lanes));
                for i in 0..$mr {
                    let ai = $splat(*a.add(i));
                    acc[2 * i] = $fma(ai, b0, acc[2 * i]);
                    acc[2 * i + 1] = $fma(ai, b1, acc[2 * i + 1]);
                }
                a = a.add($mr);
                b = b.add(2 * $lanes);
            }
            for i in 0..$mr {
                let d = c.add(i * c_rs);
                let (mut v0, mut v1) = (acc[2 * i], acc[2 * i + 1]);
                if !overwrite {
                    v0 = $add(v0, $load(d));
                    v1 = $add(v1, $load(d.add($lanes)));
                }
                $store(d, v0);
                $store(d.add($lanes), v1);
            }
        }
    };
}

// 12 × 32: 24 accumulators, 2 B vectors and a broadcast in the 32 zmm registers.
microkernel!(
    micro_avx512,
    "avx512f",
    12,
    16,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps
);
/// How many K steps ahead a column-major A read in place is prefetched: its K steps
/// are rows of the operand, a kilobyte or more apart, each in its own cache line and
/// often its own page, which the hardware prefetchers do not follow (a training step's
/// weight gradients `dYᵀ·X`, `dY` not in cache: 10–20% faster).
const PF: usize = 32;
/// A tile of the 12 × 32 AVX-512 kernel cut to its first `R` rows and `cols` (≤ 32)
/// columns, computed and stored directly (masked), with one B vector when `W = 1`
/// (`cols ≤ 16`). A comes from a packed panel (`PACKED`: `A[i][k]` at `a + 12·k + i`)
/// or is read in place, row-major (`A[i][k]` at `a + i·a_rs + k`: products small
/// enough that packing A costs as much as using it). Each element is the same FMA
/// sequence as in [`micro_avx512`], so results do not depend on where tiles fall or
/// whether A was packed. (An edge tile used to be computed whole into a scratch tile
/// and copied out: a 16-wide product, attention's `P·V` with 16-wide heads, did twice
/// the work.)
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn micro_avx512_cut<const R: usize, const W: usize, const L: u8>(
    kc: usize,
    a: *const f32,
    (a_rs, a_ks): (usize, usize),
    bp: *const f32,
    c: *mut f32,
    c_rs: usize,
    overwrite: bool,
    cols: usize,
) {
    // A's layout `L` (constant strides where it has them): 0 a packed panel, 1 rows
    // read in place (K stride 1), 2 columns read in place (row stride 1).
    let (a_row, a_step) = match L {
        0 => (1, 12),
        1 => (a_rs, 1),
        _ => (1, a_ks),
    };
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    let mut a = a;
    let mut b = bp;
    for _ in 0..kc {
        if L == 2 {
            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(PF * a_step) as *const i8);
        }
        let bv: [__m512; W] = std::array::from_fn(|w| _mm512_loadu_ps(b.add(16 * w)));
        for (i, row) in acc.iter_mut().enumerate() {
            let ai = _mm512_set1_ps(*a.add(i * a_row));
            for (x, &bw) in row.iter_mut().zip(&bv) {
                *x = _mm512_fmadd_ps(ai, bw, *x);
            }
        }
        a = a.add(a_step);
        b = b.add(32);
    }
    let mask = |c: usize| -> __mmask16 {
        if c >= 16 {
            0xFFFF
        } else {
            (1u16 << c) - 1
        }
    };
    let masks = [mask(cols), mask(cols.saturating_sub(16))];
    for (i, row) in acc.iter().enumerate() {
        let d = c.add(i * c_rs);
        for (w, &x) in row.iter().enumerate() {
            let m = masks[w];
            let v = if overwrite {
                x
            } else {
                _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, d.add(16 * w)))
            };
            _mm512_mask_storeu_ps(d.add(16 * w), m, v);
        }
    }
}

/// [`micro_avx512_cut`] for `rows` (1 to 12) rows; `a_strides` are A's row and K
/// strides when A is read in place (row-major `(rs, 1)`, column-major `(1, cs)`;
/// `None`: a packed panel).
///
/// # Safety
/// As the kernel: AVX-512 present, A (panel or rows) and the packed B panel hold `kc`
/// steps, and C's first `rows` rows × `cols` columns are writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cut_avx512(
    kc: usize,
    a: *const f32,
    a_strides: Option<(usize, usize)>,
    bp: *const f32,
    c: *mut f32,
    c_rs: usize,
    overwrite: bool,
    rows: usize,
    cols: usize,
) {
    macro_rules! by_rows {
        ($($r:literal),*) => {
            match (rows, cols <= 16, a_strides) {
                $(
                    ($r, true, None) => micro_avx512_cut::<$r, 1, 0>(kc, a, (0, 0), bp, c, c_rs, overwrite, cols),
                    ($r, false, None) => micro_avx512_cut::<$r, 2, 0>(kc, a, (0, 0), bp, c, c_rs, overwrite, cols),
                    ($r, true, Some((rs, 1))) => micro_avx512_cut::<$r, 1, 1>(kc, a, (rs, 1), bp, c, c_rs, overwrite, cols),
                    ($r, false, Some((rs, 1))) => micro_avx512_cut::<$r, 2, 1>(kc, a, (rs, 1), bp, c, c_rs, overwrite, cols),
                    ($r, true, Some((1, ks))) => micro_avx512_cut::<$r, 1, 2>(kc, a, (1, ks), bp, c, c_rs, overwrite, cols),
                    ($r, false, Some((1, ks))) => micro_avx512_cut::<$r, 2, 2>(kc, a, (1, ks), bp, c, c_rs, overwrite, cols),
                )*
                _ => unreachable!("a tile of {rows} rows, A strides {a_strides:?}"),
            }
        };
    }
    by_rows!(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
}

// 6 × 16: 12 accumulators, 2 B vectors and a broadcast in the 16 ymm registers.
microkernel!(
    micro_avx2,
    "avx2,fma",
    6,
    8,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps
);
