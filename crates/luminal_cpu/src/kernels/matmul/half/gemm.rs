//! Wide products `x · Wᵀ` with an f16 / bf16 weight `W` (`[n, k]`, row-major, read in place)
//! and `f32` activations `x` (`[m, k]`): the prefill products of half GGUF weights
//! (`quant::weight_matmul`), exact products accumulated in `f32` like every other path.
//!
//! The register tile runs along M rather than N: an `MR × NR` tile of the output is kept as
//! `NR` columns of `MR / LANES` vectors, each step of K loads `MR` activations (one packed
//! row of `xᵀ`) and broadcasts one weight of each of the `NR` weight rows. So the weight is
//! only widened in its own layout (rows along K, a sequential conversion, once per product
//! and shared by every activation row), never transposed, and the activations are packed
//! once per product (`[k][MR]` panels, shared by every task) instead of once per weight tile.
//! The price is a transposed store of each finished tile (`MR · NR` scalars once per K
//! loop). Each output is one chain of FMAs over K in order, so results do not depend on the
//! blocking or the thread count.
//!
//! AVX-512 (`MR = 32`, `NR = 12`: 24 accumulators) and AVX2 (`MR = 16`, `NR = 6`: 12); below
//! AVX2 + F16C the caller keeps its widen-then-`gemm` path.

use crate::kernels::matmul::skinny::OutPtr;
use crate::kernels::matmul::skinny_half::Half;
use crate::simd::half::{half_level, HalfLevel};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows per task (a multiple of both `NR`); a task widens them a group of `NR` rows
/// at a time (`NR · K` floats, in L1 / L2 next to the packed activations).
const NB: usize = 96;

/// Rows of the activations packed and multiplied at a time (a multiple of every `MR`).
const M_BLOCK: usize = 256;

thread_local! {
    /// The packed activations of the product this thread runs (grows, then reused).
    static PACKED_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The widened weight rows of this thread's current task (grows, then reused).
    static WIDE_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The register tiling of each level.
impl HalfLevel {
    /// Columns of the output tile (weight rows per group).
    fn nr(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            HalfLevel::Avx512 => 12,
            #[cfg(target_arch = "x86_64")]
            HalfLevel::Avx2 => 6,
        }
    }

    /// Rows of the output tile (activation rows per packed panel).
    fn mr(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            HalfLevel::Avx512 => 32,
            #[cfg(target_arch = "x86_64")]
            HalfLevel::Avx2 => 16,
        }
    }
}

/// `dst[i·n + j] = Σ_q a[a_off + i·a_row + q] · w[j·k + q]` for `i < m`, `j < n`, `q < k`
/// with the tiling of [`half_level`]; `false` (nothing written) where there is none. Panics
/// (before writing anything) when an operand is too short. Allocates nothing once the
/// per-thread scratch has grown.
pub(crate) fn weight_gemm<H: Half>(
    a: &[f32],
    a_at: (usize, usize),
    w: &[H],
    dst: &mut [f32],
    mnk: (usize, usize, usize),
    parallel: bool,
) -> bool {
    match half_level() {
        Some(lvl) => {
            gemm_at(lvl, a, a_at, w, dst, mnk, parallel);
            true
        }
        None => false,
    }
}

/// [`weight_gemm`] with the tiling `lvl` (which the CPU must support).
pub(crate) fn gemm_at<H: Half>(
    lvl: HalfLevel,
    a: &[f32],
    (a_off, a_row): (usize, usize),
    w: &[H],
    dst: &mut [f32],
    (m, n, k): (usize, usize, usize),
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(dst.len() >= m * n, "half gemm: output too short");
    if k == 0 {
        dst[..m * n].fill(0.0);
        return;
    }
    assert!(
        a.len() >= a_off + (m - 1) * a_row + k,
        "half gemm: activation too short"
    );
    assert!(w.len() >= n * k, "half gemm: weight too short");
    // Blocks of at most `M_BLOCK` rows (the packed activations of one stay in L2 next to
    // the weight group, and the scratch stays bounded whatever M is).
    for i0 in (0..m).step_by(M_BLOCK) {
        let rows = M_BLOCK.min(m - i0);
        let a_at = (a_off + i0 * a_row, a_row);
        block(lvl, a, a_at, w, &mut dst[i0 * n..], (rows, n, k), parallel);
    }
}

