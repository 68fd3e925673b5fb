//! Attention over short sequences, one (batch, head) at a time with the head's whole
//! `[s, t]` block in L1: the forward for short heads (`d` ≤ 16; the tiled kernel of
//! `mod.rs` spent more on its per-block steps and per-row bias evaluations than on the
//! arithmetic there), and the backward of an attention autograd built in one piece
//! ([`AttentionGradKernel`], `luminal::patterns::AttentionGrad`) up to `d` = 128.
//!
//! - Each head is copied into scratch, padded with zero rows to a multiple of 16 keys and
//!   queries. The bias is evaluated once per launch when every head reads the same one (a
//!   causal mask), else once per head.
//! - Heads of a multiple of 16 run **key-major**: the scores are kept transposed
//!   (`Sᵀ = k·qᵀ`, `tp × sp`), so each vector holds 16 query rows and the softmax's max,
//!   exponentials and sums are plain vector ops down the keys (no per-row reductions). A
//!   block of 16 queries stops at the last key any of its rows sees (causal: half the
//!   keys), and the small products (`P·v`, `dS·k`, `dSᵀ·q`, `Pᵀ·dO`) run on register
//!   blocks of up to 8 rows by 16 columns, skipping the zero parts of a causal `P`.
//! - Other widths take a row at a time (row-major scores, keys the bias hides at the end
//!   of a row skipped).
//!
//! The backward is flash-attention's: it recomputes `P`, then `dP = dO·vᵀ`,
//! `D = Σ P ⊙ dP`, `dS = P ⊙ (dP − D)·scale`, `dq = dS·k`, `dk = dSᵀ·q`, `dv = Pᵀ·dO`,
//! written straight into the stacked `[3, batch, s, d]` output.
//!
//! Files: this one holds the launch, the row path and the small products' portable code;
//! `key_major.rs` the key-major forward and backward; `x86.rs` their AVX-512 / AVX2
//! register code.

use super::{backend_err, fold_lanes, AttentionBias, SendPtr};
use crate::kernel::{BufId, CpuKernel, RunCtx, Scratch};
use crate::kernels::fused::{RowEnv, BLOCK};
use crate::simd::{self, Task};
use crate::storage::Storage;
use crate::view::{ResolvedView, ViewExprs};
use luminal::Result;

mod key_major;
#[cfg(target_arch = "x86_64")]
mod x86;

use key_major::{key_major_bias, transposed_bias, BackwardT, ForwardT, HeadT};
#[cfg(target_arch = "x86_64")]
use x86::{gemm_avx2, gemm_avx512, transpose_avx512};

/// Heads at most this wide take this path for the backward.
pub const MAX_D: usize = 128;
/// Heads at most this wide take it for the forward (measured faster than the tiled kernel
/// at d = 16, s = t = 64; wider heads keep the tiled kernel).
pub const MAX_FORWARD_D: usize = 16;
/// At most this many keys (the bias of one head is `s × t` floats of scratch).
pub const MAX_T: usize = 512;

/// Sizes of one launch.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub batch: usize,
    pub s: usize,
    pub t: usize,
    pub d: usize,
}

/// Rows of `d` values (or of keys, for a bias) of every batch index: `data` read from
/// `offset`, batch dims `dims` with `strides`, rows `row` apart, values adjacent.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub data: &'a [f32],
    pub offset: i64,
    pub dims: &'a [i64],
    pub strides: &'a [i64],
    pub row: i64,
}

impl<'a> Rows<'a> {
    /// The rows of a resolved view over `[batch.. (nb dims), .., rows at `row_axis`, ..]`.
    pub fn of(data: &'a [f32], view: &'a ResolvedView, nb: usize, row_axis: usize) -> Self {
        Rows {
            data,
            offset: view.offset,
            dims: &view.dims[..nb],
            strides: &view.strides[..nb],
            row: view.strides[row_axis],
        }
    }

    /// Offset of batch index `b`'s first row, and the row stride.
    fn head(&self, b: usize) -> (usize, usize) {
        let (mut rem, mut off) = (b as i64, self.offset);
        for i in (0..self.dims.len()).rev() {
            let n = self.dims[i];
            off += rem % n * self.strides[i];
            rem /= n;
        }
        (off as usize, self.row as usize)
    }

