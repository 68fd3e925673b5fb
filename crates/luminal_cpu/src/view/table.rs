//! Gather tables: a view's trailing dims flattened into a table of buffer offsets, loaded
//! by gathers, by 64-bit gathers of adjacent pairs, or as register-transposed tiles.

use super::{Flat, ResolvedView, MAX_FLAT_RANK};

/// Logical elements per gather table at most (16 KB of offsets).
const TABLE_MAX: i64 = 4096;

/// A view's trailing dims flattened into a table of buffer offsets: element `j` of each
/// outer index reads `base + offs[j]` (or padding where `offs[j]` is `i32::MIN`), so a
/// block loads with one gather per element whatever the view's shape (a convolution's
/// window copies and gradient pieces: runs of 2–3 elements, masks in the middle dims), and
/// the outer dims are walked once per table length.
#[derive(Debug)]
pub struct GatherTable {
    offs: Vec<i32>,
    offset: i64,
    /// The outer dims (row-major), their strides and valid windows.
    outer: Vec<(i64, i64, i64, i64)>,
    /// The table as pairs of adjacent values, where it is one (see [`Pairs`]).
    pub(super) pairs: Option<Pairs>,
    /// `(a, b, stride)` where the table is a transpose: entry `i·b + j` reads offset
    /// `i + j·stride` (a row-major block read down its columns: a convolution's output
    /// permuted to channels first, a product's operand transposed), `a` and `b`
    /// multiples of 16. Whole rows of 16 load as register-transposed tiles.
    pub(super) transpose: Option<(usize, usize, i64)>,
}

/// A table whose entries pair up (`2i`, `2i + 1`) into adjacent buffer values — both
/// (offsets `o`, `o + 1`), only the first or the second, or neither — loaded one 8-byte
/// gather per pair: gathers cost per lane, so pairs (a stride-2 convolution's gradient
/// pieces: runs of 2) load at twice the rate (AMD Zen 5: 0.17 against 0.35 ns a value).
/// A half-valid pair reads its neighbour too, masked off after the load: pairs are used
/// only where those neighbours lie in the buffer (`lo`, `hi`).
#[derive(Debug)]
pub(super) struct Pairs {
    /// Offset of each pair's first value (of its second minus one where only that is
    /// valid; `lo` where neither is).
    first: Vec<i32>,
    /// Least and greatest `first`: the pairs read offsets `lo ..= hi + 1`.
    lo: i32,
    hi: i32,
}

impl Pairs {
    /// `None` unless every pair is adjacent values or half (or all) padding: then half the
    /// lanes load the same values, whatever the share of padding.
    fn of(offs: &[i32]) -> Option<Pairs> {
        if offs.len() % 2 != 0 {
            return None;
        }
        let none = i32::MIN;
        let mut first = Vec::with_capacity(offs.len() / 2);
        for pair in offs.chunks_exact(2) {
            first.push(match (pair[0], pair[1]) {
                (a, b) if a != none && b != none => {
                    if a.checked_add(1) != Some(b) {
                        return None;
                    }
                    a
                }
                (a, _) if a != none => a,
                (_, b) if b != none => b.checked_sub(1).filter(|&f| f != none)?,
                _ => none,
            });
        }
        let read = first.iter().filter(|&&o| o != none);
        let (lo, hi) = (*read.clone().min()?, *read.max()?);
        hi.checked_add(1)?;
        for o in &mut first {
            if *o == none {
                *o = lo;
            }
        }
        Some(Pairs { first, lo, hi })
    }
}

