//! Block-quantized copies of weight matrices (ggml's Q4_0, Q4_1, Q8_0 layouts) for the
//! skinny products of decode steps: a weight row is streamed as 18–34 bytes per 32 values
//! instead of 128, and dequantized in registers. The f32 copy of the same weight stays for
//! everything else (prefill's gemm, gathers); the packed copy must hold exactly the values the
//! f32 data was decoded from (a loader sets both from one file tensor).

use crate::matvec::fill_columns;
use crate::simd::{isa, Isa};
use half::f16;
use luminal::{LuminalError, Result};

/// A ggml block format with 32 values per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedFormat {
    /// `d: f16, qs: [u8; 16]`, value `d · (q − 8)`.
    Q4_0,
    /// `d: f16, m: f16, qs: [u8; 16]`, value `d · q + m`.
    Q4_1,
    /// `d: f16, qs: [i8; 32]`, value `d · q`.
    Q8_0,
}

impl PackedFormat {
    pub fn block_bytes(self) -> usize {
        match self {
            PackedFormat::Q4_0 => 18,
            PackedFormat::Q4_1 => 20,
            PackedFormat::Q8_0 => 34,
        }
    }
}

/// A `[rows, cols]` row-major matrix stored as blocks of 32 along each row, unpacked at
/// load into what the kernel reads: the quants (16 bytes of nibbles or 32 signed bytes per
/// block) and the block scales (and Q4_1 minimums) already converted to f32.
#[derive(Clone, Debug)]
pub struct PackedMatrix {
    format: PackedFormat,
    rows: usize,
    cols: usize,
    qs: Vec<u8>,
    d: Vec<f32>,
    m: Vec<f32>,
}