    /// Whether every batch index reads the same rows (stride 0 or size 1 along batch dims).
    fn shared(&self) -> bool {
        (0..self.dims.len()).all(|i| self.strides[i] == 0 || self.dims[i] == 1)
    }
}

/// The bias rows of one batch index (`off`: its offset; rows `b_s` apart, keys adjacent)
/// into `dst` (`s × t`, row-major), and each row's visible key range: keys at the end of
/// a row that the bias hides (`-inf`) are skipped (a row hidden entirely keeps all its
/// keys, so its result is what the unfused graph gives).
pub(super) fn eval_bias(
    bias: &AttentionBias,
    bufs: &[Storage],
    (off, b_s): (usize, usize),
    (s, t): (usize, usize),
    dst: &mut [f32],
    ends: &mut [f32],
) {
    let prog = &bias.program;
    prog.with_regs(|mut regs| {
        if b_s == t {
            let mut z = 0;
            while z < s * t {
                let n = BLOCK.min(s * t - z);
                let out = &mut dst[z..z + n];
                if let Some(src) = prog.eval(bufs, RowEnv::NONE, off + z, n, &mut regs, out) {
                    out.copy_from_slice(&src[..n]);
                }
                z += n;
            }
        } else {
            for i in 0..s {
                let mut j = 0;
                while j < t {
                    let n = BLOCK.min(t - j);
                    let out = &mut dst[i * t + j..][..n];
                    let z0 = off + i * b_s + j;
                    if let Some(src) = prog.eval(bufs, RowEnv::NONE, z0, n, &mut regs, out) {
                        out.copy_from_slice(&src[..n]);
                    }
                    j += n;
                }
            }
        }
    });
    for i in 0..s {
        let row = &dst[i * t..(i + 1) * t];
        let end = row.iter().rposition(|&x| x != f32::NEG_INFINITY);
        ends[i] = end.map_or(t, |e| e + 1) as f32;
    }
}

/// One head's operands copied into scratch: q and dO row-major, k and v row-major and
/// transposed.
struct Head<'a> {
    q: &'a [f32],
    k: &'a [f32],
    kt: &'a [f32],
    v: &'a [f32],
    vt: &'a [f32],
}

/// Copies `rows` rows of `d` (`stride` apart from `off`) into `dst` row-major and, when
/// `tr` is given, transposed (`d × rows`).
fn gather(
    src: &[f32],
    off: usize,
    stride: usize,
    (rows, d): (usize, usize),
    dst: &mut [f32],
    tr: Option<&mut [f32]>,
) {
    for r in 0..rows {
        copy_row(&mut dst[r * d..(r + 1) * d], &src[off + r * stride..][..d]);
    }
    if let Some(tr) = tr {
        let tp = rows.next_multiple_of(W);
        #[cfg(target_arch = "x86_64")]
        if d % 16 == 0 && dst.len() >= tp * d && tr.len() >= d * tp {
            if crate::simd::isa() == crate::simd::Isa::Avx512 {
                // SAFETY: AVX-512 is allowed (the ISA level never exceeds the detected one);
                // `dst` holds `tp` rows of `d` (rows past `rows` are the zero padding) and
                // `tr` `d` rows of `tp` (checked).
                unsafe { transpose_avx512(dst, tr, tp, d) };
                return;
            }
        }
        for r in 0..rows {
            for c in 0..d {
                tr[c * tp + r] = dst[r * d + c];
            }
        }
    }
}

/// `dst.copy_from_slice(src)` for a head's short rows: whole 16-value pieces as fixed-size
/// copies, which compile to vector moves (a `memcpy` call per 64-byte row cost more than
/// the copy).
#[inline(always)]
fn copy_row(dst: &mut [f32], src: &[f32]) {
    let mut o = dst.chunks_exact_mut(16);
    let mut i = src.chunks_exact(16);
    for (o, i) in (&mut o).zip(&mut i) {
        let piece: &[f32; 16] = i.try_into().expect("a 16-value piece");
        o.copy_from_slice(piece);
    }
    o.into_remainder().copy_from_slice(i.remainder());
}

/// Keys per vector step (rows of keys are padded to a multiple: k and v with zero rows, the
/// scores with `-inf`).
const W: usize = super::LANES;

