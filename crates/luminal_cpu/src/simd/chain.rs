//! Chains of elementwise ops over one running value (one pass; AVX2 register tiles).

use super::*;

/// One op of a fused chain, applied to the chain's running value `acc` (see [`chain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainOp {
    /// `acc op b` (`swap`: `b op acc`).
    Binary {
        op: BinaryOp,
        swap: bool,
    },
    /// `max(acc, b)` ([`max_one`]; the order of the operands is immaterial).
    Max,
    Unary(UnaryOp),
    /// A recognised function of the running value ([`FnOp`]).
    Fn(FnOp),
    /// `acc != 0` as 0/1.
    NotZero,
    /// `acc` rounded to a half type.
    Round(HalfKind),
}

/// The second operand of a [`ChainOp`], if it has one.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    None,
    Scalar(f32),
    /// Read at the same positions as the chain's first operand.
    Vector(&'a [f32]),
}

/// `out = ops(a)`: starting from `a`, each op of `ops` is applied to the running value in
/// turn, and every op rounds as the unfused op would (results are identical). On x86 with
/// AVX2 the running value lives in registers, 64 elements at a time ([`chain_tiles_avx2`]),
/// so a chain of any length reads each input once and writes `out` once; elsewhere it is
/// accumulated in `out` (cache-resident blocks), one pass per op or common pair of ops.
/// `stream` (AVX2 tiles only): write `out` with non-temporal stores (the caller fences). At
/// most 16 ops.
#[inline(always)]
pub fn chain<const F: bool>(
    a: &[f32],
    ops: &[(ChainOp, Operand<'_>)],
    out: &mut [f32],
    stream: bool,
) {
    chain_with::<F>(a, ops, out, stream, tile_level())
}

/// Which tile loop [`chain`] runs: 2 for AVX-512 (the ISA level allows it), 1 for AVX2
/// (the CPU has AVX2, FMA and F16C), 0 for the portable loop.
#[inline(always)]
pub(crate) fn tile_level() -> u8 {
    if !crate::simd::half::fast() {
        0
    } else if isa() == Isa::Avx512 {
        2
    } else {
        1
    }
}

/// [`chain`], with the AVX-512 tile loop (`level` 2: the CPU must have AVX-512F), the AVX2
/// one (`level` 1: AVX2, FMA and F16C) or the portable one (0).
#[inline(always)]
pub(crate) fn chain_with<const F: bool>(
    a: &[f32],
    ops: &[(ChainOp, Operand<'_>)],
    out: &mut [f32],
    stream: bool,
    level: u8,
) {
    let n = out.len();
    let mut i = 0;
    let avx2 = level >= 1;
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        debug_assert!(
            detected_isa() >= Isa::Avx2 && std::arch::is_x86_feature_detected!("f16c"),
            "AVX2 tiles on a CPU without AVX2 / F16C"
        );
        debug_assert!(
            level < 2 || detected_isa() >= Isa::Avx512,
            "AVX-512 tiles on a CPU without it"
        );
        // Streamed tiles start at a vector boundary (64 bytes for AVX-512; heap buffers
        // already have the 16 of AVX2).
        let head = if stream {
            out.as_ptr()
                .align_offset(if level >= 2 { 64 } else { 16 })
                .min(n)
        } else {
            0
        };
        chain_in_out::<F>(a, ops, 0, &mut out[..head]);
        let (tiles, n_tiles) = tile_ops(ops);
        let tiles = &tiles[..n_tiles];
        // Every vector operand covers the chain's elements (checked once, not per tile).
        assert!(a.len() >= n);
        for op in tiles {
            match *op {
                TileOp::AddV(v) | TileOp::MulV(v) | TileOp::MulSAddV(_, v) => {
                    assert!(v.len() >= n)
                }
                TileOp::MulVAddV(u, v) => assert!(u.len() >= n && v.len() >= n),
                _ => {}
            }
        }
        i = head;
        if level >= 2 {
            // SAFETY: level 2 is passed only when the ISA level (never above the detected
            // one) is AVX-512; the operands were checked above.
            i = unsafe { chain_tiles_avx512::<F>(a, tiles, i, out, stream) };
        }
        // The whole chain on AVX2, or what is left of a 128-element AVX-512 tile (a decode
        // step's 576-wide rows: 4 + 1 tiles instead of a 64-element portable tail).
        // SAFETY: the caller passes level 1 or 2 only when AVX2, FMA and F16C were
        // detected on this CPU (`tile_level`; the tests check the same); the operands
        // were checked above.
        i = unsafe { chain_tiles_avx2::<F>(a, tiles, i, out, stream) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx2;
    assert!(avx2 || !stream, "streamed chains need the AVX2 tiles");
    chain_in_out::<F>(a, ops, i, &mut out[i..]);
}

/// Elements `i .. i + out.len()` of a chain, accumulated in `out`: one pass over it per op
/// (or common pair of ops).
#[inline(always)]
pub(crate) fn chain_in_out<const F: bool>(
    a: &[f32],
    ops: &[(ChainOp, Operand<'_>)],
    i: usize,
    out: &mut [f32],
) {
    let t = out.len();
    if t == 0 {
        return;
    }
    out.copy_from_slice(&a[i..i + t]);
    let (tile_ops, n_tile_ops) = tile_ops(ops);
    // The merged pairs in one pass; every other op through `chain_in_place`.
    for &op in &tile_ops[..n_tile_ops] {
        match op {
            TileOp::MulSAddS(m, c) => {
                for p in out.iter_mut() {
                    *p = *p * m + c;
                }
            }
            TileOp::MulSAddV(m, v) => {
                for (p, &y) in out.iter_mut().zip(&v[i..i + t]) {
                    *p = *p * m + y;
                }
            }
            TileOp::MulVAddV(u, v) => {
                let (u, v) = (&u[i..i + t], &v[i..i + t]);
                for ((p, &x), &y) in out.iter_mut().zip(u).zip(v) {
                    *p = *p * x + y;
                }
            }
            other => {
                let (op, b) = other.chain_op();
                chain_in_place::<F>(op, b, i, out);
            }
        }
    }
}

/// One op of a chain in place: `x = op(x, b)` where `x` holds the running value of elements
/// `i .. i + x.len()`.
#[inline(always)]
pub(crate) fn chain_in_place<const F: bool>(op: ChainOp, b: Operand<'_>, i: usize, x: &mut [f32]) {
    let t = x.len();
    macro_rules! with_v {
        ($v:ident, |$p:ident, $q:ident| $e:expr) => {{
            for ($p, &$q) in x.iter_mut().zip(&$v[i..i + t]) {
                *$p = $e;
            }
        }};
    }
    macro_rules! with_s {
        (|$p:ident| $e:expr) => {{
            for $p in x.iter_mut() {
                *$p = $e;
            }
        }};
    }
    // Add and Mul commute exactly, so `swap` does not matter for them; nor does the order of
    // max's operands.
    match (op, b) {
        (ChainOp::Binary { op, swap }, Operand::Vector(v)) => match (op, swap) {
            (BinaryOp::Add, _) => with_v!(v, |p, q| *p + q),
            (BinaryOp::Mul, _) => with_v!(v, |p, q| *p * q),
            (BinaryOp::Mod, false) => with_v!(v, |p, q| *p % q),
            (BinaryOp::Mod, true) => with_v!(v, |p, q| q % *p),
            (BinaryOp::LessThan, false) => with_v!(v, |p, q| (*p < q) as u8 as f32),
            (BinaryOp::LessThan, true) => with_v!(v, |p, q| (q < *p) as u8 as f32),
        },
        (ChainOp::Binary { op, swap }, Operand::Scalar(s)) => match (op, swap) {
            (BinaryOp::Add, _) => with_s!(|p| *p + s),
            (BinaryOp::Mul, _) => with_s!(|p| *p * s),
            (BinaryOp::Mod, false) => with_s!(|p| *p % s),
            (BinaryOp::Mod, true) => with_s!(|p| s % *p),
            (BinaryOp::LessThan, false) => with_s!(|p| (*p < s) as u8 as f32),
            (BinaryOp::LessThan, true) => with_s!(|p| (s < *p) as u8 as f32),
        },
        (ChainOp::Max, Operand::Vector(v)) => with_v!(v, |p, q| max_one(*p, q)),
        (ChainOp::Max, Operand::Scalar(s)) => with_s!(|p| max_one(*p, s)),
        (ChainOp::NotZero, _) => with_s!(|p| (*p != 0.0) as u8 as f32),
        // The slice loops read and write different buffers: a piece at a time via the stack.
        (ChainOp::Unary(_) | ChainOp::Round(_) | ChainOp::Fn(_), _) => {
            let mut tmp = [0f32; 64];
            for piece in x.chunks_mut(64) {
                let tmp = &mut tmp[..piece.len()];
                tmp.copy_from_slice(piece);
                match op {
                    ChainOp::Unary(u) => unary::<F>(u, tmp, piece),
                    ChainOp::Round(kind) => crate::simd::half::round_block(kind, tmp, piece),
                    ChainOp::Fn(f) => fn_slice::<F>(f, tmp, piece),
                    _ => unreachable!(),
                }
            }
        }
        (ChainOp::Binary { .. } | ChainOp::Max, Operand::None) => {
            unreachable!("a binary chain op without its operand")
        }
    }
}

/// A chain op as the tile loops run it: the common ops with their operand unpacked, the rest
/// through the in-place chunk loop.
#[derive(Clone, Copy)]
pub(crate) enum TileOp<'a> {
    AddV(&'a [f32]),
    MulV(&'a [f32]),
    AddS(f32),
    MulS(f32),
    MaxS(f32),
    /// `max_one(acc, v)` elementwise.
    MaxV(&'a [f32]),
    /// `acc < s` as 0/1 (`swap`: `s < acc`).
    LtS(f32, bool),
    /// `acc < v` as 0/1 (`swap`: `v < acc`).
    LtV(&'a [f32], bool),
    /// `acc != 0` as 0/1.
    NotZero,
    RoundF16,
    RoundBF16,
    Exp2,
    Recip,
    Sqrt,
    Other(ChainOp, Operand<'a>),
    // Common pairs in one dispatch (each op still rounds): `acc · m + c`, `acc · m + v`,
    // `acc · u + v`.
    MulSAddS(f32, f32),
    MulSAddV(f32, &'a [f32]),
    MulVAddV(&'a [f32], &'a [f32]),
}

/// The tile ops of `ops` (at most 16), with common pairs of consecutive ops merged into one
/// (fewer dispatches per tile); returns them and their count.
pub(crate) fn tile_ops<'a>(ops: &[(ChainOp, Operand<'a>)]) -> ([TileOp<'a>; 16], usize) {
    let mut t = [TileOp::AddS(0.0); 16];
    for (t, &(op, b)) in t.iter_mut().zip(ops) {
        // Add and Mul commute exactly, so `swap` does not matter for them; nor does the
        // order of max's operands.
        let (add, mul) = (
            |op| {
                matches!(
                    op,
                    ChainOp::Binary {
                        op: BinaryOp::Add,
                        ..
                    }
                )
            },
            |op| {
                matches!(
                    op,
                    ChainOp::Binary {
                        op: BinaryOp::Mul,
                        ..
                    }
                )
            },
        );
        *t = match (op, b) {
            (op, Operand::Vector(v)) if add(op) => TileOp::AddV(v),
            (op, Operand::Vector(v)) if mul(op) => TileOp::MulV(v),
            (op, Operand::Scalar(s)) if add(op) => TileOp::AddS(s),
            (op, Operand::Scalar(s)) if mul(op) => TileOp::MulS(s),
            (ChainOp::Max, Operand::Scalar(s)) => TileOp::MaxS(s),
            (ChainOp::Max, Operand::Vector(v)) => TileOp::MaxV(v),
            (
                ChainOp::Binary {
                    op: BinaryOp::LessThan,
                    swap,
                },
                Operand::Scalar(s),
            ) => TileOp::LtS(s, swap),
            (
                ChainOp::Binary {
                    op: BinaryOp::LessThan,
                    swap,
                },
                Operand::Vector(v),
            ) => TileOp::LtV(v, swap),
            (ChainOp::NotZero, _) => TileOp::NotZero,
            (ChainOp::Round(HalfKind::F16), _) => TileOp::RoundF16,
            (ChainOp::Round(HalfKind::BF16), _) => TileOp::RoundBF16,
            (ChainOp::Unary(UnaryOp::Exp2), _) => TileOp::Exp2,
            (ChainOp::Unary(UnaryOp::Recip), _) => TileOp::Recip,
            (ChainOp::Unary(UnaryOp::Sqrt), _) => TileOp::Sqrt,
            _ => TileOp::Other(op, b),
        };
    }
    let (mut n, mut i) = (0, 0);
    while i < ops.len() {
        let merged = match (t[i], t.get(i + 1).copied().filter(|_| i + 1 < ops.len())) {
            (TileOp::MulS(m), Some(TileOp::AddS(c))) => Some(TileOp::MulSAddS(m, c)),
            (TileOp::MulS(m), Some(TileOp::AddV(v))) => Some(TileOp::MulSAddV(m, v)),
            (TileOp::MulV(u), Some(TileOp::AddV(v))) => Some(TileOp::MulVAddV(u, v)),
            _ => None,
        };
        t[n] = merged.unwrap_or(t[i]);
        i += if merged.is_some() { 2 } else { 1 };
        n += 1;
    }
    (t, n)
}

impl<'a> TileOp<'a> {
    /// The chain op (and operand) of a single tile op (not of the merged pairs).
    fn chain_op(self) -> (ChainOp, Operand<'a>) {
        let unary = |u| (ChainOp::Unary(u), Operand::None);
        let bin = |op| ChainOp::Binary { op, swap: false };
        match self {
            TileOp::AddV(v) => (bin(BinaryOp::Add), Operand::Vector(v)),
            TileOp::MulV(v) => (bin(BinaryOp::Mul), Operand::Vector(v)),
            TileOp::AddS(s) => (bin(BinaryOp::Add), Operand::Scalar(s)),
            TileOp::MulS(s) => (bin(BinaryOp::Mul), Operand::Scalar(s)),
            TileOp::MaxS(s) => (ChainOp::Max, Operand::Scalar(s)),
            TileOp::MaxV(v) => (ChainOp::Max, Operand::Vector(v)),
            TileOp::LtS(s, swap) => (
                ChainOp::Binary {
                    op: BinaryOp::LessThan,
                    swap,
                },
                Operand::Scalar(s),
            ),
            TileOp::LtV(v, swap) => (
                ChainOp::Binary {
                    op: BinaryOp::LessThan,
                    swap,
                },
                Operand::Vector(v),
            ),
            TileOp::NotZero => (ChainOp::NotZero, Operand::None),
            TileOp::Other(op, b) => (op, b),
            TileOp::RoundF16 => (ChainOp::Round(HalfKind::F16), Operand::None),
            TileOp::RoundBF16 => (ChainOp::Round(HalfKind::BF16), Operand::None),
            TileOp::Exp2 => unary(UnaryOp::Exp2),
            TileOp::Recip => unary(UnaryOp::Recip),
            TileOp::Sqrt => unary(UnaryOp::Sqrt),
            TileOp::MulSAddS(..) | TileOp::MulSAddV(..) | TileOp::MulVAddV(..) => {
                unreachable!("a merged pair")
            }
        }
    }
}

/// [`exp2`] of eight lanes, operation for operation (the same results, bit for bit).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp2_avx2<const F: bool>(
    x: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let fma = |a, b, c| {
        if F {
            _mm256_fmadd_ps(a, b, c)
        } else {
            _mm256_add_ps(_mm256_mul_ps(a, b), c)
        }
    };
    // Lanes below -150 compute 2^0 and are zeroed at the end, as the scalar code does.
    let zero = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-150.0));
    let x = _mm256_andnot_ps(zero, x);
    // `max(c, x)` / `min(c, x)` return `x` when it is NaN, as the scalar clamps do.
    let x = _mm256_max_ps(_mm256_set1_ps(-151.0), x);
    let x = _mm256_min_ps(_mm256_set1_ps(129.0), x);
    let magic = _mm256_set1_ps(ROUND_MAGIC);
    let t = _mm256_add_ps(x, magic);
    let n = _mm256_sub_ps(t, magic);
    let r = _mm256_sub_ps(x, n);
    let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B40_0000));
    let mut p = _mm256_set1_ps(EXP2_POLY[0]);
    for &c in &EXP2_POLY[1..] {
        p = fma(p, r, _mm256_set1_ps(c));
    }
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    _mm256_andnot_ps(zero, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2))
}

/// [`exp2_softmax`] of eight lanes with fused multiply-adds, operation for operation (the
/// same results, bit for bit).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp2_softmax_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // max / min return their second operand when one is NaN: NaN passes.
    let x = _mm256_max_ps(_mm256_set1_ps(-127.0), x);
    let x = _mm256_min_ps(_mm256_set1_ps(126.0), x);
    let magic = _mm256_set1_ps(ROUND_MAGIC);
    let t = _mm256_add_ps(x, magic);
    let r = _mm256_sub_ps(x, _mm256_sub_ps(t, magic));
    let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B40_0000));
    let mut p = _mm256_set1_ps(EXP2_POLY[0]);
    for &c in &EXP2_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let e = _mm256_add_epi32(ni, _mm256_set1_epi32(127));
    _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
}

/// [`exp2_softmax`] of sixteen lanes with fused multiply-adds, operation for operation as
/// [`exp2_softmax_avx2`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp2_softmax_avx512(
    x: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let x = _mm512_max_ps(_mm512_set1_ps(-127.0), x);
    let x = _mm512_min_ps(_mm512_set1_ps(126.0), x);
    let magic = _mm512_set1_ps(ROUND_MAGIC);
    let t = _mm512_add_ps(x, magic);
    let r = _mm512_sub_ps(x, _mm512_sub_ps(t, magic));
    let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B40_0000));
    let mut p = _mm512_set1_ps(EXP2_POLY[0]);
    for &c in &EXP2_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let e = _mm512_add_epi32(ni, _mm512_set1_epi32(127));
    _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e)))
}