impl GatherTable {
    /// The table of a resolved view whose rows are short or strided (long contiguous rows
    /// already load as copies), when its offsets fit in `i32`.
    pub(super) fn of(v: &ResolvedView) -> Option<GatherTable> {
        let f = Flat::of(v)?;
        let last = f.r - 1;
        let (d, st) = (f.dims[last], f.strides[last]);
        // Long contiguous rows (masked or not) load as row copies, long unmasked broadcast
        // rows as fills.
        if d >= 32 && (st == 1 || st == 0 && !f.masked) {
            return None;
        }
        // The longest run of trailing dims that fits the table.
        let mut s = f.r;
        let mut len = 1i64;
        while s > 0 && len * f.dims[s - 1] <= TABLE_MAX {
            len *= f.dims[s - 1];
            s -= 1;
        }
        if s == f.r || len < 16 {
            return None;
        }
        let mut offs = Vec::with_capacity(len as usize);
        let mut idx = [0i64; MAX_FLAT_RANK];
        for _ in 0..len {
            let mut off = 0i64;
            let mut ok = true;
            for i in s..f.r {
                off += idx[i] * f.strides[i];
                ok &= idx[i] >= f.lo[i] && idx[i] < f.hi[i];
            }
            if ok {
                offs.push(i32::try_from(off).ok().filter(|&o| o != i32::MIN)?);
            } else {
                offs.push(i32::MIN);
            }
            let mut i = f.r;
            while i > s {
                i -= 1;
                idx[i] += 1;
                if idx[i] < f.dims[i] {
                    break;
                }
                idx[i] = 0;
            }
        }
        let transpose = (f.r - s == 2
            && f.strides[s] == 1
            && f.strides[s + 1] >= 16
            && f.dims[s] % 16 == 0
            && f.dims[s + 1] % 16 == 0
            && (s..f.r).all(|i| f.lo[i] == 0 && f.hi[i] == f.dims[i]))
        .then(|| (f.dims[s] as usize, f.dims[s + 1] as usize, f.strides[s + 1]));
        Some(GatherTable {
            transpose,
            pairs: Pairs::of(&offs),
            offs,
            offset: f.offset,
            outer: (0..s)
                .map(|i| (f.dims[i], f.strides[i], f.lo[i], f.hi[i]))
                .collect(),
        })
    }

    /// Loads logical elements `z0 .. z0 + out.len()` of the view from `v`.
    pub(super) fn load(&self, v: &[f32], z0: usize, out: &mut [f32]) {
        let p = self.offs.len();
        let mut z = z0;
        let mut pos = 0;
        while pos < out.len() {
            let (q, j0) = (z / p, z % p);
            let take = (p - j0).min(out.len() - pos);
            let dst = &mut out[pos..pos + take];
            // Base and validity of outer index `q`.
            let (mut base, mut ok, mut rem) = (self.offset, true, q as i64);
            for &(d, st, lo, hi) in self.outer.iter().rev() {
                let c = rem % d;
                rem /= d;
                base += c * st;
                ok &= c >= lo && c < hi;
            }
            if !ok {
                dst.fill(0.0);
            } else if !self.load_pairs(v, base, j0, dst) && !self.load_transposed(v, base, j0, dst)
            {
                gather(v, base, &self.offs[j0..j0 + take], dst);
            }
            pos += take;
            z += take;
        }
    }

    /// Entries `j0 ..` of the table (`dst.len()` of them) at `base`, by pairs (see
    /// [`Pairs`]); false (nothing written) where the table has no pairs, the ISA no
    /// 8-byte gathers, or a half-valid pair's neighbour may lie outside `v`.
    fn load_pairs(&self, v: &[f32], base: i64, j0: usize, dst: &mut [f32]) -> bool {
        let Some(pr) = &self.pairs else {
            return false;
        };
        let inside = base + pr.lo as i64 >= 0 && base + (pr.hi as i64) + 1 < v.len() as i64;
        #[cfg(target_arch = "x86_64")]
        if inside && crate::simd::isa() == crate::simd::Isa::Avx512 {
            // SAFETY: AVX-512 is allowed; every pair reads `base + first .. + 2`, inside
            // `v` (`lo` and `hi` bound `first`, checked above).
            unsafe { load_pairs_avx512(v, base, (pr, &self.offs), j0, dst) };
            return true;
        }
        let _ = inside;
        false
    }