/// A row of scores over the first `n` keys (`n` a multiple of [`W`]; `bt` is `d × tp`):
/// `x[j] = scale · Σ_c a[c] · bt[c·tp + j] + bias[j]` for `j < valid`, `-inf` after.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_row<const F: bool>(
    a: &[f32],
    bt: &[f32],
    tp: usize,
    (valid, n): (usize, usize),
    scale: f32,
    bias: Option<&[f32]>,
    x: &mut [f32],
) {
    // Up to four 16-key chunks at once: four independent FMA chains over `c`.
    let mut j0 = 0;
    while j0 < n {
        match (n - j0) / W {
            1 => scores_chunks::<F, 1>(a, bt, tp, j0, scale, x),
            2 => scores_chunks::<F, 2>(a, bt, tp, j0, scale, x),
            3 => scores_chunks::<F, 3>(a, bt, tp, j0, scale, x),
            _ => scores_chunks::<F, 4>(a, bt, tp, j0, scale, x),
        }
        j0 += W * ((n - j0) / W).min(4);
    }
    if let Some(b) = bias {
        for (xv, &bv) in x[..valid].iter_mut().zip(&b[..valid]) {
            *xv += bv;
        }
    }
    x[valid..n].fill(f32::NEG_INFINITY);
}

/// Keys `j0 .. j0 + K·W` of a row of scores (see [`scores_row`]).
#[inline(always)]
fn scores_chunks<const F: bool, const K: usize>(
    a: &[f32],
    bt: &[f32],
    tp: usize,
    j0: usize,
    scale: f32,
    x: &mut [f32],
) {
    let mut acc = [[0f32; W]; K];
    for (c, &ac) in a.iter().enumerate() {
        let row = &bt[c * tp + j0..c * tp + j0 + K * W];
        for k in 0..K {
            for i in 0..W {
                acc[k][i] = simd::fma::<F>(ac, row[k * W + i], acc[k][i]);
            }
        }
    }
    for k in 0..K {
        let xs = &mut x[j0 + k * W..j0 + (k + 1) * W];
        for i in 0..W {
            xs[i] = acc[k][i] * scale;
        }
    }
}

/// `out[..d] = Σ_j w[j] · rows[j·d ..][..d]` over `w.len()` rows, four rows at a time into
/// independent accumulators (through memory, each row waited on the last one's store).
#[inline(always)]
fn weighted_rows<const F: bool>(w: &[f32], rows: &[f32], d: usize, out: &mut [f32]) {
    if d % W != 0 {
        out.fill(0.0);
        for (j, &wj) in w.iter().enumerate() {
            axpy::<F>(wj, &rows[j * d..(j + 1) * d], out);
        }
        return;
    }
    for c0 in (0..d).step_by(W) {
        let mut acc = [[0f32; W]; 4];
        let quads = w.len() / 4 * 4;
        for j in (0..quads).step_by(4) {
            for k in 0..4 {
                let r = &rows[(j + k) * d + c0..(j + k) * d + c0 + W];
                for i in 0..W {
                    acc[k][i] = simd::fma::<F>(w[j + k], r[i], acc[k][i]);
                }
            }
        }
        for (j, &wj) in w.iter().enumerate().skip(quads) {
            let r = &rows[j * d + c0..j * d + c0 + W];
            for i in 0..W {
                acc[0][i] = simd::fma::<F>(wj, r[i], acc[0][i]);
            }
        }
        let o = &mut out[c0..c0 + W];
        for i in 0..W {
            o[i] = (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]);
        }
    }
}

/// `y += a · x` over `y.len()` values.
#[inline(always)]
fn axpy<const F: bool>(a: f32, x: &[f32], y: &mut [f32]) {
    let split = y.len() / W * W;
    let (yh, yt) = y.split_at_mut(split);
    for (yc, xc) in yh.chunks_exact_mut(W).zip(x.chunks_exact(W)) {
        // Through a local array: the loop then vectorises (in place it stayed scalar).
        let mut acc = [0f32; W];
        acc.copy_from_slice(yc);
        for i in 0..W {
            acc[i] = simd::fma::<F>(a, xc[i], acc[i]);
        }
        yc.copy_from_slice(&acc);
    }
    for (yv, &xv) in yt.iter_mut().zip(&x[split..]) {
        *yv = simd::fma::<F>(a, xv, *yv);
    }
}

