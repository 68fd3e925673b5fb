//! The prefill path's block steps: scores and probabilities kept key-major
//! (`sc[j·rows + r]`, query rows in vector lanes), the online softmax across those lanes,
//! and the two block products — portable loops, and AVX-512 / AVX2 register tiles
//! ([`tiles`]) that read k and v in place.

use super::LANES;
use crate::simd::{self, Task};

/// Query rows handled together in the vector lanes of the transposed products (a
/// multiple of `LANES`; the query tile is a multiple of it).
pub(super) const ROW_CHUNK: usize = 32;

/// `sc[j·rows + r] = q_r · k_j` for the block's `n` keys, q transposed (`q_t[c·rows + r]`):
/// each step broadcasts one element of `KEYS` keys against `ROW_CHUNK` queries in lanes.
pub(super) struct ScoresT<'a> {
    pub(super) sc: &'a mut [f32],
    pub(super) q_t: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) k_t: usize,
    pub(super) n: usize,
    pub(super) rows: usize,
    pub(super) d: usize,
}

impl Task for ScoresT<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(mut self) {
        let mut j = 0;
        while j + 4 <= self.n {
            self.keys::<F, 4>(j);
            j += 4;
        }
        while j < self.n {
            self.keys::<F, 1>(j);
            j += 1;
        }
    }
}

impl ScoresT<'_> {
    #[inline(always)]
    fn keys<const F: bool, const KEYS: usize>(&mut self, j0: usize) {
        let (rows, d) = (self.rows, self.d);
        // The keys' rows side by side, element c of key jj at kt[c·KEYS + jj], so the
        // inner loop reads one fixed-size group per step.
        let mut kt = [0f32; 8 * 128];
        let direct = d <= 128;
        if direct {
            for jj in 0..KEYS {
                let kr = &self.k[(j0 + jj) * self.k_t..][..d];
                for (c, &x) in kr.iter().enumerate() {
                    kt[c * KEYS + jj] = x;
                }
            }
        }
        for r0 in (0..rows).step_by(ROW_CHUNK) {
            let mut acc = [[0f32; ROW_CHUNK]; KEYS];
            for c in 0..d {
                let qv: &[f32; ROW_CHUNK] =
                    self.q_t[c * rows + r0..][..ROW_CHUNK].try_into().unwrap();
                let kv: [f32; KEYS] = if direct {
                    kt[c * KEYS..][..KEYS].try_into().unwrap()
                } else {
                    std::array::from_fn(|jj| self.k[(j0 + jj) * self.k_t + c])
                };
                for jj in 0..KEYS {
                    let a = &mut acc[jj];
                    for i in 0..ROW_CHUNK {
                        a[i] = simd::fma::<F>(kv[jj], qv[i], a[i]);
                    }
                }
            }
            for (jj, a) in acc.iter().enumerate() {
                self.sc[(j0 + jj) * rows + r0..][..ROW_CHUNK].copy_from_slice(a);
            }
        }
    }
}

/// The online-softmax step of one block on key-major scores (`sc[j·rows + r]`), `LANES`
/// query rows at a time: scores become probabilities relative to the new running maximum
/// (in place); running sums and accumulators are rescaled to it. A row that has seen only
/// `-inf` keeps maximum `-inf`, sum 0 and accumulator 0.
pub(super) struct SoftmaxT<'a> {
    pub(super) sc: &'a mut [f32],
    /// The block's bias, key-major (`qt` rows per key; row `r` reads `r mod qt`).
    pub(super) bias: Option<&'a [f32]>,
    pub(super) qt: usize,
    pub(super) m: &'a mut [f32],
    pub(super) l: &'a mut [f32],
    pub(super) acc: &'a mut [f32],
    pub(super) scale: f32,
    pub(super) n: usize,
    pub(super) d: usize,
}

