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

/// A prefill block's additive bias.
#[derive(Clone, Copy)]
pub(super) enum BiasT<'a> {
    /// Key-major rows: `qt` values per key, row `r` reads `r mod qt` (a causal mask).
    Rows(&'a [f32]),
    /// One value per key for every query row (a key padding mask: the bias view's stride
    /// along the queries is 0).
    Keys(&'a [f32]),
}

impl BiasT<'_> {
    /// Whether the bias hides every key of the block from the tile's first `nq` rows.
    pub(super) fn hides_all(self, qt: usize, nq: usize) -> bool {
        match self {
            BiasT::Rows(b) => b
                .chunks_exact(qt)
                .all(|key| key[..nq].iter().all(|&x| x == f32::NEG_INFINITY)),
            BiasT::Keys(b) => b.iter().all(|&x| x == f32::NEG_INFINITY),
        }
    }
}

/// The online-softmax step of a prefill block over key-major scores (`sc[j·rows + r]`),
/// `LANES` query rows at a time: the scores become `scale·x + bias`, then probabilities
/// relative to each row's new running maximum (in place); the running sums and
/// accumulators are rescaled to it. A row that has seen only `-inf` keeps maximum `-inf`,
/// sum 0 and accumulator 0.
pub(super) struct SoftmaxT<'a> {
    pub(super) sc: &'a mut [f32],
    pub(super) bias: Option<BiasT<'a>>,
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
            for j in 0..self.n {
                let x: &mut [f32; LANES] =
                    (&mut self.sc[j * rows + r0..][..LANES]).try_into().unwrap();
                let bv: [f32; LANES] = match self.bias {
                    Some(BiasT::Rows(b)) => b[j * self.qt + ii0..][..LANES].try_into().unwrap(),
                    Some(BiasT::Keys(b)) => [b[j]; LANES],
                    None => [0.0; LANES],
                };
                for i in 0..LANES {
                    let v = simd::fma::<F>(x[i], self.scale, bv[i]);
                    x[i] = v;
                    mx[i] = if v > mx[i] { v } else { mx[i] };
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
                rescale(&mut self.acc[r * self.d..(r + 1) * self.d], corr[i]);
            }
        }
    }
}

