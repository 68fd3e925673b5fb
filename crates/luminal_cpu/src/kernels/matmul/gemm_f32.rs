//! Our f32 GEMM: `C = A·B` with packed operands and an AVX-512 or AVX2 register-tile
//! microkernel.
//!
//! Why not the `gemm` crate here: on stable Rust its x86 kernels stop at AVX2 (the AVX-512
//! ones need its `nightly` feature), so on an AVX-512 CPU it runs at half the FMA width, and
//! it allocates its packing buffers on every call (a training step would allocate once per
//! matmul). This one packs into per-thread buffers that only ever grow, and its AVX-512
//! microkernel uses the full vector width. Elsewhere (no AVX2, or another architecture) a
//! portable microkernel in plain Rust runs in the same blocking (the compiler vectorises it):
//! slower than the `gemm` crate's hand-written NEON, but with the one property the runtime
//! relies on that the crate does not give, a row's result independent of the rows computed
//! with it (the crate picks its K blocking from all three sizes, so a prefill of 10 tokens and
//! a full recompute of 34 differed in the last bits, and a q8_0 KV cache then rounded those
//! keys differently), and no allocation per product.
//!
//! Blocking, in the usual way: for each `NC`-column slab of B and `KC`-deep slice of K, B is
//! packed into `NR`-column panels (`[k][NR]`, zero-padded); for each `MC`-row block of A,
//! A is packed into `MR`-row panels (`[k][MR]`, zero-padded); the microkernel computes one
//! `MR × NR` tile of C over the `KC` slice in registers (vectors along N, A broadcast) and
//! adds it to C (the first slice overwrites). Summation order over K is fixed by the block
//! sizes, so results do not depend on the thread count.

use crate::simd::{isa, Isa};
use std::cell::RefCell;

const NC: usize = 1024;

/// The cache blocking of a product: `kc`-deep slices of K, `mc`-row blocks of A (the packed
/// A block, `mc × kc` floats, is meant to stay in L2). A schedule choice of the search
/// (`tiles=KCxMC`, see `search.rs`); results depend on `kc` (the summation order over K), not
/// on `mc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiles {
    pub kc: usize,
    pub mc: usize,
}

impl Tiles {
    /// The blocking every product uses unless a schedule says otherwise.
    pub const DEFAULT: Tiles = Tiles { kc: 256, mc: 144 };
}

impl Default for Tiles {
    fn default() -> Self {
        Tiles::DEFAULT
    }
}

/// How exactly f32 products are computed, as PyTorch's `torch.set_float32_matmul_precision`
/// says it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// f32 accuracy (the default): f32 FMAs, or on CPUs with AMX the six-piece bf16
    /// products that reach it (`amx/`).
    #[default]
    Highest,
    /// Each operand as two bf16 pieces, three piece products (~2⁻¹⁶ relative of the sum of
    /// magnitudes; PyTorch's `"high"`, its "bfloat16x3"), where AMX is present: ~1.8× the
    /// speed of `Highest` there. Elsewhere the same as `Highest`.
    High,
}

impl MatmulPrecision {
    /// `self`, unless `LUMINAL_MATMUL_PRECISION` says `highest` or `high`.
    pub(crate) fn resolved(self) -> MatmulPrecision {
        match std::env::var("LUMINAL_MATMUL_PRECISION").as_deref() {
            Ok("highest") => MatmulPrecision::Highest,
            Ok("high") => MatmulPrecision::High,
            _ => self,
        }
    }
}