impl Task for SoftmaxT<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let rows = self.m.len();
        let log2e = std::f32::consts::LOG2_E;
        for r0 in (0..rows).step_by(LANES) {
            let ii0 = r0 % self.qt;
            let mut mx = [f32::NEG_INFINITY; LANES];
            if let Some(b) = self.bias {
                for j in 0..self.n {
                    let x: &mut [f32; LANES] =
                        (&mut self.sc[j * rows + r0..][..LANES]).try_into().unwrap();
                    let bv: &[f32; LANES] = b[j * self.qt + ii0..][..LANES].try_into().unwrap();
                    for i in 0..LANES {
                        let v = simd::fma::<F>(x[i], self.scale, bv[i]);
                        x[i] = v;
                        mx[i] = if v > mx[i] { v } else { mx[i] };
                    }
                }
            } else {
                for j in 0..self.n {
                    let x: &mut [f32; LANES] =
                        (&mut self.sc[j * rows + r0..][..LANES]).try_into().unwrap();
                    for i in 0..LANES {
                        let v = x[i] * self.scale;
                        x[i] = v;
                        mx[i] = if v > mx[i] { v } else { mx[i] };
                    }
                }
            }
            let (mut safe, mut corr) = ([0f32; LANES], [0f32; LANES]);
            for i in 0..LANES {
                let old = self.m[r0 + i];
                let new = if mx[i] > old { mx[i] } else { old };
                safe[i] = if new == f32::NEG_INFINITY { 0.0 } else { new };
                corr[i] = simd::exp2::<F>((old - safe[i]) * log2e);
                self.m[r0 + i] = new;
            }
            let mut sum = [0f32; LANES];
            for j in 0..self.n {
                let x: &mut [f32; LANES] =
                    (&mut self.sc[j * rows + r0..][..LANES]).try_into().unwrap();
                for i in 0..LANES {
                    let e = simd::exp2::<F>((x[i] - safe[i]) * log2e);
                    x[i] = e;
                    sum[i] += e;
                }
            }
            for i in 0..LANES {
                let r = r0 + i;
                self.l[r] = self.l[r] * corr[i] + sum[i];
                if corr[i] != 1.0 {
                    self.acc[r * self.d..(r + 1) * self.d]
                        .iter_mut()
                        .for_each(|a| *a *= corr[i]);
                }
            }
        }
    }
}

/// `acc_r += Σ_j p[j·rows + r] v_j` over the block's `n` keys (v rows read in place).
pub(super) struct AccumulateT<'a> {
    pub(super) acc: &'a mut [f32],
    pub(super) p: &'a [f32],
    pub(super) v: &'a [f32],
    pub(super) v_t: usize,
    pub(super) n: usize,
    pub(super) rows: usize,
    pub(super) d: usize,
}

impl Task for AccumulateT<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        match self.d {
            32 => self.fixed::<F, 32, 8>(),
            64 => self.fixed::<F, 64, 4>(),
            128 => self.fixed::<F, 128, 2>(),
            _ => self.any::<F>(),
        }
    }
}

impl AccumulateT<'_> {
    /// Head dim `D` known: `R` rows' accumulators stay in registers over the block.
    #[inline(always)]
    fn fixed<const F: bool, const D: usize, const R: usize>(self) {
        let rows = self.rows;
        for r0 in (0..rows).step_by(R) {
            let mut a = [[0f32; D]; R];
            for (rr, ar) in a.iter_mut().enumerate() {
                ar.copy_from_slice(&self.acc[(r0 + rr) * D..][..D]);
            }
            for j in 0..self.n {
                let vj: &[f32; D] = self.v[j * self.v_t..][..D].try_into().unwrap();
                let p: &[f32; R] = self.p[j * rows + r0..][..R].try_into().unwrap();
                for rr in 0..R {
                    for c in 0..D {
                        a[rr][c] = simd::fma::<F>(p[rr], vj[c], a[rr][c]);
                    }
                }
            }
            for (rr, ar) in a.iter().enumerate() {
                self.acc[(r0 + rr) * D..][..D].copy_from_slice(ar);
            }
        }
    }

    #[inline(always)]
    fn any<const F: bool>(self) {
        let (rows, d) = (self.rows, self.d);
        for j in 0..self.n {
            let vj = &self.v[j * self.v_t..][..d];
            for r in 0..rows {
                let p = self.p[j * rows + r];
                for (a, &x) in self.acc[r * d..(r + 1) * d].iter_mut().zip(vj) {
                    *a = simd::fma::<F>(p, x, *a);
                }
            }
        }
    }
}

/// Register-tile loops of the prefill products on x86 (AVX-512 / AVX2 intrinsics): the
/// key-major layouts above are read in place, so nothing is packed. Each returns `false`
/// where it does not apply (another instruction set, a head dim that is not a multiple of
/// two vectors); the caller then runs the portable loops.
pub(super) mod tiles {
    use crate::simd::{isa, Isa};