impl PackedMatrix {
    /// From ggml block bytes: checks that `bytes` holds exactly `rows × cols / 32` blocks
    /// (cols a multiple of 32).
    pub fn new(format: PackedFormat, rows: usize, cols: usize, bytes: Vec<u8>) -> Result<Self> {
        let want = (rows * cols / 32) * format.block_bytes();
        if cols % 32 != 0 || bytes.len() != want {
            return Err(LuminalError::Backend(format!(
                "packed {format:?} matrix [{rows}, {cols}]: need cols % 32 == 0 and {want} bytes, got {}",
                bytes.len()
            )));
        }
        let bb = format.block_bytes();
        let blocks = rows * cols / 32;
        let q_len = if format == PackedFormat::Q8_0 { 32 } else { 16 };
        let (mut qs, mut d, mut m) = (
            Vec::with_capacity(blocks * q_len),
            Vec::with_capacity(blocks),
            vec![],
        );
        for blk in bytes.chunks_exact(bb) {
            d.push(f16_at(blk, 0));
            let q_start = if format == PackedFormat::Q4_1 {
                m.push(f16_at(blk, 2));
                4
            } else {
                2
            };
            qs.extend_from_slice(&blk[q_start..q_start + q_len]);
        }
        Ok(PackedMatrix {
            format,
            rows,
            cols,
            qs,
            d,
            m,
        })
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn format(&self) -> PackedFormat {
        self.format
    }
    /// Bytes of storage.
    pub fn len_bytes(&self) -> usize {
        self.qs.len() + 4 * (self.d.len() + self.m.len())
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// One packed row: its quants, scales and (Q4_1) minimums.
#[derive(Clone, Copy)]
struct Row<'a> {
    qs: &'a [u8],
    d: &'a [f32],
    m: &'a [f32],
}

/// `Σ x[k] · row[k]`, 16 lanes per block half, vectorised under the caller's features.
/// Each weight is formed exactly as the dequantizer does (`d·q + m`, `d·(q − 8)`, `d·q`).
#[inline(always)]
fn dot_row(format: PackedFormat, x: &[f32], row: Row) -> f32 {
    // `mul_add` only where FMA is native: elsewhere it is a slow library call.
    let fma = crate::simd::fma::<{ crate::simd::NATIVE_FMA }>;
    let mut acc = [0f32; 16];
    let nb = row.d.len();
    match format {
        PackedFormat::Q4_1 => {
            for b in 0..nb {
                let xs: &[f32; 32] = x[b * 32..b * 32 + 32].try_into().unwrap();
                let q: &[u8; 16] = row.qs[b * 16..b * 16 + 16].try_into().unwrap();
                let (d, m) = (row.d[b], row.m[b]);
                for l in 0..16 {
                    let w_lo = d * (q[l] & 15) as f32 + m;
                    let w_hi = d * (q[l] >> 4) as f32 + m;
                    acc[l] = fma(xs[l], w_lo, acc[l]);
                    acc[l] = fma(xs[l + 16], w_hi, acc[l]);
                }
            }
        }
        PackedFormat::Q4_0 => {
            for b in 0..nb {
                let xs: &[f32; 32] = x[b * 32..b * 32 + 32].try_into().unwrap();
                let q: &[u8; 16] = row.qs[b * 16..b * 16 + 16].try_into().unwrap();
                let d = row.d[b];
                for l in 0..16 {
                    let w_lo = d * ((q[l] & 15) as i32 - 8) as f32;
                    let w_hi = d * ((q[l] >> 4) as i32 - 8) as f32;
                    acc[l] = fma(xs[l], w_lo, acc[l]);
                    acc[l] = fma(xs[l + 16], w_hi, acc[l]);
                }
            }
        }
        PackedFormat::Q8_0 => {
            for b in 0..nb {
                let xs: &[f32; 32] = x[b * 32..b * 32 + 32].try_into().unwrap();
                let q: &[u8; 32] = row.qs[b * 32..b * 32 + 32].try_into().unwrap();
                let d = row.d[b];
                for l in 0..16 {
                    acc[l] = fma(xs[l], d * q[l] as i8 as f32, acc[l]);
                    acc[l] = fma(xs[l + 16], d * q[l + 16] as i8 as f32, acc[l]);
                }
            }
        }
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

/// AVX-512 version of [`dot_row`], written with intrinsics: two blocks per iteration into
/// four independent accumulators (the auto-vectorised loop kept its accumulator in memory).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn dot_row_avx512(format: PackedFormat, x: &[f32], row: Row) -> f32 {
    use std::arch::x86_64::*;
    let nb = row.d.len();
    assert!(
        x.len() >= nb * 32
            && row.qs.len() >= nb * if format == PackedFormat::Q8_0 { 32 } else { 16 }
    );
    assert!(format != PackedFormat::Q4_1 || row.m.len() >= nb);
    let (xp, qp) = (x.as_ptr(), row.qs.as_ptr());
    let low = _mm_set1_epi8(15);
    let eight = _mm512_set1_epi32(8);
    let mut acc = [_mm512_setzero_ps(); 4];
    // The 32 weights of block `b` as two vectors of 16, formed as the dequantizer does.
    let weights = |b: usize| -> (__m512, __m512) {
        let d = _mm512_set1_ps(*row.d.get_unchecked(b));
        match format {
            PackedFormat::Q8_0 => {
                let q0 = _mm_loadu_si128(qp.add(b * 32) as *const __m128i);
                let q1 = _mm_loadu_si128(qp.add(b * 32 + 16) as *const __m128i);
                let w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0));
                let w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1));
                (_mm512_mul_ps(d, w0), _mm512_mul_ps(d, w1))
            }
            _ => {
                let q = _mm_loadu_si128(qp.add(b * 16) as *const __m128i);
                let mut lo = _mm512_cvtepu8_epi32(_mm_and_si128(q, low));
                let mut hi = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low));
                if format == PackedFormat::Q4_0 {
                    lo = _mm512_sub_epi32(lo, eight);
                    hi = _mm512_sub_epi32(hi, eight);
                }
                let (lo, hi) = (_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi));
                if format == PackedFormat::Q4_1 {
                    let m = _mm512_set1_ps(*row.m.get_unchecked(b));
                    (
                        _mm512_add_ps(_mm512_mul_ps(d, lo), m),
                        _mm512_add_ps(_mm512_mul_ps(d, hi), m),
                    )
                } else {
                    (_mm512_mul_ps(d, lo), _mm512_mul_ps(d, hi))
                }
            }
        }
    };
    let mut b = 0;
    while b + 2 <= nb {
        for u in 0..2 {
            let (w0, w1) = weights(b + u);
            let xs = xp.add((b + u) * 32);
            acc[2 * u] = _mm512_fmadd_ps(_mm512_loadu_ps(xs), w0, acc[2 * u]);
            acc[2 * u + 1] = _mm512_fmadd_ps(_mm512_loadu_ps(xs.add(16)), w1, acc[2 * u + 1]);
        }
        b += 2;
    }
    if b < nb {
        let (w0, w1) = weights(b);
        let xs = xp.add(b * 32);
        acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(xs), w0, acc[0]);
        acc[1] = _mm512_fmadd_ps(_mm512_loadu_ps(xs.add(16)), w1, acc[1]);
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(sum)
}