thread_local! {
    /// Packed A block and B slab of this thread (grown on first use, then reused).
    static PACK: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// A strided f32 matrix operand: element `(r, c)` at `ptr + r·rs + c·cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

impl Mat {
    #[inline(always)]
    pub(crate) unsafe fn at(&self, r: usize, c: usize) -> f32 {
        *self.ptr.offset(r as isize * self.rs + c as isize * self.cs)
    }
}

/// Told that rows `r0..r1` × columns `c0..c1` of C (in the coordinates of the C a product
/// was given) hold their final values: a fused epilogue then runs over them while they are
/// in cache. Every element of C is reported exactly once per product; a product that falls
/// back from AMX to the SIMD kernel may report some blocks again, after computing them anew.
pub(crate) type Done<'a> = Option<&'a dyn Fn(usize, usize, usize, usize)>;

/// `C[m × n] = A[m × k] · B[k × n]`, C row-major with row stride `c_rs` (overwritten).
///
/// # Safety
/// Every element of A and B the strides address for the given sizes must be readable, the
/// `m × n` region of C (rows `c_rs` apart) writable and not aliased by A or B.
pub(crate) unsafe fn sgemm(m: usize, n: usize, k: usize, a: Mat, b: Mat, c: *mut f32, c_rs: usize) {
    sgemm_acc(m, n, k, a, b, c, c_rs, false)
}

/// Whether f32 products of `n` columns and depth `k` run on AMX ([`super::amx`]): the CPU
/// has it and both are at least `amx::MIN_DIM`. M plays no part, so among the products
/// that reach this GEMM a row's result does not depend on the rows computed with it (a
/// prefill of 10 tokens and one of 34 agree on the first 10); callers that split a product
/// pass the whole product's `n`. (Skinny products, M ≤ 8 with both operands contiguous
/// along K, take the skinny product, `skinny.rs`, at f32 accuracy whatever the
/// precision.)
pub(crate) fn amx_for(n: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return n >= super::amx::MIN_DIM && k >= super::amx::MIN_DIM && amx_active();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (n, k);
        false
    }
}

/// Whether large f32 products run on AMX here: the CPU has it, `LUMINAL_AMX` does not turn
/// it off and the instruction set is not capped below AVX-512.
pub(crate) fn amx_active() -> bool {
    #[cfg(target_arch = "x86_64")]
    return isa() == Isa::Avx512 && super::amx::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`sgemm`] with the given cache blocking, on AMX at the given precision (`amx`, where
/// [`amx_for`] said so for the whole product) or on the SIMD kernel (`None`).
///
/// # Safety
/// As [`sgemm`]; `amx` only where [`amx_for`] returned true.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_tiled(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
    tiles: Tiles,
    amx: Option<MatmulPrecision>,
    done: Done<'_>,
) {
    product(m, n, k, a, b, c, c_rs, false, tiles, amx, done)
}

/// [`sgemm`], adding the product to C instead when `accumulate` (`C += A·B`).
///
/// # Safety
/// As [`sgemm`]; with `accumulate`, C must also be initialised.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_acc(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
    accumulate: bool,
) {
    product(
        m,
        n,
        k,
        a,
        b,
        c,
        c_rs,
        accumulate,
        Tiles::DEFAULT,
        amx_for(n, k).then_some(MatmulPrecision::Highest),
        None,
    )
}

/// [`sgemm`] on the AVX-512/AVX2 kernel even where AMX would take it (for comparisons).
///
/// # Safety
/// As [`sgemm`].
#[cfg(test)]
pub(crate) unsafe fn sgemm_simd(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
) {
    match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => blocked::<12, 32>(
            m,
            n,
            k,
            a,
            b,
            c,
            c_rs,
            false,
            Kernel::Avx512,
            Tiles::DEFAULT,
            None,
        ),
        _ => product(m, n, k, a, b, c, c_rs, false, Tiles::DEFAULT, None, None),
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn product(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
    accumulate: bool,
    tiles: Tiles,
    amx: Option<MatmulPrecision>,
    done: Done<'_>,
) {
    if m == 0 || n == 0 || (k == 0 && accumulate) {
        return;
    }
    if k == 0 {
        for i in 0..m {
            std::slice::from_raw_parts_mut(c.add(i * c_rs), n).fill(0.0);
        }
        if let Some(done) = done {
            done(0, m, 0, n);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(precision), false) = (amx, accumulate) {
        if super::amx::sgemm(m, n, k, a, b, c, c_rs, precision, done) {
            return;
        }
        // An operand holds infinities, NaNs or values past bf16's range: the SIMD kernel
        // below gives f32's results for them.
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = amx;
    match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => blocked::<12, 32>(
            m,
            n,
            k,
            a,
            b,
            c,
            c_rs,
            accumulate,
            Kernel::Avx512,
            tiles,
            done,
        ),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => blocked::<6, 16>(
            m,
            n,
            k,
            a,
            b,
            c,
            c_rs,
            accumulate,
            Kernel::Avx2,
            tiles,
            done,
        ),
        _ => blocked::<PORTABLE_MR, PORTABLE_NR>(
            m,
            n,
            k,
            a,
            b,
            c,
            c_rs,
            accumulate,
            Kernel::Portable,
            tiles,
            done,
        ),
    }
}

#[derive(Clone, Copy)]
enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Plain Rust, `PORTABLE_MR × PORTABLE_NR` tiles ([`micro_portable`]).
    Portable,
}

/// The portable microkernel's tile: 16 accumulators of four lanes (NEON has 32 vector
/// registers, SSE 16).
const PORTABLE_MR: usize = 4;
const PORTABLE_NR: usize = 16;

/// Full-size packing buffers for products of `tiles` with `mr`-row micro-tiles (1.2 MB with
/// the default tiles), so that no later product of the same blocking, whatever its shape,
/// allocates.
fn grow_packs(pa: &mut Vec<f32>, pb: &mut Vec<f32>, tiles: Tiles, mr: usize) {
    let (kc, mc) = (tiles.kc.max(1), tiles.mc.max(1));
    if pb.len() < NC * kc {
        pb.resize(NC * kc, 0.0);
    }
    if pa.len() < mc.next_multiple_of(mr) * kc {
        pa.resize(mc.next_multiple_of(mr) * kc, 0.0);
    }
}

/// Grows the calling thread's packing buffers for SIMD products of `tiles`. Called on every
/// pool thread when a runtime is built: a worker may get its first block of a product in
/// any later run (tasks go to whichever thread claims them first), and would allocate then.
pub(crate) fn reserve_scratch(tiles: Tiles) {
    let mr = match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => 12,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => 6,
        _ => PORTABLE_MR,
    };
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (pa, pb) = &mut *pack;
        grow_packs(pa, pb, tiles, mr);
    });
}