/// Softmax of `x[..n]` in place (unnormalised), returning the sum of its exponentials.
#[inline(always)]
fn exp_row<const F: bool>(x: &mut [f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let split = x.len() / L * L;
    for ch in x[..split].chunks_exact(L) {
        for i in 0..L {
            lanes[i] = if ch[i] > lanes[i] { ch[i] } else { lanes[i] };
        }
    }
    let mut mx = fold_lanes(lanes, |a, b| if a > b { a } else { b });
    for &v in &x[split..] {
        mx = mx.max(v);
    }
    let log2e = std::f32::consts::LOG2_E;
    let mut sums = [0f32; L];
    for ch in x[..split].chunks_exact_mut(L) {
        for i in 0..L {
            let e = simd::exp2_softmax::<F>((ch[i] - mx) * log2e);
            ch[i] = e;
            sums[i] += e;
        }
    }
    let mut sum = fold_lanes(sums, |a, b| a + b);
    for v in &mut x[split..] {
        let e = simd::exp2_softmax::<F>((*v - mx) * log2e);
        *v = e;
        sum += e;
    }
    sum
}

/// The forward of one head: `out` (`s × d`, rows `d` apart) = softmax(q·kᵀ·scale + bias)·v.
struct Forward<'a> {
    head: Head<'a>,
    shape: Shape,
    scale: f32,
    bias: Option<&'a [f32]>,
    ends: &'a [f32],
    row: &'a mut [f32],
    out: &'a mut [f32],
}

impl Task for Forward<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let Shape { s, t, d, .. } = self.shape;
        let tp = t.next_multiple_of(W);
        let h = &self.head;
        for i in 0..s {
            let valid = if self.bias.is_some() {
                self.ends[i] as usize
            } else {
                t
            };
            let n = valid.next_multiple_of(W);
            let x = &mut self.row[..n];
            let b = self.bias.map(|b| &b[i * t..(i + 1) * t]);
            scores_row::<F>(
                &h.q[i * d..(i + 1) * d],
                h.kt,
                tp,
                (valid, n),
                self.scale,
                b,
                x,
            );
            let inv = 1.0 / exp_row::<F>(x);
            let o = &mut self.out[i * d..(i + 1) * d];
            weighted_rows::<F>(x, h.v, d, o);
            o.iter_mut().for_each(|ov| *ov *= inv);
        }
    }
}

/// The backward of one head (see the module docs): `dq` (`s × d`), `dk` and `dv`
/// (`t × d`) from q, k, v and `dO`.
struct Backward<'a> {
    head: Head<'a>,
    d_out: &'a [f32],
    shape: Shape,
    scale: f32,
    bias: Option<&'a [f32]>,
    ends: &'a [f32],
    p: &'a mut [f32],
    dp: &'a mut [f32],
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
}

impl Task for Backward<'_> {
    type Output = ();
    #[inline(always)]
    fn run<const F: bool>(self) {
        let Shape { s, t, d, .. } = self.shape;
        let tp = t.next_multiple_of(W);
        let h = &self.head;
        self.dk[..tp * d].fill(0.0);
        self.dv[..tp * d].fill(0.0);
        for i in 0..s {
            let valid = if self.bias.is_some() {
                self.ends[i] as usize
            } else {
                t
            };
            let n = valid.next_multiple_of(W);
            let (p, dp) = (&mut self.p[..n], &mut self.dp[..n]);
            let b = self.bias.map(|b| &b[i * t..(i + 1) * t]);
            let qi = &h.q[i * d..(i + 1) * d];
            let doi = &self.d_out[i * d..(i + 1) * d];
            scores_row::<F>(qi, h.kt, tp, (valid, n), self.scale, b, p);
            let inv = 1.0 / exp_row::<F>(p);
            let mut dsum = [0f32; W];
            scores_row::<F>(doi, h.vt, tp, (n, n), 1.0, None, dp);
            for (pc, dc) in p.chunks_exact_mut(W).zip(dp.chunks_exact(W)) {
                for i in 0..W {
                    pc[i] *= inv;
                    dsum[i] = simd::fma::<F>(pc[i], dc[i], dsum[i]);
                }
            }
            let dsum: f32 = dsum.iter().sum();
            // dp becomes dS = P ⊙ (dP − D)·scale.
            for (dc, pc) in dp.chunks_exact_mut(W).zip(p.chunks_exact(W)) {
                for i in 0..W {
                    dc[i] = pc[i] * (dc[i] - dsum) * self.scale;
                }
            }
            weighted_rows::<F>(&dp[..valid], h.k, d, &mut self.dq[i * d..(i + 1) * d]);
            for j in 0..valid {
                axpy::<F>(dp[j], qi, &mut self.dk[j * d..(j + 1) * d]);
                axpy::<F>(p[j], doi, &mut self.dv[j * d..(j + 1) * d]);
            }
        }
    }
}