    /// `sc[j·rows + r] = Σ_c k[j·k_t + c] · q_t[c·rows + r]` for keys `0..n`.
    pub(in crate::kernels::attention) fn scores(
        sc: &mut [f32],
        q_t: &[f32],
        k: &[f32],
        k_t: usize,
        n: usize,
        rows: usize,
        d: usize,
    ) -> bool {
        if n == 0 {
            return true;
        }
        assert!(
            sc.len() >= n * rows && q_t.len() >= d * rows && k.len() >= (n - 1) * k_t + d,
            "attention scores: operands too short"
        );
        #[cfg(target_arch = "x86_64")]
        {
            let (sc, q, k) = (sc.as_mut_ptr(), q_t.as_ptr(), k.as_ptr());
            match isa() {
                Isa::Avx512 if rows % 32 == 0 => {
                    let mut j = 0;
                    // SAFETY: the features were detected (`isa`); the asserts above bound
                    // every element the loops address.
                    unsafe {
                        while j + 12 <= n {
                            x86::scores_avx512_12(sc, q, k, k_t, j, rows, d);
                            j += 12;
                        }
                        while j < n {
                            x86::scores_avx512_1(sc, q, k, k_t, j, rows, d);
                            j += 1;
                        }
                    }
                    return true;
                }
                Isa::Avx2 if rows % 16 == 0 => {
                    let mut j = 0;
                    // SAFETY: as above.
                    unsafe {
                        while j + 6 <= n {
                            x86::scores_avx2_6(sc, q, k, k_t, j, rows, d);
                            j += 6;
                        }
                        while j < n {
                            x86::scores_avx2_1(sc, q, k, k_t, j, rows, d);
                            j += 1;
                        }
                    }
                    return true;
                }
                _ => {}
            }
        }
        let _ = (sc, q_t, k, k_t, rows, d);
        false
    }