#[allow(clippy::too_many_arguments)]
unsafe fn blocked<const MR: usize, const NR: usize>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
    accumulate: bool,
    kernel: Kernel,
    tiles: Tiles,
    done: Done<'_>,
) {
    let (kc_max, mc_max) = (tiles.kc.max(1), tiles.mc.max(1));
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (pa, pb) = &mut *pack;
        grow_packs(pa, pb, tiles, MR);
        let mut tile = [0f32; 12 * 32];
        // A read in place (no packing) when it is row-major or column-major and the product
        // is at most two column panels wide: a tile of A rows then meets both panels while
        // it is in L1, and packing A (each value then feeds at most 64 columns) costs a
        // large part of the product — 12-17% of a training step's `1024 × 64 × 256`
        // products, one thread (`cargo bench -p luminal_cpu --bench cpu`, "train matmul"),
        // and the attention products of a training step (64 × 16 and 64 × 64 per head; the
        // backward pass's `Pᵀ·dO` and `dSᵀ·Q` read A column-major). No dependence on M, so a
        // row's result does not depend on the rows computed with it.
        #[cfg(target_arch = "x86_64")]
        let direct_a = is_avx512(kernel) && in_place(n, a.rs, a.cs, NR);
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(kc_max) {
                let kc = kc_max.min(k - pc);
                pack_b::<NR>(b, pc, kc, jc, nc, pb);
                #[cfg(target_arch = "x86_64")]
                if direct_a {
                    // The kernels read A in place: each `MR`-row tile of A meets every
                    // column panel while it is in L1, and each `mc`-row block of C is
                    // finished (and its epilogue run) while it is in cache.
                    for ic in (0..m).step_by(mc_max) {
                        let mc = mc_max.min(m - ic);
                        for ir in (ic..ic + mc).step_by(MR) {
                            let rows = MR.min(ic + mc - ir);
                            let ap = a.ptr.offset(ir as isize * a.rs + pc as isize * a.cs);
                            for jr in (0..nc).step_by(NR) {
                                let cols = NR.min(nc - jr);
                                let bp = pb.as_ptr().add(jr * kc);
                                let dst = c.add(ir * c_rs + jc + jr);
                                let first = pc == 0 && !accumulate;
                                x86::cut_avx512(
                                    kc,
                                    ap,
                                    Some((a.rs as usize, a.cs as usize)),
                                    bp,
                                    dst,
                                    c_rs,
                                    first,
                                    rows,
                                    cols,
                                );
                            }
                        }
                        if let (Some(done), true) = (done, pc + kc == k) {
                            done(ic, ic + mc, jc, jc + nc);
                        }
                    }
                    continue;
                }
                for ic in (0..m).step_by(mc_max) {
                    let mc = mc_max.min(m - ic);
                    pack_a::<MR>(a, ic, mc, pc, kc, pa);
                    for jr in (0..nc).step_by(NR) {
                        let cols = NR.min(nc - jr);
                        let bp = pb.as_ptr().add(jr * kc);
                        for ir in (0..mc).step_by(MR) {
                            let rows = MR.min(mc - ir);
                            let ap = pa.as_ptr().add(ir * kc);
                            let dst = c.add((ic + ir) * c_rs + jc + jr);
                            let first = pc == 0 && !accumulate;
                            if rows == MR && cols == NR {
                                micro(kernel, kc, ap, bp, dst, c_rs, first);
                            } else if is_avx512(kernel) {
                                #[cfg(target_arch = "x86_64")]
                                x86::cut_avx512(kc, ap, None, bp, dst, c_rs, first, rows, cols);
                            } else {
                                // Edge tile: computed whole into `tile`, its valid part
                                // written out.
                                micro(kernel, kc, ap, bp, tile.as_mut_ptr(), NR, true);
                                for i in 0..rows {
                                    let d = dst.add(i * c_rs);
                                    for j in 0..cols {
                                        let v = tile[i * NR + j];
                                        *d.add(j) = if first { v } else { *d.add(j) + v };
                                    }
                                }
                            }
                        }
                    }
                    if let (Some(done), true) = (done, pc + kc == k) {
                        done(ic, ic + mc, jc, jc + nc);
                    }
                }
            }
        }
    })
}