/// `c[r·ldc + j] = Σ_p a[r·ars + p·acs] · b[p·ldb + j]` for `r < MR`, `j < NV·W`: one
/// register block of a small product (MR × NV vectors of accumulators).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_block<const F: bool, const MR: usize, const NV: usize>(
    k: usize,
    (a, ars, acs): (&[f32], usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    let mut acc = [[[0f32; W]; NV]; MR];
    for p in 0..k {
        let brow = &b[p * ldb..p * ldb + NV * W];
        for (r, accr) in acc.iter_mut().enumerate() {
            let av = a[r * ars + p * acs];
            for (v, accv) in accr.iter_mut().enumerate() {
                for i in 0..W {
                    accv[i] = simd::fma::<F>(av, brow[v * W + i], accv[i]);
                }
            }
        }
    }
    for (r, accr) in acc.iter().enumerate() {
        for (v, accv) in accr.iter().enumerate() {
            c[r * ldc + v * W..r * ldc + (v + 1) * W].copy_from_slice(accv);
        }
    }
}

/// `C (m × n) = A (m × k) · B (k × n)`: A element `(r, p)` at `a[r·ars + p·acs]`, B and C
/// row-major (`ldb`, `ldc`); `n` a multiple of [`W`]. `k_of(r0, rows)`: the inner range
/// `k0..k1` for the block of rows from `r0` (A is zero outside it: products over a causal
/// prefix stop early, or start late).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm<const F: bool>(
    (m, n): (usize, usize),
    k_of: &dyn Fn(usize, usize) -> (usize, usize),
    (a, ars, acs): (&[f32], usize, usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    // One vector of columns at a time, up to eight rows: the accumulators stay in
    // registers (blocks several vectors wide were compiled with them in memory, 8× slower).
    macro_rules! blk {
        ($mr:literal, $k:expr, $a:expr, $b:expr, $c:expr) => {
            gemm_block::<F, $mr, 1>($k, $a, $b, $c)
        };
    }
    #[cfg(target_arch = "x86_64")]
    if W == 16 {
        // SAFETY: the ISA level never exceeds the detected one; the operands hold the
        // blocks `gemm` reads (checked once a block, not per element).
        match crate::simd::isa() {
            crate::simd::Isa::Avx512 => {
                unsafe { gemm_avx512((m, n), k_of, (a, ars, acs), (b, ldb), (c, ldc)) };
                return;
            }
            crate::simd::Isa::Avx2 => {
                unsafe { gemm_avx2((m, n), k_of, (a, ars, acs), (b, ldb), (c, ldc)) };
                return;
            }
            _ => {}
        }
    }
    let mut r0 = 0;
    while r0 < m {
        let mr = (m - r0).min(8);
        let (k0, k1) = k_of(r0, mr);
        let k = k1.saturating_sub(k0);
        if k == 0 {
            // A zero product (its range may start past the end of A and B).
            for r in r0..r0 + mr {
                c[r * ldc..r * ldc + n].fill(0.0);
            }
            r0 += mr;
            continue;
        }
        for j0 in (0..n).step_by(W) {
            let a_at = (&a[r0 * ars + k0 * acs..], ars, acs);
            let b_at = (&b[k0 * ldb + j0..], ldb);
            let c_at = (&mut c[r0 * ldc + j0..], ldc);
            match mr {
                1 => blk!(1, k, a_at, b_at, c_at),
                2 => blk!(2, k, a_at, b_at, c_at),
                3 => blk!(3, k, a_at, b_at, c_at),
                4 => blk!(4, k, a_at, b_at, c_at),
                5 => blk!(5, k, a_at, b_at, c_at),
                6 => blk!(6, k, a_at, b_at, c_at),
                7 => blk!(7, k, a_at, b_at, c_at),
                _ => blk!(8, k, a_at, b_at, c_at),
            }
        }
        r0 += mr;
    }
}