/// Elements of a chain's running value held at once by [`chain_tiles_avx2`]: eight of the
/// sixteen AVX registers (the per-op dispatch is paid once per tile).
#[cfg(target_arch = "x86_64")]
pub(crate) const AVX_TILE: usize = 64;

/// The whole tiles of [`chain`] from element `i` on, with the running value in AVX
/// registers (the compiler's vectorisation of the portable loop keeps it in memory).
/// Returns where the tiles ended.
///
/// # Safety
/// AVX2, FMA and F16C present; `a` and every vector operand of `tile_ops` hold at least
/// `out.len()` elements (`chain_with` checks them once).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn chain_tiles_avx2<const F: bool>(
    a: &[f32],
    tile_ops: &[TileOp<'_>],
    mut i: usize,
    out: &mut [f32],
    stream: bool,
) -> usize {
    use std::arch::x86_64::*;
    let n = out.len();
    while i + AVX_TILE <= n {
        // SAFETY (all loads and stores below): `i + AVX_TILE <= n` and every slice read holds
        // at least `n` elements (the safety contract); stores go to `out[i .. i + AVX_TILE]`, which
        // is 16-byte aligned when streaming (`chain`'s head).
        let ld = |p: &[f32], k: usize| unsafe { _mm256_loadu_ps(p.as_ptr().add(i + 8 * k)) };
        let mut acc: [__m256; AVX_TILE / 8] = std::array::from_fn(|k| ld(a, k));
        for &op in tile_ops {
            match op {
                TileOp::AddV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_add_ps(*x, ld(v, k));
                    }
                }
                TileOp::MulV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_mul_ps(*x, ld(v, k));
                    }
                }
                TileOp::AddS(s) => {
                    let s = _mm256_set1_ps(s);
                    for x in acc.iter_mut() {
                        *x = _mm256_add_ps(*x, s);
                    }
                }
                TileOp::MulS(s) => {
                    let s = _mm256_set1_ps(s);
                    for x in acc.iter_mut() {
                        *x = _mm256_mul_ps(*x, s);
                    }
                }
                TileOp::MaxS(s) => {
                    // `max_one`: x where x > s or x is NaN, else s.
                    let s = _mm256_set1_ps(s);
                    for x in acc.iter_mut() {
                        let keep = _mm256_or_ps(
                            _mm256_cmp_ps::<_CMP_GT_OQ>(*x, s),
                            _mm256_cmp_ps::<_CMP_UNORD_Q>(*x, *x),
                        );
                        *x = _mm256_blendv_ps(s, *x, keep);
                    }
                }
                TileOp::MaxV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        let s = ld(v, k);
                        let keep = _mm256_or_ps(
                            _mm256_cmp_ps::<_CMP_GT_OQ>(*x, s),
                            _mm256_cmp_ps::<_CMP_UNORD_Q>(*x, *x),
                        );
                        *x = _mm256_blendv_ps(s, *x, keep);
                    }
                }
                // Comparisons give 1.0 (the all-ones mask and 1.0's bits) or 0.0; NaN
                // compares false, as `<` does.
                TileOp::LtS(s, swap) => {
                    let (s, one) = (_mm256_set1_ps(s), _mm256_set1_ps(1.0));
                    for x in acc.iter_mut() {
                        let m = if swap {
                            _mm256_cmp_ps::<_CMP_LT_OQ>(s, *x)
                        } else {
                            _mm256_cmp_ps::<_CMP_LT_OQ>(*x, s)
                        };
                        *x = _mm256_and_ps(m, one);
                    }
                }
                TileOp::LtV(v, swap) => {
                    let one = _mm256_set1_ps(1.0);
                    for (k, x) in acc.iter_mut().enumerate() {
                        let s = ld(v, k);
                        let m = if swap {
                            _mm256_cmp_ps::<_CMP_LT_OQ>(s, *x)
                        } else {
                            _mm256_cmp_ps::<_CMP_LT_OQ>(*x, s)
                        };
                        *x = _mm256_and_ps(m, one);
                    }
                }
                TileOp::NotZero => {
                    // x != 0 (unordered: NaN is not zero, as `!=` says).
                    let (zero, one) = (_mm256_setzero_ps(), _mm256_set1_ps(1.0));
                    for x in acc.iter_mut() {
                        *x = _mm256_and_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(*x, zero), one);
                    }
                }
                // Separate mul and add instructions, never an FMA: each op rounds.
                TileOp::MulSAddS(m, c) => {
                    let (m, c) = (_mm256_set1_ps(m), _mm256_set1_ps(c));
                    for x in acc.iter_mut() {
                        *x = _mm256_add_ps(_mm256_mul_ps(*x, m), c);
                    }
                }
                TileOp::MulSAddV(m, v) => {
                    let m = _mm256_set1_ps(m);
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_add_ps(_mm256_mul_ps(*x, m), ld(v, k));
                    }
                }
                TileOp::MulVAddV(u, v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_add_ps(_mm256_mul_ps(*x, ld(u, k)), ld(v, k));
                    }
                }
                TileOp::Exp2 => {
                    for x in acc.iter_mut() {
                        *x = exp2_avx2::<F>(*x);
                    }
                }
                TileOp::Recip => {
                    let one = _mm256_set1_ps(1.0);
                    for x in acc.iter_mut() {
                        *x = _mm256_div_ps(one, *x);
                    }
                }
                TileOp::Sqrt => {
                    for x in acc.iter_mut() {
                        *x = _mm256_sqrt_ps(*x);
                    }
                }
                TileOp::RoundF16 => {
                    for x in acc.iter_mut() {
                        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*x);
                        *x = _mm256_cvtph_ps(h);
                    }
                }
                TileOp::RoundBF16 => {
                    // `halfvec::bf16_round`: add 0x7FFF plus the kept lowest bit, clear the
                    // low half; a NaN keeps its upper bits, quieted.
                    let one = _mm256_set1_epi32(1);
                    let bias = _mm256_set1_epi32(0x7FFF);
                    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
                    let quiet = _mm256_set1_epi32(0x0040_0000);
                    for x in acc.iter_mut() {
                        let b = _mm256_castps_si256(*x);
                        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), one);
                        let r = _mm256_add_epi32(b, _mm256_add_epi32(bias, lsb));
                        let r = _mm256_and_si256(r, high);
                        let nan = _mm256_and_si256(_mm256_or_si256(b, quiet), high);
                        let is_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(*x, *x);
                        *x = _mm256_blendv_ps(
                            _mm256_castsi256_ps(r),
                            _mm256_castsi256_ps(nan),
                            is_nan,
                        );
                    }
                }
                TileOp::Other(op, b) => {
                    let mut t = [0f32; AVX_TILE];
                    for (k, x) in acc.iter().enumerate() {
                        _mm256_storeu_ps(t.as_mut_ptr().add(8 * k), *x);
                    }
                    chain_in_place::<F>(op, b, i, &mut t);
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_loadu_ps(t.as_ptr().add(8 * k));
                    }
                }
            }
        }
        let o = out.as_mut_ptr().add(i);
        for (k, x) in acc.iter().enumerate() {
            if stream {
                // 16-byte streams: heap buffers are 16-byte aligned, so the whole block
                // runs as tiles (measured as fast as 32-byte streams).
                _mm_stream_ps(o.add(8 * k), _mm256_castps256_ps128(*x));
                _mm_stream_ps(o.add(8 * k + 4), _mm256_extractf128_ps::<1>(*x));
            } else {
                _mm256_storeu_ps(o.add(8 * k), *x);
            }
        }
        i += AVX_TILE;
    }
    i
}