/// Whether A (row stride `rs`, K stride `cs`) is read in place by a product of `n` columns
/// on kernels `nr` columns wide: it is row- or column-major and the product is at most two
/// column panels wide.
fn in_place(n: usize, rs: isize, cs: isize, nr: usize) -> bool {
    ((cs == 1 && rs > 0) || (rs == 1 && cs > 0)) && n <= 2 * nr
}

/// Whether a product of `n` columns on this CPU's kernel reads A (row stride `rs`, K
/// stride `cs`) in place rather than packing it (the AVX-512 kernel only).
pub(crate) fn reads_a_in_place(n: usize, rs: i64, cs: i64) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 {
        return in_place(n, rs as isize, cs as isize, 32);
    }
    let _ = (n, rs, cs);
    false
}

/// Whether `kernel` is the AVX-512 one (never elsewhere than x86-64).
#[inline(always)]
fn is_avx512(kernel: Kernel) -> bool {
    #[cfg(target_arch = "x86_64")]
    return matches!(kernel, Kernel::Avx512);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let Kernel::Portable = kernel;
        false
    }
}

#[inline(always)]
unsafe fn micro(
    kernel: Kernel,
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    c: *mut f32,
    c_rs: usize,
    overwrite: bool,
) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => x86::micro_avx512(kc, ap, bp, c, c_rs, overwrite),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => x86::micro_avx2(kc, ap, bp, c, c_rs, overwrite),
        Kernel::Portable => micro_portable(kc, ap, bp, c, c_rs, overwrite),
    }
}

/// The portable microkernel: the `PORTABLE_MR × PORTABLE_NR` tile of C over `kc` packed
/// steps (`ap`: `[kc][MR]`, `bp`: `[kc][NR]`), accumulated in order along K in a local array
/// the compiler keeps in vector registers; stored over C (`overwrite`) or added to it.
///
/// # Safety
/// `ap` and `bp` must hold `kc` packed steps; the tile's rows of C (`c_rs` apart, `NR`
/// each) must be writable.
#[inline(never)]
unsafe fn micro_portable(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    c: *mut f32,
    c_rs: usize,
    overwrite: bool,
) {
    const MR: usize = PORTABLE_MR;
    const NR: usize = PORTABLE_NR;
    /// `a·b + c`, fused where the target has a fused multiply-add instruction (a call into
    /// libm otherwise).
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        #[cfg(any(target_arch = "aarch64", target_feature = "fma"))]
        return a.mul_add(b, c);
        #[cfg(not(any(target_arch = "aarch64", target_feature = "fma")))]
        return a * b + c;
    }
    let mut acc = [[0f32; NR]; MR];
    let (a, b) = (
        std::slice::from_raw_parts(ap, kc * MR),
        std::slice::from_raw_parts(bp, kc * NR),
    );
    for (av, bv) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for (row, &x) in acc.iter_mut().zip(av) {
            for (s, &y) in row.iter_mut().zip(bv) {
                *s = madd(x, y, *s);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        let d = std::slice::from_raw_parts_mut(c.add(i * c_rs), NR);
        if overwrite {
            d.copy_from_slice(row);
        } else {
            for (o, &v) in d.iter_mut().zip(row) {
                *o += v;
            }
        }
    }
}

