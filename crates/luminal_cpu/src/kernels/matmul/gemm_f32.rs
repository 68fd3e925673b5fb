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
        // A read in place (no packing) when it is row-major, or column-major and the
        // product is at most two column panels wide (`in_place`): a tile of A rows stays in
        // L1 while it meets every panel. Packing A cost 12-17% of a training step's
        // `1024 × 64 × 256` products, one thread (`cargo bench -p luminal_cpu --bench cpu`,
        // "train matmul"), and the attention products of a training step (64 × 16 and
        // 64 × 64 per head; the backward pass's `Pᵀ·dO` and `dSᵀ·Q` read A column-major),
        // and 10-15% of BERT's. No dependence on M, so a row's result does not depend on the
        // rows computed with it.
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
/// on kernels `nr` columns wide: it is row-major (any width), or column-major and the
/// product is at most two column panels wide.
///
/// Row-major A at any width: each `MR`-row tile of A (`MR · kc` floats, 12 KB) stays in L1
/// while it meets every column panel of the packed B slab (in L2), so packing A only
/// copies it. Zen 5, one thread, GFLOP/s packed → in place (`cargo bench -p luminal_cpu
/// --bench cpu`): BERT's `4096×1536×384` 212 → 241, `4096×384×1536` 203 → 238,
/// `4096×384×384` 216 → 236, `1024³` 232 → 231. A product of few rows and many columns
/// is computed transposed instead (`MatmulKernel::staging`), so that its large B is the
/// operand read in place.
fn in_place(n: usize, rs: isize, cs: isize, nr: usize) -> bool {
    (cs == 1 && rs > 0) || (rs == 1 && cs > 0 && n <= 2 * nr)
}

/// Whether a product of at most two column panels (`n ≤ 64`) on this CPU's kernel reads A
/// (row stride `rs`, K stride `cs`) in place rather than packing it (the AVX-512 kernel
/// only; A row- or column-major). `MatmulKernel::staging` computes a few-row product
/// transposed where its B would then be read in place and its A would not: the large
/// operand read in place, the small one packed.
pub(crate) fn reads_narrow_a_in_place(n: usize, rs: i64, cs: i64) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 {
        return n <= 64 && in_place(n, rs as isize, cs as isize, 32);
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
mod x86;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod timing;