/// Floats of one worker's scratch: q, dO (s·d), k, v and their transposes (t·d each), a
/// head's bias (s·t) and row ends, two rows, dk and dv (t·d each).
fn worker_floats(sh: Shape) -> usize {
    let Shape { s, t, d, .. } = sh;
    let tp = t.next_multiple_of(W);
    let sp = s.next_multiple_of(W);
    let key_major = 4 * sp * d + 3 * tp * sp + sp / W + sp;
    2 * s * d + 4 * tp * d + s * t + s + 2 * tp + 2 * tp * d + key_major
}

/// Splits `n` floats off the front of `s`.
fn take<'a>(s: &mut &'a mut [f32], n: usize) -> &'a mut [f32] {
    let (a, b) = std::mem::take(s).split_at_mut(n);
    *s = b;
    a
}

/// Runs `forward` (`grads` None: `out` is `[batch, s, d]`) or the backward (`grads` = dO:
/// `out` is `[3, batch, s, d]`, dq then dk then dv) of every head, in parallel over heads.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch(
    (q, k, v): (Rows<'_>, Rows<'_>, Rows<'_>),
    d_out: Option<Rows<'_>>,
    bias: Option<(&AttentionBias, Rows<'_>)>,
    bufs: &[Storage],
    sh: Shape,
    scale: f32,
    arena: &mut Vec<f32>,
    out: &mut [f32],
) {
    let Shape { batch, s, t, d } = sh;
    let threads = crate::exec::par::threads();
    let workers = batch.min(2 * threads).max(1);
    let per = worker_floats(sh);
    // A bias every head shares is evaluated once, at the head of the arena.
    let shared = bias.filter(|(_, rows)| rows.shared());
    // Heads of a multiple of 16 run key-major ([`ForwardT`], [`BackwardT`]).
    let key_major = d % W == 0;
    let (sp, tp) = (s.next_multiple_of(W), t.next_multiple_of(W));
    let t_len = if key_major { tp * sp + sp / W } else { 0 };
    let head_len = if shared.is_some() || bias.is_none() {
        s * t + s + t_len
    } else {
        0
    };
    if arena.len() < head_len + workers * per {
        arena.resize(head_len + workers * per, 0.0);
    }
    let (head, rest) = arena.split_at_mut(head_len);
    let (shared_rows, head) = head.split_at_mut(head_len.min(s * t));
    let (shared_ends, head) = head.split_at_mut(head_len.min(s));
    let (shared_bt, shared_jn) = head.split_at_mut(head.len().min(tp * sp));
    if let Some((b, rows)) = shared {
        eval_bias(b, bufs, rows.head(0), (s, t), shared_rows, shared_ends);
    }
    if key_major && head_len > 0 {
        let b = shared.map(|_| &*shared_rows);
        transposed_bias(b, shared_ends, (s, t), shared_bt, shared_jn);
    }
    let (shared_rows, shared_ends): (&[f32], &[f32]) = (shared_rows, shared_ends);
    let (shared_bt, shared_jn): (&[f32], &[f32]) = (shared_bt, shared_jn);
    let arena_ptr = SendPtr(rest.as_mut_ptr());
    let out_ptr = SendPtr(out.as_mut_ptr());
    crate::exec::par::for_each(workers, |w| {
        let (arena_ptr, out_ptr) = (&arena_ptr, &out_ptr);
        // SAFETY: worker `w` owns floats `w·per ..` of the arena's tail, which holds
        // `workers · per` floats and is not otherwise touched during the loop.
        let mut scratch = unsafe { std::slice::from_raw_parts_mut(arena_ptr.0.add(w * per), per) };
        let tp = t.next_multiple_of(W);
        let (qh, doh) = (take(&mut scratch, s * d), take(&mut scratch, s * d));
        let (kh, kt) = (take(&mut scratch, tp * d), take(&mut scratch, tp * d));
        let (vh, vt) = (take(&mut scratch, tp * d), take(&mut scratch, tp * d));
        let brows = take(&mut scratch, s * t);
        let bends = take(&mut scratch, s);
        let (r1, r2) = (take(&mut scratch, tp), take(&mut scratch, tp));
        let (dk, dv) = (take(&mut scratch, tp * d), take(&mut scratch, tp * d));
        let (qp, qtt) = (take(&mut scratch, sp * d), take(&mut scratch, sp * d));
        let (dop, dot) = (take(&mut scratch, sp * d), take(&mut scratch, sp * d));
        let (own_bt, own_jn) = (take(&mut scratch, tp * sp), take(&mut scratch, sp / W));
        let (pt, dst) = (take(&mut scratch, tp * sp), take(&mut scratch, tp * sp));
        let inv = take(&mut scratch, sp);
        qp.fill(0.0);
        qtt.fill(0.0);
        dop.fill(0.0);
        dot.fill(0.0);
        // The padding keys (rows t.. of k and v, columns t.. of their transposes) stay 0.
        kh.fill(0.0);
        kt.fill(0.0);
        vh.fill(0.0);
        vt.fill(0.0);
        let use_shared = shared.is_some() || bias.is_none();
        let mut b = w;
        while b < batch {
            let (qo, qs) = q.head(b);
            let (ko, ks) = k.head(b);
            let (vo, vs) = v.head(b);
            // Key-major heads read k and v by rows and q padded (below); the row path also
            // needs q unpadded and k (v for the backward) transposed.
            let row_path = !key_major;
            if row_path {
                gather(q.data, qo, qs, (s, d), qh, None);
            }
            gather(k.data, ko, ks, (t, d), kh, row_path.then_some(&mut *kt));
            let vt_wanted = row_path && d_out.is_some();
            gather(v.data, vo, vs, (t, d), vh, vt_wanted.then_some(&mut *vt));
            let (brow, ends): (Option<&[f32]>, &[f32]) = match (bias, shared) {
                (Some(_), Some(_)) => (Some(shared_rows), shared_ends),
                (Some((bp, rows)), None) => {
                    eval_bias(bp, bufs, rows.head(b), (s, t), brows, bends);
                    (Some(&*brows), &*bends)
                }
                (None, _) => (None, &[]),
            };
            let head = Head {
                q: qh,
                k: kh,
                kt,
                v: vh,
                vt,
            };
            // Key-major heads: q padded and transposed, the transposed bias.
            let head_t = if key_major {
                gather(q.data, qo, qs, (s, d), qp, Some(&mut *qtt));
                let (bt, jn) = key_major_bias(
                    use_shared,
                    (shared_bt, shared_jn),
                    (brow, ends),
                    (s, t),
                    (&mut *own_bt, &mut *own_jn),
                );
                Some(HeadT {
                    q: qp,
                    qt: qtt,
                    k: kh,
                    v: vh,
                    bt,
                    jn,
                })
            } else {
                None
            };
            match &d_out {
                None => {
                    // SAFETY: batch index `b`'s rows of the output belong to this task only.
                    let o =
                        unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(b * s * d), s * d) };
                    if let Some(head) = head_t {
                        simd::run(ForwardT {
                            head,
                            shape: sh,
                            scale,
                            pt,
                            inv,
                            out: o,
                        });
                    } else {
                        simd::run(Forward {
                            head,
                            shape: sh,
                            scale,
                            bias: brow,
                            ends,
                            row: r1,
                            out: o,
                        });
                    }
                }
                Some(g) => {
                    let (go, gs) = g.head(b);
                    if head_t.is_none() {
                        gather(g.data, go, gs, (s, d), doh, None);
                    }
                    // SAFETY: as above; dq, dk and dv of `b` are disjoint slices of the
                    // `[3, batch, s, d]` output (s = t).
                    let part = |i: usize| unsafe {
                        std::slice::from_raw_parts_mut(
                            out_ptr.0.add((i * batch + b) * s * d),
                            s * d,
                        )
                    };
                    if let Some(head) = head_t {
                        gather(g.data, go, gs, (s, d), dop, Some(&mut *dot));
                        simd::run(BackwardT {
                            head,
                            d_out: dop,
                            d_out_t: dot,
                            shape: sh,
                            scale,
                            pt,
                            dst,
                            inv,
                            dq: part(0),
                            dk: part(1),
                            dv: part(2),
                        });
                    } else {
                        simd::run(Backward {
                            head,
                            d_out: doh,
                            shape: sh,
                            scale,
                            bias: brow,
                            ends,
                            p: r1,
                            dp: r2,
                            dq: part(0),
                            dk,
                            dv,
                        });
                        part(1).copy_from_slice(&dk[..t * d]);
                        part(2).copy_from_slice(&dv[..t * d]);
                    }
                }
            }
            b += workers;
        }
    });
}