/// Packs `B[pc..pc+kc, jc..jc+nc]` into `NR`-column panels, each `[kc][NR]`, zero-padded.
unsafe fn pack_b<const NR: usize>(
    b: Mat,
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    out: &mut [f32],
) {
    for (p, jr) in (0..nc).step_by(NR).enumerate() {
        let cols = NR.min(nc - jr);
        let panel = &mut out[p * NR * kc..(p + 1) * NR * kc];
        if b.cs == 1 {
            for kk in 0..kc {
                let src = b.ptr.offset((pc + kk) as isize * b.rs + (jc + jr) as isize);
                let row = &mut panel[kk * NR..(kk + 1) * NR];
                if cols == NR {
                    // A whole panel row: a fixed-size copy (vector moves, not a memcpy call).
                    *<&mut [f32; NR]>::try_from(row).unwrap_unchecked() =
                        *(src as *const [f32; NR]);
                } else {
                    row[..cols].copy_from_slice(std::slice::from_raw_parts(src, cols));
                    row[cols..].fill(0.0);
                }
            }
        } else {
            // Column-contiguous (a transposed weight): read each column along K, four
            // columns × four K steps at a time through a 4×4 transpose where the columns
            // are contiguous along K.
            let quads = if b.rs == 1 { cols / 4 } else { 0 };
            let k4 = kc / 4 * 4;
            for q in 0..quads {
                let src = b
                    .ptr
                    .offset(pc as isize + (jc + jr + 4 * q) as isize * b.cs);
                for kk in (0..k4).step_by(4) {
                    transpose4(
                        src.add(kk),
                        b.cs,
                        panel.as_mut_ptr().add(kk * NR + 4 * q),
                        NR,
                    );
                }
            }
            for j in 0..NR {
                if j < 4 * quads {
                    for kk in k4..kc {
                        panel[kk * NR + j] = b.at(pc + kk, jc + jr + j);
                    }
                } else if j < cols {
                    for kk in 0..kc {
                        panel[kk * NR + j] = b.at(pc + kk, jc + jr + j);
                    }
                } else {
                    for kk in 0..kc {
                        panel[kk * NR + j] = 0.0;
                    }
                }
            }
        }
    }
}

/// Packs `A[ic..ic+mc, pc..pc+kc]` into `MR`-row panels, each `[kc][MR]`, zero-padded.
unsafe fn pack_a<const MR: usize>(
    a: Mat,
    ic: usize,
    mc: usize,
    pc: usize,
    kc: usize,
    out: &mut [f32],
) {
    if a.rs == 1 {
        // Column-major A (a transposed activation, as in a weight gradient `Xᵀ·dY`): at
        // one K step the block's `mc` values are contiguous. K outermost, so each such run
        // is read once, front to back, and dealt out to the panels (panel-outer reading
        // fetched the lines two panels share twice, at a stride that keeps few of them in
        // L1).
        let panels = mc.div_ceil(MR);
        for kk in 0..kc {
            let src = std::slice::from_raw_parts(
                a.ptr.offset(ic as isize + (pc + kk) as isize * a.cs),
                mc,
            );
            for p in 0..panels {
                let dst = &mut out[p * MR * kc + kk * MR..p * MR * kc + (kk + 1) * MR];
                let ir = p * MR;
                if ir + MR <= mc {
                    let chunk: &[f32; MR] = src[ir..ir + MR].try_into().unwrap_unchecked();
                    *<&mut [f32; MR]>::try_from(dst).unwrap_unchecked() = *chunk;
                } else {
                    let rows = mc - ir;
                    dst[..rows].copy_from_slice(&src[ir..]);
                    dst[rows..].fill(0.0);
                }
            }
        }
        return;
    }
    for (p, ir) in (0..mc).step_by(MR).enumerate() {
        let rows = MR.min(mc - ir);
        let panel = &mut out[p * MR * kc..(p + 1) * MR * kc];
        if rows == MR && a.cs == 1 && MR % 4 == 0 {
            // Row-major A: 4×4 transposes of four rows × four K steps, the rest of K
            // element by element.
            let k4 = kc / 4 * 4;
            for g in 0..MR / 4 {
                let src = a
                    .ptr
                    .offset((ic + ir + 4 * g) as isize * a.rs + pc as isize);
                for kk in (0..k4).step_by(4) {
                    transpose4(
                        src.add(kk),
                        a.rs,
                        panel.as_mut_ptr().add(kk * MR + 4 * g),
                        MR,
                    );
                }
            }
            for i in 0..MR {
                for kk in k4..kc {
                    panel[kk * MR + i] = a.at(ic + ir + i, pc + kk);
                }
            }
            continue;
        }
        for i in 0..MR {
            if i < rows {
                let r = ic + ir + i;
                if a.cs == 1 {
                    let src = std::slice::from_raw_parts(
                        a.ptr.offset(r as isize * a.rs + pc as isize),
                        kc,
                    );
                    for (kk, &v) in src.iter().enumerate() {
                        panel[kk * MR + i] = v;
                    }
                } else {
                    for kk in 0..kc {
                        panel[kk * MR + i] = a.at(r, pc + kk);
                    }
                }
            } else {
                for kk in 0..kc {
                    panel[kk * MR + i] = 0.0;
                }
            }
        }
    }
}