/// [`exp2`] of sixteen lanes, operation for operation as [`exp2_avx2`] (the same results,
/// bit for bit).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn exp2_avx512<const F: bool>(
    x: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let fma = |a, b, c| {
        if F {
            _mm512_fmadd_ps(a, b, c)
        } else {
            _mm512_add_ps(_mm512_mul_ps(a, b), c)
        }
    };
    // Lanes below -150 compute 2^0 and are zeroed at the end, as the scalar code does.
    let keep = !_mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-150.0));
    let x = _mm512_maskz_mov_ps(keep, x);
    // `max(c, x)` / `min(c, x)` return `x` when it is NaN, as the scalar clamps do.
    let x = _mm512_max_ps(_mm512_set1_ps(-151.0), x);
    let x = _mm512_min_ps(_mm512_set1_ps(129.0), x);
    let magic = _mm512_set1_ps(ROUND_MAGIC);
    let t = _mm512_add_ps(x, magic);
    let n = _mm512_sub_ps(t, magic);
    let r = _mm512_sub_ps(x, n);
    let ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4B40_0000));
    let mut p = _mm512_set1_ps(EXP2_POLY[0]);
    for &c in &EXP2_POLY[1..] {
        p = fma(p, r, _mm512_set1_ps(c));
    }
    let n1 = _mm512_srai_epi32::<1>(ni);
    let n2 = _mm512_sub_epi32(ni, n1);
    let bias = _mm512_set1_epi32(127);
    let s1 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n1, bias)));
    let s2 = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n2, bias)));
    _mm512_maskz_mov_ps(keep, _mm512_mul_ps(_mm512_mul_ps(p, s1), s2))
}