/// Whether views over `[batch.., rows, d]` can be read by [`launch`]: unit stride along
/// `d`, non-negative strides and offset, unmasked.
pub(super) fn readable(view: &ResolvedView, nb: usize) -> bool {
    !view.masked
        && view.offset >= 0
        && view.strides.iter().all(|&st| st >= 0)
        && (view.dims[nb + 1] <= 1 || view.strides[nb + 1] == 1)
}

/// The stacked gradient `[dq, dk, dv]` of a self-attention (see the module docs and
/// `luminal::patterns::AttentionGrad`).
#[derive(Debug)]
pub struct AttentionGradKernel {
    /// q, k, v and dO, each over `[batch.., s, d]`.
    pub bufs: [BufId; 4],
    exprs: [ViewExprs; 4],
    views: [ResolvedView; 4],
    batch_dims: usize,
    pub scale: f32,
    pub bias: Option<AttentionBias>,
}

impl AttentionGradKernel {
    pub fn new(
        bufs: [BufId; 4],
        exprs: [ViewExprs; 4],
        batch_dims: usize,
        scale: f32,
        bias: Option<AttentionBias>,
    ) -> Self {
        AttentionGradKernel {
            bufs,
            exprs,
            views: Default::default(),
            batch_dims,
            scale,
            bias,
        }
    }
}