/// [`gemm_at`] for one block of `m ≤ M_BLOCK` rows (operands checked by the caller).
fn block<H: Half>(
    lvl: HalfLevel,
    a: &[f32],
    (a_off, a_row): (usize, usize),
    w: &[H],
    dst: &mut [f32],
    (m, n, k): (usize, usize, usize),
    parallel: bool,
) {
    let mr = lvl.mr();
    let mb = m.div_ceil(mr);
    PACKED_A.with(|pa| {
        let mut pa = pa.borrow_mut();
        if pa.len() < mb * mr * k {
            pa.resize(mb * mr * k, 0.0);
        }
        let pa = &mut pa[..mb * mr * k];
        // Panel b, element (q, i): row b·mr + i of `a` at depth q (zero past row m). Written
        // in order (the `mr` rows read side by side stay in L1); a row at a time would write
        // each cache line of the panel `mr` times, far apart.
        // One task per panel, on the pool when the product is parallel.
        let pack = |b: usize, panel: &mut [f32]| {
            let rows = mr.min(m - b * mr);
            let src: [&[f32]; 32] = std::array::from_fn(|i| {
                let r = b * mr + i.min(rows - 1);
                &a[a_off + r * a_row..a_off + r * a_row + k]
            });
            for (q, p) in panel.chunks_exact_mut(mr).enumerate() {
                for (i, v) in p.iter_mut().enumerate() {
                    *v = if i < rows { src[i][q] } else { 0.0 };
                }
            }
        };
        if parallel && mb > 1 {
            crate::exec::par::for_each_chunk(pa, mr * k, pack);
        } else {
            pa.chunks_mut(mr * k)
                .enumerate()
                .for_each(|(b, p)| pack(b, p));
        }
        let pa: &[f32] = pa;
        let out = OutPtr(dst.as_mut_ptr());
        let tasks = n.div_ceil(NB);
        let task = |t: usize| {
            // The whole `OutPtr` (Send), not its raw pointer field, is captured.
            #[allow(clippy::redundant_locals)]
            let out = out;
            let (j0, j1) = (t * NB, ((t + 1) * NB).min(n));
            WIDE_B.with(|wb| {
                let mut wb = wb.borrow_mut();
                let nr = lvl.nr();
                if wb.len() < nr * k {
                    wb.resize(nr * k, 0.0);
                }
                for jg in (j0..j1).step_by(nr) {
                    let cols = nr.min(j1 - jg);
                    let wb = &mut wb[..cols * k];
                    H::widen(&w[jg * k..(jg + cols) * k], wb);
                    // The next group's weight rows, fetched while this one is multiplied.
                    let next = &w[(jg + cols) * k..(jg + cols + nr).min(j1) * k];
                    // SAFETY: the ISA of `lvl` is supported (the caller's contract); panel
                    // `b` holds `mr · k` floats; the `cols` widened rows hold `k` floats
                    // each; the tile's output rows `b·mr + i < m` and columns
                    // `jg + j < j1 ≤ n` lie in `dst` (m·n floats), and only this task writes
                    // columns j0..j1.
                    unsafe {
                        group(lvl, k, pa, mb, wb.as_ptr(), cols, out.0.add(jg), n, m, next);
                    }
                }
            })
        };
        if parallel && tasks > 1 {
            crate::exec::par::for_each(tasks, task);
        } else {
            (0..tasks).for_each(task);
        }
    })
}