/// Writes the transpose of the 4×4 block whose row `r` is the four floats at
/// `src + r·src_stride` to the four rows `dst + c·dst_stride`.
///
/// # Safety
/// The four source rows (4 floats each) must be readable and the four destination rows
/// writable.
#[inline(always)]
unsafe fn transpose4(src: *const f32, src_stride: isize, dst: *mut f32, dst_stride: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        // SSE is part of x86-64: no feature detection needed.
        let r0 = _mm_loadu_ps(src);
        let r1 = _mm_loadu_ps(src.offset(src_stride));
        let r2 = _mm_loadu_ps(src.offset(2 * src_stride));
        let r3 = _mm_loadu_ps(src.offset(3 * src_stride));
        let t0 = _mm_unpacklo_ps(r0, r1);
        let t1 = _mm_unpacklo_ps(r2, r3);
        let t2 = _mm_unpackhi_ps(r0, r1);
        let t3 = _mm_unpackhi_ps(r2, r3);
        _mm_storeu_ps(dst, _mm_movelh_ps(t0, t1));
        _mm_storeu_ps(dst.add(dst_stride), _mm_movehl_ps(t1, t0));
        _mm_storeu_ps(dst.add(2 * dst_stride), _mm_movelh_ps(t2, t3));
        _mm_storeu_ps(dst.add(3 * dst_stride), _mm_movehl_ps(t3, t2));
    }
    #[cfg(not(target_arch = "x86_64"))]
    for r in 0..4 {
        for c in 0..4 {
            *dst.add(c * dst_stride + r) = *src.offset(r as isize * src_stride + c as isize);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    c[i * n + j] += a[i * k + kk] as f64 * b[kk * n + j] as f64;
                }
            }
        }
        c
    }

    fn vals(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(747796405).wrapping_add(2891336453);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(747796405).wrapping_add(2891336453);
                ((s >> 9) as f32 / (1u32 << 23) as f32) - 0.5
            })
            .collect()
    }

    /// `sgemm_acc` on slices: operands as (data, row stride, column stride).
    fn product(
        (m, n, k): (usize, usize, usize),
        (a, a_rs, a_cs): (&[f32], usize, usize),
        (b, b_rs, b_cs): (&[f32], usize, usize),
        c: &mut [f32],
        c_rs: usize,
        accumulate: bool,
    ) {
        assert!(c.len() >= (m - 1) * c_rs + n);
        let mat = |p: &[f32], rs: usize, cs: usize| Mat {
            ptr: p.as_ptr(),
            rs: rs as isize,
            cs: cs as isize,
        };
        // SAFETY: the strides address `m × k` / `k × n` elements inside `a` / `b` (the test
        // builds them so), and `c` holds the `m × n` output rows `c_rs` apart (asserted).
        unsafe {
            sgemm_acc(
                m,
                n,
                k,
                mat(a, a_rs, a_cs),
                mat(b, b_rs, b_cs),
                c.as_mut_ptr(),
                c_rs,
                accumulate,
            )
        }
    }

    /// Every level the CPU has, edge tiles in M, N and K, strided and transposed operands.
    #[test]
    fn matches_a_naive_product() {
        let levels = [Isa::Generic, Isa::Avx2, Isa::Avx512];
        let before = isa();
        for &level in &levels {
            if crate::simd::set_max_isa(level) != level {
                continue;
            }
            for &(m, n, k) in &[
                (1, 1, 1),
                (5, 7, 3),
                (16, 32, 256),
                (17, 33, 257),
                (150, 70, 300),
                (40, 1030, 20),
                (3, 2049, 9),
                // At most 64 columns: A is read in place (row- or column-major), in
                // row blocks (tall ones: several blocks, a partial last tile, K slices).
                (64, 16, 64),
                (30, 64, 100),
                (7, 40, 520),
                (300, 64, 70),
                (1030, 40, 300),
            ] {
                let a = vals(m * k, 1);
                let b = vals(k * n, 2);
                let want = naive(m, n, k, &a, &b);
                // Row-major A and B.
                let mut c = vec![f32::NAN; m * n];
                product((m, n, k), (&a, k, 1), (&b, n, 1), &mut c, n, false);
                // Transposed storage of both (A column-major, B as Bᵀ row-major), output
                // with a row stride wider than n.
                let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
                let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
                let mut c2 = vec![f32::NAN; m * (n + 3)];
                product((m, n, k), (&at, 1, m), (&bt, 1, k), &mut c2, n + 3, false);
                // Accumulating into the first result doubles it.
                let mut c3 = c.clone();
                product((m, n, k), (&a, k, 1), (&b, n, 1), &mut c3, n, true);
                for i in 0..m * n {
                    let w = 2.0 * want[i];
                    assert!(
                        (c3[i] as f64 - w).abs() <= 2e-5 * (k as f64).sqrt() + 2e-6,
                        "{level:?} {m}×{n}×{k} accumulate [{i}]: {} vs {w}",
                        c3[i]
                    );
                }
                for i in 0..m {
                    for j in 0..n {
                        let w = want[i * n + j];
                        let tol = 1e-5 * (k as f64).sqrt() + 1e-6;
                        for (got, what) in [
                            (c[i * n + j], "row-major"),
                            (c2[i * (n + 3) + j], "transposed"),
                        ] {
                            assert!(
                                (got as f64 - w).abs() <= tol,
                                "{level:?} {m}×{n}×{k} {what} [{i},{j}]: {got} vs {w}"
                            );
                        }
                    }
                }
            }
        }
        crate::simd::set_max_isa(before);
    }

    /// A row's result does not depend on how many rows are computed with it, at every
    /// level: the first 10 rows of a 34-row product equal a 10-row product bit for bit (a
    /// prefill of 10 tokens against a full recompute; with a quantized KV cache a last-bit
    /// difference can move a key across a rounding boundary). Shapes include a quantized
    /// product's decoded tile (n = 16, K = 1536), products whose A is read in place (at most
    /// 64 columns) and one whose A is packed (80 columns).
    #[test]
    fn rows_do_not_depend_on_the_rows_beside_them() {
        let before = isa();
        for level in [Isa::Generic, Isa::Avx2, Isa::Avx512] {
            if crate::simd::set_max_isa(level) != level {
                continue;
            }
            for &(n, k) in &[(16, 1536), (40, 300), (64, 576), (33, 257), (80, 300)] {
                let a = vals(34 * k, 3);
                let b = vals(k * n, 4);
                // B row-major, and as Bᵀ row-major (a weight's rows, as the quantized
                // products decode them).
                for (b_rs, b_cs) in [(n, 1), (1, k)] {
                    let mut all = vec![f32::NAN; 34 * n];
                    let mut few = vec![f32::NAN; 10 * n];
                    product((34, n, k), (&a, k, 1), (&b, b_rs, b_cs), &mut all, n, false);
                    product((10, n, k), (&a, k, 1), (&b, b_rs, b_cs), &mut few, n, false);
                    let same = all[..10 * n]
                        .iter()
                        .zip(&few)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{level:?} n {n} k {k} B strides ({b_rs}, {b_cs}): 10 rows differ from the first 10 of 34"
                    );
                }
            }
        }
        crate::simd::set_max_isa(before);
    }
}