/// An accumulator row times the correction of its running maximum (nothing to do at 1).
#[inline(always)]
pub(super) fn rescale(acc: &mut [f32], corr: f32) {
    if corr != 1.0 {
        acc.iter_mut().for_each(|a| *a *= corr);
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

    /// [`super::SoftmaxT`] with the rows in vector registers, four vectors of rows at a time
    /// (four independent maximum and sum chains), the exponentials those of the decode
    /// path ([`crate::simd::exp2_softmax`]). `false` where it does not apply (another
    /// instruction set; rows or `qt` not a multiple of the vector width).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::kernels::attention) fn softmax(
        sc: &mut [f32],
        bias: Option<super::BiasT>,
        qt: usize,
        m: &mut [f32],
        l: &mut [f32],
        acc: &mut [f32],
        scale: f32,
        n: usize,
        d: usize,
    ) -> bool {
        let rows = m.len();
        assert!(
            sc.len() >= n * rows && l.len() >= rows && acc.len() >= rows * d,
            "attention softmax: operands too short"
        );
        // The bias as a pointer and its mode: 0 none, 1 key-major rows (`qt` per key), 2 one
        // value per key.
        let (b, mode) = match bias {
            None => (std::ptr::null(), 0),
            Some(super::BiasT::Rows(b)) => {
                assert!(b.len() >= n * qt, "attention softmax: bias too short");
                (b.as_ptr(), 1)
            }
            Some(super::BiasT::Keys(b)) => {
                assert!(b.len() >= n, "attention softmax: bias too short");
                (b.as_ptr(), 2)
            }
        };
        #[cfg(target_arch = "x86_64")]
        {
            let lanes = match isa() {
                Isa::Avx512 => 16,
                Isa::Avx2 => 8,
                _ => 0,
            };
            if lanes > 0 && rows % lanes == 0 && qt % lanes == 0 {
                let st = x86::SoftmaxArgs {
                    sc: sc.as_mut_ptr(),
                    rows,
                    n,
                    bias: b,
                    qt,
                    scale,
                    m: m.as_mut_ptr(),
                    l: l.as_mut_ptr(),
                };
                let mut corr = [0f32; 64];
                let mut r0 = 0;
                while r0 < rows {
                    let v = ((rows - r0) / lanes).min(4);
                    // SAFETY: the features were detected (`isa`); rows `r0 .. r0 + v·lanes`
                    // of `sc` (over `n` keys), `m` and `l`, and the bias the mode reads lie
                    // inside the slices (asserted above).
                    unsafe {
                        match (lanes, v, mode) {
                            (16, 4, 0) => x86::softmax_avx512::<4, 0>(st, r0, &mut corr),
                            (16, 4, 1) => x86::softmax_avx512::<4, 1>(st, r0, &mut corr),
                            (16, 4, _) => x86::softmax_avx512::<4, 2>(st, r0, &mut corr),
                            (16, _, 0) => x86::softmax_avx512::<1, 0>(st, r0, &mut corr),
                            (16, _, 1) => x86::softmax_avx512::<1, 1>(st, r0, &mut corr),
                            (16, _, _) => x86::softmax_avx512::<1, 2>(st, r0, &mut corr),
                            (_, 4, 0) => x86::softmax_avx2::<4, 0>(st, r0, &mut corr),
                            (_, 4, 1) => x86::softmax_avx2::<4, 1>(st, r0, &mut corr),
                            (_, 4, _) => x86::softmax_avx2::<4, 2>(st, r0, &mut corr),
                            (_, _, 0) => x86::softmax_avx2::<1, 0>(st, r0, &mut corr),
                            (_, _, 1) => x86::softmax_avx2::<1, 1>(st, r0, &mut corr),
                            (_, _, _) => x86::softmax_avx2::<1, 2>(st, r0, &mut corr),
                        }
                    }
                    let done = if v == 4 { 4 * lanes } else { lanes };
                    for (i, &c) in corr[..done].iter().enumerate() {
                        let r = r0 + i;
                        super::rescale(&mut acc[r * d..(r + 1) * d], c);
                    }
                    r0 += done;
                }
                return true;
            }
        }
        let _ = (sc, b, mode, qt, m, l, acc, scale, n, d);
        false
    }

    /// `dst[c·ld + r] = src[r·src_s + c]` for rows `r < nr` and columns `c < d` (a query
    /// tile transposed for the products), in 16 × 16 (AVX-512) or 8 × 8 (AVX2) register
    /// tiles. `false` where it does not apply (no AVX2; `nr` or `d` not a multiple of 8).
    pub(in crate::kernels::attention) fn transpose(
        dst: &mut [f32],
        ld: usize,
        src: &[f32],
        src_s: usize,
        nr: usize,
        d: usize,
    ) -> bool {
        if nr == 0 || d == 0 {
            return true;
        }
        assert!(
            dst.len() >= (d - 1) * ld + nr && src.len() >= (nr - 1) * src_s + d,
            "attention transpose: operands too short"
        );
        #[cfg(target_arch = "x86_64")]
        {
            use crate::simd::transpose::{tile_avx2, tile_avx512};
            let wide = isa() == Isa::Avx512 && nr % 16 == 0 && d % 16 == 0;
            if wide || (isa() >= Isa::Avx2 && nr % 8 == 0 && d % 8 == 0) {
                let w = if wide { 16 } else { 8 };
                for r0 in (0..nr).step_by(w) {
                    for c0 in (0..d).step_by(w) {
                        let (from, to) = (r0 * src_s + c0, c0 * ld + r0);
                        // SAFETY: the features were detected; the tile's rows `r0..r0 + w`
                        // and columns `c0..c0 + w` lie inside both operands (asserted above).
                        unsafe {
                            let (s, t) = (src.as_ptr().add(from), dst.as_mut_ptr().add(to));
                            if wide {
                                tile_avx512(s, src_s, t, ld)
                            } else {
                                tile_avx2(s, src_s, t, ld)
                            }
                        };
                    }
                }
                return true;
            }
        }
        let _ = (dst, ld, src, src_s);
        false
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use std::arch::x86_64::*;

        /// [`super::softmax`]'s operands as raw parts.
        #[derive(Clone, Copy)]
        pub struct SoftmaxArgs {
            pub sc: *mut f32,
            pub rows: usize,
            pub n: usize,
            pub bias: *const f32,
            pub qt: usize,
            pub scale: f32,
            pub m: *mut f32,
            pub l: *mut f32,
        }

        /// The softmax step of `V` vectors of rows from `r0` (bias mode `B`: 0 none, 1
        /// key-major rows, 2 one value per key); each row's correction of its running
        /// maximum goes to `corr` (the caller rescales the accumulators).
        macro_rules! softmax_t {
            ($name:ident, $feature:literal, $lanes:literal, $load:ident,
             $store:ident, $splat:ident, $fma:ident, $mul:ident, $sub:ident, $add:ident,
             $max:ident, $exp2:path) => {
                #[target_feature(enable = $feature)]
                pub unsafe fn $name<const V: usize, const B: u8>(
                    a: SoftmaxArgs,
                    r0: usize,
                    corr: &mut [f32; 64],
                ) {
                    let SoftmaxArgs {
                        sc,
                        rows,
                        n,
                        bias,
                        qt,
                        scale,
                        m,
                        l,
                    } = a;
                    let vs = $splat(scale);
                    let mut mx = [$splat(f32::NEG_INFINITY); V];
                    for j in 0..n {
                        let x = sc.add(j * rows + r0);
                        let kb = if B == 2 { $splat(*bias.add(j)) } else { vs };
                        for (i, mi) in mx.iter_mut().enumerate() {
                            let xi = $load(x.add(i * $lanes));
                            let y = match B {
                                0 => $mul(xi, vs),
                                1 => $fma(xi, vs, $load(bias.add(j * qt + (r0 + i * $lanes) % qt))),
                                _ => $fma(xi, vs, kb),
                            };
                            $store(x.add(i * $lanes), y);
                            // `max` returns its second operand when one is NaN: a NaN
                            // score leaves the running maximum as it was (as the
                            // portable loop's comparison does).
                            *mi = $max(y, *mi);
                        }
                    }
                    // A row whose keys are all hidden so far (maximum −∞) subtracts the
                    // least finite float instead: its exponentials stay 0, never NaN.
                    let (low, log2e) = ($splat(f32::MIN), $splat(std::f32::consts::LOG2_E));
                    let mut safe = [low; V];
                    for i in 0..V {
                        let old = $load(m.add(r0 + i * $lanes));
                        let new = $max(mx[i], old);
                        $store(m.add(r0 + i * $lanes), new);
                        safe[i] = $max(new, low);
                        $store(
                            corr.as_mut_ptr().add(i * $lanes),
                            $exp2($mul($sub(old, safe[i]), log2e)),
                        );
                    }
                    let mut sum = [$splat(0.0); V];
                    for j in 0..n {
                        let x = sc.add(j * rows + r0);
                        for i in 0..V {
                            let xi = $load(x.add(i * $lanes));
                            let e = $exp2($mul($sub(xi, safe[i]), log2e));
                            $store(x.add(i * $lanes), e);
                            sum[i] = $add(sum[i], e);
                        }
                    }
                    for i in 0..V {
                        let c = $load(corr.as_ptr().add(i * $lanes));
                        let li = l.add(r0 + i * $lanes);
                        $store(li, $fma($load(li), c, sum[i]));
                    }
                }
            };
        }

        softmax_t!(
            softmax_avx512,
            "avx512f",
            16,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps,
            _mm512_mul_ps,
            _mm512_sub_ps,
            _mm512_add_ps,
            _mm512_max_ps,
            crate::simd::exp2_softmax_avx512
        );
        softmax_t!(
            softmax_avx2,
            "avx2,fma",
            8,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_mul_ps,
            _mm256_sub_ps,
            _mm256_add_ps,
            _mm256_max_ps,
            crate::simd::exp2_softmax_avx2
        );

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