/// The tiles of one group of `cols ≤ NR` widened weight rows at `bp` (`k` apart) against
/// the `mb` packed panels, into the `m × cols` block of the output at `c` (row stride `cn`);
/// the panels' micro kernels spread prefetches of `next` over their K loops.
///
/// # Safety
/// As in [`gemm_at`]'s task.
#[allow(clippy::too_many_arguments)]
unsafe fn group<H: Half>(
    lvl: HalfLevel,
    k: usize,
    pa: &[f32],
    mb: usize,
    bp: *const f32,
    cols: usize,
    c: *mut f32,
    cn: usize,
    m: usize,
    next: &[H],
) {
    let mr = lvl.mr();
    let bytes = std::mem::size_of_val(next);
    let seg = bytes.div_ceil(mb).next_multiple_of(64);
    for b in 0..mb {
        let rows = mr.min(m - b * mr);
        let pf = (next.as_ptr() as *const u8).wrapping_add(b * seg);
        let pf_len = seg.min(bytes.saturating_sub(b * seg));
        let (ap, cp) = (pa[b * mr * k..].as_ptr(), c.wrapping_add(b * mr * cn));
        // SAFETY: forwarded from the caller.
        unsafe {
            match lvl {
                #[cfg(target_arch = "x86_64")]
                HalfLevel::Avx512 => {
                    x86::micro_avx512(k, ap, bp, k, cols, cp, cn, rows, pf, pf_len)
                }
                #[cfg(target_arch = "x86_64")]
                HalfLevel::Avx2 => x86::micro_avx2(k, ap, bp, k, cols, cp, cn, rows, pf, pf_len),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    /// One register tile per ISA: `NR` columns of `MR = 2·LANES` rows in `2·NR` vector
    /// accumulators over the whole of K; each step loads two vectors of the packed panel
    /// and broadcasts one weight of each of the `NR` rows into two FMAs. Then the tile is
    /// transposed into the `rows × cols` block of C (rows `cn` apart).
    macro_rules! micro {
        ($name:ident, $feature:literal, $nr:literal, $lanes:literal, $vec:ty,
         $zero:ident, $load:ident, $store:ident, $splat:ident, $fma:ident) => {
            /// # Safety
            /// The CPU supports the features; `pa` holds `k · MR` floats; rows
            /// `bp + j·bs .. + k`, `j < cols ≤ NR`, are readable; the `rows × cols` block of
            /// C at `c` is writable (`rows ≤ MR`). `pf .. pf + pf_len` is only prefetched.
            #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(
                k: usize,
                pa: *const f32,
                bp: *const f32,
                bs: usize,
                cols: usize,
                c: *mut f32,
                cn: usize,
                rows: usize,
                pf: *const u8,
                pf_len: usize,
            ) {
                const NR: usize = $nr;
                const L: usize = $lanes;
                // SAFETY (whole body): every read is at depth q < k of the panel or of a
                // row j' = min(j, cols − 1) < cols; every write at (i, j) < (rows, cols).
                unsafe {
                    let b: [*const f32; NR] = std::array::from_fn(|j| bp.add(j.min(cols - 1) * bs));
                    let mut acc = [[$zero(); 2]; NR];
                    // One prefetch of `pf .. pf + pf_len` every `every` steps of K.
                    let lines = pf_len.div_ceil(64);
                    let every = (k / lines.max(1)).max(1);
                    let (mut at, mut line) = (0, 0);
                    for q in 0..k {
                        if q == at && line < lines {
                            crate::simd::prefetch_raw(pf.wrapping_add(line * 64), 1);
                            line += 1;
                            at += every;
                        }
                        let a0 = $load(pa.add(q * 2 * L));
                        let a1 = $load(pa.add(q * 2 * L + L));
                        for j in 0..NR {
                            let bv = $splat(*b[j].add(q));
                            acc[j][0] = $fma(a0, bv, acc[j][0]);
                            acc[j][1] = $fma(a1, bv, acc[j][1]);
                        }
                    }
                    let mut tile = [[0f32; 2 * L]; NR];
                    for j in 0..NR {
                        $store(tile[j].as_mut_ptr(), acc[j][0]);
                        $store(tile[j].as_mut_ptr().add(L), acc[j][1]);
                    }
                    for i in 0..rows {
                        let d = c.add(i * cn);
                        for j in 0..cols {
                            *d.add(j) = tile[j][i];
                        }
                    }
                }
            }
        };
    }

    micro!(
        micro_avx512,
        "avx512f,avx2,fma",
        12,
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps
    );
    micro!(
        micro_avx2,
        "avx2,fma",
        6,
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::testing::{assert_matches_f64, vals};
    use half::{bf16, f16};

    fn check<H: Half>(from: fn(f32) -> H) {
        for lvl in crate::simd::half::detected_half_levels() {
            for &m in &[1usize, 2, 5, 8, 9, 16, 17, 33, 40, 300] {
                for &k in &[1usize, 7, 15, 17, 100, 301] {
                    for &n in &[1usize, 5, 13, 37, 97, 203] {
                        let (a_off, a_row) = (3, k + 5);
                        let a = vals(a_off + m * a_row, (m * 31 + k) as u32);
                        let w: Vec<H> = vals(n * k, (n * 7 + k) as u32)
                            .into_iter()
                            .map(from)
                            .collect();
                        let mut dst = vec![f32::NAN; m * n + 2];
                        gemm_at(lvl, &a, (a_off, a_row), &w, &mut dst, (m, n, k), true);
                        assert_matches_f64(
                            &format!("{lvl:?}"),
                            &a,
                            (a_off, a_row),
                            |j, q| w[j * k + q].to_f32(),
                            &dst,
                            (m, n, k),
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn half_gemm_f16_matches_f64() {
        check::<f16>(f16::from_f32);
    }

    #[test]
    fn half_gemm_bf16_matches_f64() {
        check::<bf16>(bf16::from_f32);
    }
}