    /// Entries `j0 ..` of a transposing table ([`GatherTable::transpose`]) at `base` as
    /// 16 × 16 tiles transposed in registers, where they are whole groups of 16 rows
    /// (false, nothing written, elsewhere and without AVX-512).
    fn load_transposed(&self, v: &[f32], base: i64, j0: usize, dst: &mut [f32]) -> bool {
        let Some((a, b, sb)) = self.transpose else {
            return false;
        };
        let rows = 16 * b;
        let whole = j0 % rows == 0 && dst.len() % rows == 0 && j0 + dst.len() <= a * b;
        #[cfg(target_arch = "x86_64")]
        if whole && crate::simd::isa() == crate::simd::Isa::Avx512 {
            let i0 = j0 / b;
            for ti in (0..dst.len() / b).step_by(16) {
                for tj in (0..b).step_by(16) {
                    let at = base + (i0 + ti) as i64 + tj as i64 * sb;
                    // SAFETY: AVX-512 is allowed; the table has no padding, and every value
                    // it reads lies in `v` (the view was bounds-checked); the tile's rows
                    // lie in `dst` (whole rows of 16, `b` apart).
                    unsafe {
                        crate::simd::transpose::tile_avx512(
                            v.as_ptr().offset(at as isize),
                            sb as usize,
                            dst.as_mut_ptr().add(ti * b + tj),
                            b,
                        )
                    };
                }
            }
            return true;
        }
        let _ = whole;
        false
    }
}

/// [`GatherTable::load_pairs`] on AVX-512: 8 pairs (16 values) a gather, masked by the
/// entries' validity; an odd first entry and a short tail element by element.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn load_pairs_avx512(
    v: &[f32],
    base: i64,
    (pr, offs): (&Pairs, &[i32]),
    j0: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    // `base` may lie before the buffer (padding first): only `base + first` is read.
    let ptr = v.as_ptr().wrapping_offset(base as isize) as *const i64;
    let invalid = _mm512_set1_epi32(i32::MIN);
    let n = dst.len();
    // An odd first entry, alone.
    let mut k = (j0 % 2).min(n);
    gather(v, base, &offs[j0..j0 + k], &mut dst[..k]);
    while k + 16 <= n {
        let j = j0 + k;
        let idx = _mm256_loadu_si256(pr.first.as_ptr().add(j / 2) as *const __m256i);
        let x = _mm512_i32gather_epi64::<4>(idx, ptr);
        // The pairs' padding entries (their table offsets are the marker) read as 0.
        let valid = _mm512_loadu_si512(offs.as_ptr().add(j) as *const _);
        let m = _mm512_cmpneq_epi32_mask(valid, invalid);
        _mm512_storeu_ps(
            dst.as_mut_ptr().add(k),
            _mm512_maskz_mov_ps(m, _mm512_castsi512_ps(x)),
        );
        k += 16;
    }
    gather(v, base, &offs[j0 + k..j0 + n], &mut dst[k..]);
}

/// `out[j] = v[base + offs[j]]`, or 0 where `offs[j]` is `i32::MIN`. Every index read
/// lies in `v` (the view was bounds-checked).
fn gather(v: &[f32], base: i64, offs: &[i32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::isa() == crate::simd::Isa::Avx512 {
        // SAFETY: AVX-512 is allowed (the ISA level never exceeds the detected one); the
        // indices read were bounds-checked with the view.
        unsafe { gather_avx512(v, base, offs, out) };
        return;
    }
    for (o, &off) in out.iter_mut().zip(offs) {
        *o = if off == i32::MIN {
            0.0
        } else {
            v[(base + off as i64) as usize]
        };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_avx512(v: &[f32], base: i64, offs: &[i32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    let ptr = v.as_ptr().wrapping_offset(base as isize);
    let invalid = _mm512_set1_epi32(i32::MIN);
    let mut j = 0;
    while j + 16 <= n {
        let idx = _mm512_loadu_si512(offs.as_ptr().add(j) as *const _);
        let m = _mm512_cmpneq_epi32_mask(idx, invalid);
        let x = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, idx, ptr);
        _mm512_storeu_ps(out.as_mut_ptr().add(j), x);
        j += 16;
    }
    for k in j..n {
        let off = offs[k];
        out[k] = if off == i32::MIN {
            0.0
        } else {
            v[(base + off as i64) as usize]
        };
    }
}