/// AVX2 + FMA version of [`dot_row`] with intrinsics: a block is four vectors of 8, each
/// with its own accumulator.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_row_avx2(format: PackedFormat, x: &[f32], row: Row) -> f32 {
    use std::arch::x86_64::*;
    let nb = row.d.len();
    assert!(
        x.len() >= nb * 32
            && row.qs.len() >= nb * if format == PackedFormat::Q8_0 { 32 } else { 16 }
    );
    assert!(format != PackedFormat::Q4_1 || row.m.len() >= nb);
    let (xp, qp) = (x.as_ptr(), row.qs.as_ptr());
    let low = _mm_set1_epi8(15);
    let eight = _mm256_set1_epi32(8);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        let d = _mm256_set1_ps(*row.d.get_unchecked(b));
        // The block's 32 quants as four vectors of 8 i32 (elements 0-7, 8-15, 16-23, 24-31).
        let q: [__m256i; 4] = match format {
            PackedFormat::Q8_0 => {
                let q0 = _mm_loadu_si128(qp.add(b * 32) as *const __m128i);
                let q1 = _mm_loadu_si128(qp.add(b * 32 + 16) as *const __m128i);
                [
                    _mm256_cvtepi8_epi32(q0),
                    _mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8)),
                    _mm256_cvtepi8_epi32(q1),
                    _mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8)),
                ]
            }
            _ => {
                let q = _mm_loadu_si128(qp.add(b * 16) as *const __m128i);
                let lo = _mm_and_si128(q, low);
                let hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
                let mut v = [
                    _mm256_cvtepu8_epi32(lo),
                    _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                    _mm256_cvtepu8_epi32(hi),
                    _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)),
                ];
                if format == PackedFormat::Q4_0 {
                    for x in &mut v {
                        *x = _mm256_sub_epi32(*x, eight);
                    }
                }
                v
            }
        };
        let m = if format == PackedFormat::Q4_1 {
            Some(_mm256_set1_ps(*row.m.get_unchecked(b)))
        } else {
            None
        };
        for (u, qu) in q.iter().enumerate() {
            let mut w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(*qu));
            if let Some(m) = m {
                w = _mm256_add_ps(w, m);
            }
            acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(b * 32 + 8 * u)), w, acc[u]);
        }
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    _mm_cvtss_f32(s1)
}

/// `dst[i·n + j] = Σ_k a[a_off + i·a_row + k] · W[j, k]` for `i < m`, `j < n = W.rows`,
/// `k < W.cols`. Allocates nothing.
#[allow(clippy::too_many_arguments)]
pub fn skinny_packed(
    a: &[f32],
    a_off: usize,
    a_row: usize,
    w: &PackedMatrix,
    dst: &mut [f32],
    m: usize,
    parallel: bool,
) {
    let (n, k) = (w.rows, w.cols);
    assert!(m <= crate::matvec::MAX_ROWS);
    let isa = isa();
    let nb = k / 32;
    let q_len = if w.format == PackedFormat::Q8_0 {
        32
    } else {
        16
    };
    let mut rows: [&[f32]; crate::matvec::MAX_ROWS] = [&[]; crate::matvec::MAX_ROWS];
    for (i, r) in rows.iter_mut().enumerate().take(m) {
        *r = &a[a_off + i * a_row..a_off + i * a_row + k];
    }
    let format = w.format;
    fill_columns(dst, m, n, parallel, |i, j| {
        let row = Row {
            qs: &w.qs[j * nb * q_len..(j + 1) * nb * q_len],
            d: &w.d[j * nb..(j + 1) * nb],
            m: if w.m.is_empty() {
                &[]
            } else {
                &w.m[j * nb..(j + 1) * nb]
            },
        };
        match isa {
            // SAFETY: the features were detected at run time.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { dot_row_avx512(format, rows[i], row) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { dot_row_avx2(format, rows[i], row) },
            _ => dot_row(format, rows[i], row),
        }
    });
}