    /// `acc[r·d + c] += Σ_j p[j·rows + r] · v[j·v_t + c]` over keys `0..n`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::kernels::attention) fn accumulate(
        acc: &mut [f32],
        p: &[f32],
        v: &[f32],
        v_t: usize,
        n: usize,
        rows: usize,
        d: usize,
    ) -> bool {
        if n == 0 {
            return true;
        }
        assert!(
            acc.len() >= rows * d && p.len() >= n * rows && v.len() >= (n - 1) * v_t + d,
            "attention accumulate: operands too short"
        );
        #[cfg(target_arch = "x86_64")]
        {
            let (acc, p, v) = (acc.as_mut_ptr(), p.as_ptr(), v.as_ptr());
            match isa() {
                Isa::Avx512 if d % 32 == 0 => {
                    // SAFETY: as in `scores`.
                    unsafe {
                        for c0 in (0..d).step_by(32) {
                            let mut r0 = 0;
                            while r0 + 12 <= rows {
                                x86::accumulate_avx512_12(acc, p, v, v_t, n, rows, d, r0, c0);
                                r0 += 12;
                            }
                            while r0 + 4 <= rows {
                                x86::accumulate_avx512_4(acc, p, v, v_t, n, rows, d, r0, c0);
                                r0 += 4;
                            }
                            while r0 < rows {
                                x86::accumulate_avx512_1(acc, p, v, v_t, n, rows, d, r0, c0);
                                r0 += 1;
                            }
                        }
                    }
                    return true;
                }
                Isa::Avx2 if d % 16 == 0 => {
                    // SAFETY: as in `scores`.
                    unsafe {
                        for c0 in (0..d).step_by(16) {
                            let mut r0 = 0;
                            while r0 + 6 <= rows {
                                x86::accumulate_avx2_6(acc, p, v, v_t, n, rows, d, r0, c0);
                                r0 += 6;
                            }
                            while r0 + 4 <= rows {
                                x86::accumulate_avx2_4(acc, p, v, v_t, n, rows, d, r0, c0);
                                r0 += 4;
                            }
                            while r0 < rows {
                                x86::accumulate_avx2_1(acc, p, v, v_t, n, rows, d, r0, c0);
                                r0 += 1;
                            }
                        }
                    }
                    return true;
                }
                _ => {}
            }
        }
        let _ = (acc, p, v, v_t, rows, d);
        false
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        /// Keys `j0..j0 + KEYS` against every row: per step `c`, two vectors of q (rows in
        /// lanes) and one broadcast element per key, `2·KEYS` accumulators.
        macro_rules! scores {
            ($name:ident, $feature:literal, $keys:literal, $lanes:literal,
             $zero:ident, $load:ident, $store:ident, $splat:ident, $fma:ident) => {
                #[target_feature(enable = $feature)]
                pub unsafe fn $name(
                    sc: *mut f32,
                    q_t: *const f32,
                    k: *const f32,
                    k_t: usize,
                    j0: usize,
                    rows: usize,
                    d: usize,
                ) {
                    let mut r0 = 0;
                    while r0 < rows {
                        let mut acc = [[$zero(); 2]; $keys];
                        for c in 0..d {
                            let q = q_t.add(c * rows + r0);
                            let (q0, q1) = ($load(q), $load(q.add($lanes)));
                            for jj in 0..$keys {
                                let kv = $splat(*k.add((j0 + jj) * k_t + c));
                                acc[jj][0] = $fma(kv, q0, acc[jj][0]);
                                acc[jj][1] = $fma(kv, q1, acc[jj][1]);
                            }
                        }
                        for (jj, a) in acc.iter().enumerate() {
                            let dst = sc.add((j0 + jj) * rows + r0);
                            $store(dst, a[0]);
                            $store(dst.add($lanes), a[1]);
                        }
                        r0 += 2 * $lanes;
                    }
                }
            };
        }

        /// Rows `r0..r0 + ROWS`, head-dim columns `c0..c0 + 2·lanes`: per key, two vectors
        /// of v and one broadcast probability per row, `2·ROWS` accumulators.
        macro_rules! accumulate {
            ($name:ident, $feature:literal, $rows:literal, $lanes:literal,
             $load:ident, $store:ident, $splat:ident, $fma:ident) => {
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = $feature)]
                pub unsafe fn $name(
                    acc: *mut f32,
                    p: *const f32,
                    v: *const f32,
                    v_t: usize,
                    n: usize,
                    rows: usize,
                    d: usize,
                    r0: usize,
                    c0: usize,
                ) {
                    let mut a = [[$splat(0.0); 2]; $rows];
                    for (i, ai) in a.iter_mut().enumerate() {
                        let src = acc.add((r0 + i) * d + c0);
                        *ai = [$load(src), $load(src.add($lanes))];
                    }
                    for j in 0..n {
                        let vp = v.add(j * v_t + c0);
                        let (v0, v1) = ($load(vp), $load(vp.add($lanes)));
                        let pr = p.add(j * rows + r0);
                        for (i, ai) in a.iter_mut().enumerate() {
                            let pv = $splat(*pr.add(i));
                            ai[0] = $fma(pv, v0, ai[0]);
                            ai[1] = $fma(pv, v1, ai[1]);
                        }
                    }
                    for (i, ai) in a.iter().enumerate() {
                        let dst = acc.add((r0 + i) * d + c0);
                        $store(dst, ai[0]);
                        $store(dst.add($lanes), ai[1]);
                    }
                }
            };
        }

        scores!(
            scores_avx512_12,
            "avx512f",
            12,
            16,
            _mm512_setzero_ps,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps
        );
        scores!(
            scores_avx512_1,
            "avx512f",
            1,
            16,
            _mm512_setzero_ps,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps
        );
        scores!(
            scores_avx2_6,
            "avx2,fma",
            6,
            8,
            _mm256_setzero_ps,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps
        );
        scores!(
            scores_avx2_1,
            "avx2,fma",
            1,
            8,
            _mm256_setzero_ps,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps
        );
        accumulate!(
            accumulate_avx512_12,
            "avx512f",
            12,
            16,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps
        );
        accumulate!(
            accumulate_avx512_4,
            "avx512f",
            4,
            16,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps
        );
        accumulate!(
            accumulate_avx512_1,
            "avx512f",
            1,
            16,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps
        );
        accumulate!(
            accumulate_avx2_1,
            "avx2,fma",
            1,
            8,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps
        );
        accumulate!(
            accumulate_avx2_6,
            "avx2,fma",
            6,
            8,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps
        );
        accumulate!(
            accumulate_avx2_4,
            "avx2,fma",
            4,
            8,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps
        );
    }
}