#[cfg(test)]
mod scaling {
    use super::*;

    /// One product on 1 and 2 threads of a pool, split along N as `MatmulKernel::run_f32`
    /// splits it (`cargo test --release -p luminal_cpu --lib gemm_scaling -- --ignored
    /// --nocapture`).
    #[test]
    #[ignore]
    fn gemm_scaling() {
        for &(m, n, k) in &[(4096, 1536, 384), (4096, 384, 1536), (4096, 384, 384)] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect();
            let c = vec![0f32; m * n];
            let cp = crate::kernels::matmul::skinny::OutPtr(c.as_ptr() as *mut f32);
            for (threads, colmajor) in [(1usize, false), (2, false), (1, true), (2, true)] {
                let pool = crate::exec::par::Pool::new(threads).unwrap();
                let run = || {
                    pool.enter(|| {
                        let w = n.div_ceil(threads).next_multiple_of(16);
                        crate::exec::par::for_each(n.div_ceil(w), |t| {
                            let cp = &cp;
                            let (j0, j1) = (t * w, ((t + 1) * w).min(n));
                            unsafe {
                                sgemm(
                                    m,
                                    j1 - j0,
                                    k,
                                    Mat {
                                        ptr: a.as_ptr(),
                                        rs: k as isize,
                                        cs: 1,
                                    },
                                    if colmajor {
                                        // B as a transposed [n, k] weight: (r, c) at c·k + r.
                                        Mat {
                                            ptr: b.as_ptr().add(j0 * k),
                                            rs: 1,
                                            cs: k as isize,
                                        }
                                    } else {
                                        Mat {
                                            ptr: b.as_ptr().add(j0),
                                            rs: n as isize,
                                            cs: 1,
                                        }
                                    },
                                    cp.0.add(j0),
                                    n,
                                )
                            }
                        })
                    })
                };
                run();
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t = std::time::Instant::now();
                    run();
                    best = best.min(t.elapsed().as_secs_f64());
                }
                println!(
                    "{m}x{n}x{k} {threads} thread(s), B {}: {:.2} ms, {:.0} GFLOP/s",
                    if colmajor { "[n, k]" } else { "[k, n]" },
                    best * 1e3,
                    2.0 * (m * n * k) as f64 / best / 1e9
                );
            }
        }
    }
}

