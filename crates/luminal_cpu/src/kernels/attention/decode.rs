//! The decode path's block steps (a few query rows): direct dot products against each
//! key, the row-wise online softmax, and the accumulation of value rows.

use super::{fold_lanes, LANES};
use crate::simd::{self, Task};

/// The online-softmax step of one block for the rows of one group: scores become
/// probabilities relative to the new running maximum (in place), and the running sums and
/// accumulators are rescaled to it. Rows past `nq` in a tile (the last, short one) are
/// zeroed so the product adds nothing.
pub(super) struct Softmax<'a> {
    pub(super) sc: &'a mut [f32],
    /// The bias of the block's first key for query row 0; rows `bstride` apart.
    pub(super) bs: &'a [f32],
    pub(super) bstride: usize,
    pub(super) m: &'a mut [f32],
    pub(super) l: &'a mut [f32],
    pub(super) acc: &'a mut [f32],
    pub(super) scale: f32,
    pub(super) qt: usize,
    pub(super) nq: usize,
    pub(super) n: usize,
    pub(super) kb: usize,
    pub(super) d: usize,
}

impl Task for Softmax<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let rows = self.m.len();
        let log2e = std::f32::consts::LOG2_E;
        for r in 0..rows {
            let ii = r % self.qt;
            let x = &mut self.sc[r * self.kb..r * self.kb + self.n];
            if ii >= self.nq {
                x.fill(0.0);
                continue;
            }
            let b = &self.bs[ii * self.bstride..ii * self.bstride + self.n];
            // Lane-wise maximum and sum, so the loops vectorise.
            let mut lanes = [f32::NEG_INFINITY; LANES];
            let split = x.len() / LANES * LANES;
            let (xm, xt) = x.split_at_mut(split);
            for (xc, bc) in xm.chunks_exact_mut(LANES).zip(b.chunks_exact(LANES)) {
                for i in 0..LANES {
                    let v = simd::fma::<F>(xc[i], self.scale, bc[i]);
                    xc[i] = v;
                    lanes[i] = if v > lanes[i] { v } else { lanes[i] };
                }
            }
            for (i, xv) in xt.iter_mut().enumerate() {
                let v = simd::fma::<F>(*xv, self.scale, b[split + i]);
                *xv = v;
                lanes[i] = if v > lanes[i] { v } else { lanes[i] };
            }
            let mx = lanes
                .iter()
                .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
            let m_new = if mx > self.m[r] { mx } else { self.m[r] };
            if m_new == f32::NEG_INFINITY {
                x.fill(0.0);
                continue;
            }
            let corr = simd::exp2::<F>((self.m[r] - m_new) * log2e);
            let mut sums = [0f32; LANES];
            let (xm, xt) = x.split_at_mut(split);
            for xc in xm.chunks_exact_mut(LANES) {
                for i in 0..LANES {
                    let e = simd::exp2::<F>((xc[i] - m_new) * log2e);
                    xc[i] = e;
                    sums[i] += e;
                }
            }
            for (i, xv) in xt.iter_mut().enumerate() {
                let e = simd::exp2::<F>((*xv - m_new) * log2e);
                *xv = e;
                sums[i] += e;
            }
            let sum: f32 = sums.iter().sum();
            if corr != 1.0 {
                self.acc[r * self.d..(r + 1) * self.d]
                    .iter_mut()
                    .for_each(|a| *a *= corr);
            }
            self.l[r] = self.l[r] * corr + sum;
            self.m[r] = m_new;
        }
    }
}

/// `sc[r][j] = q_r · k_j` for the block's `n` keys (rows of `d` floats, keys `k_t` apart).
pub(super) struct Scores<'a> {
    pub(super) sc: &'a mut [f32],
    pub(super) q: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) k_t: usize,
    pub(super) n: usize,
    pub(super) kb: usize,
    pub(super) d: usize,
}

impl Task for Scores<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        match self.d {
            64 => self.fixed::<F, 64>(),
            128 => self.fixed::<F, 128>(),
            _ => {
                let rows = self.q.len() / self.d;
                for j in 0..self.n {
                    let kj = &self.k[j * self.k_t..j * self.k_t + self.d];
                    for r in 0..rows {
                        let qr = &self.q[r * self.d..(r + 1) * self.d];
                        self.sc[r * self.kb + j] = dot::<F>(qr, kj);
                    }
                }
            }
        }
    }
}

impl Scores<'_> {
    /// Head dim `D` known: fully unrolled dot products.
    #[inline(always)]
    fn fixed<const F: bool, const D: usize>(self) {
        let rows = self.q.len() / D;
        for r in 0..rows {
            let qr: &[f32; D] = self.q[r * D..(r + 1) * D].try_into().unwrap();
            let out = &mut self.sc[r * self.kb..r * self.kb + self.n];
            for (j, o) in out.iter_mut().enumerate() {
                let kj: &[f32; D] = self.k[j * self.k_t..j * self.k_t + D].try_into().unwrap();
                let mut l = [0f32; LANES];
                for c in 0..D / LANES {
                    for i in 0..LANES {
                        l[i] = simd::fma::<F>(qr[c * LANES + i], kj[c * LANES + i], l[i]);
                    }
                }
                *o = fold_lanes(l, |a, b| a + b);
            }
        }
    }
}

/// `a · b` in `LANES` partial sums (vectorised), reduced as a tree.
#[inline(always)]
fn dot<const F: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let mut tail = 0.0;
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        tail = simd::fma::<F>(*x, *y, tail);
    }
    for (x, y) in ac.zip(bc) {
        for i in 0..LANES {
            lanes[i] = simd::fma::<F>(x[i], y[i], lanes[i]);
        }
    }
    fold_lanes(lanes, |a, b| a + b) + tail
}

/// `acc_r += Σ_j p[r][j] v_j` over the block's `n` keys.
pub(super) struct Accumulate<'a> {
    pub(super) acc: &'a mut [f32],
    pub(super) p: &'a [f32],
    pub(super) v: &'a [f32],
    pub(super) v_t: usize,
    pub(super) n: usize,
    pub(super) kb: usize,
    pub(super) d: usize,
}

impl Task for Accumulate<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        match self.d {
            64 => self.fixed::<F, 64>(),
            128 => self.fixed::<F, 128>(),
            _ => self.any::<F>(),
        }
    }
}

impl Accumulate<'_> {
    /// Head dim `D` known: each row's accumulator stays in registers over the block.
    #[inline(always)]
    fn fixed<const F: bool, const D: usize>(self) {
        let rows = self.acc.len() / D;
        for r in 0..rows {
            let ar: &mut [f32; D] = (&mut self.acc[r * D..(r + 1) * D]).try_into().unwrap();
            let mut a = *ar;
            let p = &self.p[r * self.kb..r * self.kb + self.n];
            for (j, &pj) in p.iter().enumerate() {
                let vj: &[f32; D] = self.v[j * self.v_t..j * self.v_t + D].try_into().unwrap();
                for c in 0..D {
                    a[c] = simd::fma::<F>(pj, vj[c], a[c]);
                }
            }
            *ar = a;
        }
    }

    #[inline(always)]
    fn any<const F: bool>(self) {
        let rows = self.acc.len() / self.d;
        for j in 0..self.n {
            let vj = &self.v[j * self.v_t..j * self.v_t + self.d];
            for r in 0..rows {
                let p = self.p[r * self.kb + j];
                let ar = &mut self.acc[r * self.d..(r + 1) * self.d];
                for (a, &x) in ar.iter_mut().zip(vj) {
                    *a = simd::fma::<F>(p, x, *a);
                }
            }
        }
    }
}