impl CpuKernel for AttentionGradKernel {
    fn reads(&self) -> Vec<BufId> {
        let mut r = self.bufs.to_vec();
        if let Some(b) = &self.bias {
            r.extend(b.program.reads());
        }
        r
    }
    fn remap(&mut self, map: &dyn Fn(BufId) -> BufId) {
        for b in &mut self.bufs {
            *b = map(*b);
        }
        if let Some(b) = &mut self.bias {
            b.program.remap(map);
        }
    }
    fn scratch(&self) -> Scratch {
        Scratch {
            instrs: self.bias.as_ref().map_or(0, |b| b.program.instrs.len()),
            ..Scratch::default()
        }
    }
    fn flops(&self, n: usize) -> usize {
        // n = 3·batch·s·d outputs; five products of 2·s·t·d per head.
        let t = self.views[0]
            .dims
            .get(self.batch_dims)
            .copied()
            .unwrap_or(0) as usize;
        n / 3 * 10 * t
    }

    fn run(&mut self, cx: RunCtx<'_>, out: &mut Storage) -> Result<()> {
        let nb = self.batch_dims;
        let mut data: [&[f32]; 4] = [&[]; 4];
        for i in 0..4 {
            self.exprs[i].resolve(cx.dims, &mut self.views[i])?;
            data[i] = match &cx.bufs[self.bufs[i]] {
                Storage::F32(v) => v.as_slice(),
                _ => return Err(backend_err("attention gradient: f32 operands")),
            };
            self.views[i].check_bounds(data[i].len())?;
            if !readable(&self.views[i], nb) {
                return Err(backend_err(
                    "attention gradient: q, k, v and dO need unit stride along d",
                ));
            }
        }
        let bias_view = match &mut self.bias {
            Some(b) => {
                b.program.prepare(cx.dims, cx.bufs)?;
                b.exprs.resolve(cx.dims, &mut b.view)?;
                b.view
                    .check_bounds(b.numel.eval(cx.dims)?.max(0) as usize)?;
                if !readable(&b.view, nb) {
                    return Err(backend_err(
                        "attention gradient: the bias must be read unmasked, keys adjacent",
                    ));
                }
                Some(())
            }
            None => None,
        };
        let dims = &self.views[0].dims;
        let (s, d) = (dims[nb] as usize, dims[nb + 1] as usize);
        let batch = dims[..nb].iter().product::<i64>() as usize;
        let Storage::F32(o) = out else {
            return Err(backend_err("attention gradient: f32 output"));
        };
        let o = &mut o[..cx.n];
        if batch * s * d == 0 {
            return Ok(());
        }
        let sh = Shape { batch, s, t: s, d };
        let op = |i: usize| Rows::of(data[i], &self.views[i], nb, nb);
        let bias = bias_view.and(
            self.bias
                .as_ref()
                .map(|b| (b, Rows::of(&[], &b.view, nb, nb))),
        );
        launch(
            (op(0), op(1), op(2)),
            Some(op(3)),
            bias,
            cx.bufs,
            sh,
            self.scale,
            cx.arena,
            o,
        );
        Ok(())
    }
}