#[cfg(test)]
mod small {
    use super::*;

    /// One thread, the attention products of a small training step (64 queries, 16-wide
    /// heads): `cargo test --release -p luminal_cpu --lib gemm_small -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn gemm_small() {
        // (m, n, k, A row stride, A col stride, B row stride, B col stride)
        let cases: &[(usize, usize, usize, isize, isize, isize, isize, &str)] = &[
            (64, 64, 16, 192, 1, 1, 192, "scores q·kᵀ"),
            (64, 16, 64, 64, 1, 192, 1, "probs·v"),
            (64, 64, 64, 64, 1, 64, 1, "64³ row-major"),
            // The backward pass: A column-major (`Pᵀ·dO`, `dSᵀ·Q`).
            (64, 16, 64, 1, 64, 192, 1, "probsᵀ·dout"),
        ];
        for &(m, n, k, ars, acs, brs, bcs, what) in cases {
            let a: Vec<f32> = (0..64 * 192).map(|i| (i % 17) as f32 * 0.1).collect();
            let b: Vec<f32> = (0..64 * 192).map(|i| (i % 13) as f32 * 0.1).collect();
            let mut c = vec![0f32; m * n];
            let reps = 20000;
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    unsafe {
                        sgemm(
                            m,
                            n,
                            k,
                            Mat {
                                ptr: a.as_ptr(),
                                rs: ars,
                                cs: acs,
                            },
                            Mat {
                                ptr: b.as_ptr(),
                                rs: brs,
                                cs: bcs,
                            },
                            c.as_mut_ptr(),
                            n,
                        )
                    };
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            println!(
                "{what} {m}x{n}x{k}: {:.2} us, {:.1} GFLOP/s",
                best * 1e6,
                2.0 * (m * n * k) as f64 / best / 1e9
            );
        }
    }
}