/// Elements of a chain's running value held at once by [`chain_tiles_avx512`]: eight of the
/// thirty-two AVX-512 registers.
#[cfg(target_arch = "x86_64")]
pub(crate) const AVX512_TILE: usize = 128;

/// [`chain_tiles_avx2`] with sixteen-lane registers: twice the elements per op dispatch,
/// half the instructions. Every op is the same IEEE operation per lane, so results are the
/// same bit for bit.
///
/// # Safety
/// AVX-512F present, and the operands as for [`chain_tiles_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn chain_tiles_avx512<const F: bool>(
    a: &[f32],
    tile_ops: &[TileOp<'_>],
    mut i: usize,
    out: &mut [f32],
    stream: bool,
) -> usize {
    use std::arch::x86_64::*;
    const R: usize = AVX512_TILE / 16;
    let n = out.len();
    while i + AVX512_TILE <= n {
        // SAFETY (all loads and stores below): `i + AVX512_TILE <= n` and every slice read
        // holds at least `n` elements (the safety contract); stores go to
        // `out[i .. i + AVX512_TILE]`, which is 64-byte aligned when streaming (`chain_with`'s
        // head).
        let ld = |p: &[f32], k: usize| unsafe { _mm512_loadu_ps(p.as_ptr().add(i + 16 * k)) };
        let mut acc: [__m512; R] = std::array::from_fn(|k| ld(a, k));
        for &op in tile_ops {
            match op {
                TileOp::AddV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm512_add_ps(*x, ld(v, k));
                    }
                }
                TileOp::MulV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm512_mul_ps(*x, ld(v, k));
                    }
                }
                TileOp::AddS(s) => {
                    let s = _mm512_set1_ps(s);
                    for x in acc.iter_mut() {
                        *x = _mm512_add_ps(*x, s);
                    }
                }
                TileOp::MulS(s) => {
                    let s = _mm512_set1_ps(s);
                    for x in acc.iter_mut() {
                        *x = _mm512_mul_ps(*x, s);
                    }
                }
                TileOp::MaxS(s) => {
                    // `max_one`: x where x > s or x is NaN, else s.
                    let s = _mm512_set1_ps(s);
                    for x in acc.iter_mut() {
                        let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(*x, s)
                            | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(*x, *x);
                        *x = _mm512_mask_blend_ps(keep, s, *x);
                    }
                }
                TileOp::MaxV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        let s = ld(v, k);
                        let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(*x, s)
                            | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(*x, *x);
                        *x = _mm512_mask_blend_ps(keep, s, *x);
                    }
                }
                TileOp::LtS(s, swap) => {
                    let (s, one) = (_mm512_set1_ps(s), _mm512_set1_ps(1.0));
                    for x in acc.iter_mut() {
                        let m = if swap {
                            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(s, *x)
                        } else {
                            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(*x, s)
                        };
                        *x = _mm512_maskz_mov_ps(m, one);
                    }
                }
                TileOp::LtV(v, swap) => {
                    let one = _mm512_set1_ps(1.0);
                    for (k, x) in acc.iter_mut().enumerate() {
                        let s = ld(v, k);
                        let m = if swap {
                            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(s, *x)
                        } else {
                            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(*x, s)
                        };
                        *x = _mm512_maskz_mov_ps(m, one);
                    }
                }
                TileOp::NotZero => {
                    let (zero, one) = (_mm512_setzero_ps(), _mm512_set1_ps(1.0));
                    for x in acc.iter_mut() {
                        let m = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(*x, zero);
                        *x = _mm512_maskz_mov_ps(m, one);
                    }
                }
                // Separate mul and add instructions, never an FMA: each op rounds.
                TileOp::MulSAddS(m, c) => {
                    let (m, c) = (_mm512_set1_ps(m), _mm512_set1_ps(c));
                    for x in acc.iter_mut() {
                        *x = _mm512_add_ps(_mm512_mul_ps(*x, m), c);
                    }
                }
                TileOp::MulSAddV(m, v) => {
                    let m = _mm512_set1_ps(m);
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm512_add_ps(_mm512_mul_ps(*x, m), ld(v, k));
                    }
                }
                TileOp::MulVAddV(u, v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm512_add_ps(_mm512_mul_ps(*x, ld(u, k)), ld(v, k));
                    }
                }
                TileOp::Exp2 => {
                    for x in acc.iter_mut() {
                        *x = exp2_avx512::<F>(*x);
                    }
                }
                TileOp::Recip => {
                    let one = _mm512_set1_ps(1.0);
                    for x in acc.iter_mut() {
                        *x = _mm512_div_ps(one, *x);
                    }
                }
                TileOp::Sqrt => {
                    for x in acc.iter_mut() {
                        *x = _mm512_sqrt_ps(*x);
                    }
                }
                TileOp::RoundF16 => {
                    for x in acc.iter_mut() {
                        let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*x);
                        *x = _mm512_cvtph_ps(h);
                    }
                }
                TileOp::RoundBF16 => {
                    // As the AVX2 tiles: add 0x7FFF plus the kept lowest bit, clear the low
                    // half; a NaN keeps its upper bits, quieted.
                    let one = _mm512_set1_epi32(1);
                    let bias = _mm512_set1_epi32(0x7FFF);
                    let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
                    let quiet = _mm512_set1_epi32(0x0040_0000);
                    for x in acc.iter_mut() {
                        let b = _mm512_castps_si512(*x);
                        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), one);
                        let r = _mm512_add_epi32(b, _mm512_add_epi32(bias, lsb));
                        let r = _mm512_and_si512(r, high);
                        let nan = _mm512_and_si512(_mm512_or_si512(b, quiet), high);
                        let is_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(*x, *x);
                        *x = _mm512_mask_blend_ps(
                            is_nan,
                            _mm512_castsi512_ps(r),
                            _mm512_castsi512_ps(nan),
                        );
                    }
                }
                TileOp::Other(op, b) => {
                    let mut t = [0f32; AVX512_TILE];
                    for (k, x) in acc.iter().enumerate() {
                        _mm512_storeu_ps(t.as_mut_ptr().add(16 * k), *x);
                    }
                    chain_in_place::<F>(op, b, i, &mut t);
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm512_loadu_ps(t.as_ptr().add(16 * k));
                    }
                }
            }
        }
        let o = out.as_mut_ptr().add(i);
        for (k, x) in acc.iter().enumerate() {
            if stream {
                _mm512_stream_ps(o.add(16 * k), *x);
            } else {
                _mm512_storeu_ps(o.add(16 * k), *x);
            }
        }
        i += AVX512_TILE;
    }
    i
}
