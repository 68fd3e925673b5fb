//! f32 products on Intel AMX tiles (Sapphire Rapids and later), at f32 accuracy or at
//! PyTorch's "high" precision.
//!
//! AMX multiplies bf16 pairs into f32 accumulators (`tdpbf16ps`: a 16×16 f32 tile += a 16×32
//! bf16 tile · a 32×16 bf16 tile) at ~2.8 TFLOP/s a core here, against ~0.2 for AVX-512 f32
//! FMAs. bf16 keeps 8 bits of a float's 24, so each f32 operand is split into three bf16
//! pieces, `x = h + m + l` (`h = bf16(x)`, `m = bf16(x − h)`, `l = bf16(x − h − m)`: 24 bits),
//! and the product is the sum of the six piece products down to 2⁻¹⁶ of the leading one
//! (`hh, hm, mh, hl, lh, mm`; the dropped `ml, lm, ll` are ≤ 2⁻²⁴ relative, f32's own
//! rounding), accumulated in f32 — the "bf16x6" scheme of oneDNN's f32-on-AMX mode
//! ([`sgemm`] at `MatmulPrecision::Highest`). At `High` it keeps `hh, hm, mh` over two pieces
//! (~2⁻¹⁶ relative: PyTorch's "high" float32 matmul precision, its "bfloat16x3").
//!
//! Layout: A is packed into 16-row panels of 32-value K blocks (a tile each: 16 rows × 64
//! bytes), B into 16-column panels of 32-value K blocks in AMX's pair-interleaved layout
//! (tile row `p` holds `B[2p][j], B[2p+1][j]` for the 16 columns `j`), one copy per piece,
//! K zero-padded to a multiple of 32 and rows/columns to 16, in buffers aligned to cache
//! lines (a tile row split across two lines loads at a third of the rate). A 32 × 32 block
//! of C lives in four accumulator tiles; per K block and B piece, the two B tiles are loaded
//! once for every A piece paired with them (18 tile loads for 24 products in the six-piece
//! form). Tile loads, not products, bound the kernel, so the blocking keeps them in cache:
//! column blocks whose K chunk of packed B fits [`B_CHUNK_BYTES`], row blocks of
//! [`M_PANELS`] panels whose accumulators stay in L2 between K chunks (24 KiB of A pieces per
//! chunk and panel pair, in L1 while the column panels sweep it). K is summed in the same
//! order whatever the split over threads.
//!
//! Used by `gemm_f32::sgemm` for products of at least [`MIN_DIM`] columns and depth where
//! the CPU has AMX-BF16 and the kernel grants the tile state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`); `LUMINAL_AMX=0` keeps every product on AVX-512.
//! One thread, BERT's products: the six-piece form 1.2–1.45× the AVX-512 kernel, the
//! three-piece form 2.0–2.7× (`benches/README.md`).

use super::gemm_f32::{Mat, MatmulPrecision};
use crate::kernels::quant::span_acts::Aligned;
use std::arch::asm;
use std::cell::RefCell;
use std::sync::OnceLock;

/// Products with fewer columns (N) or a shallower K than this stay on the AVX-512 kernel:
/// splitting and packing the operands into pieces then costs about what AMX saves (the
/// tiny GPT's K = 64 and N = 64 products made its training step 10% slower at 32).
pub(crate) const MIN_DIM: usize = 128;

/// Whether products go to AMX: the hardware and OS allow it ([`hardware`]) and
/// `LUMINAL_AMX` is not `0`.
pub(crate) fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("LUMINAL_AMX").map_or(true, |v| v != "0") && hardware())
}

/// Whether AMX-BF16 can be used here: CPUID says so, the OS enables the tile state (XCR0
/// bits 17 and 18) and grants it to this process.
pub(crate) fn hardware() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    // CPUID leaf 7 EDX bit 22: AMX-BF16.
    *OK.get_or_init(|| cpuid7_edx() >> 22 & 1 == 1 && tiles_granted())
}

/// Whether AMX-INT8 can be used here (CPUID leaf 7 EDX bit 25, and the tile state as
/// [`hardware`]).
pub(crate) fn int8_hardware() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpuid7_edx() >> 25 & 1 == 1 && tiles_granted())
}

/// [`set_amx_int8`]'s setting: 0 follows `LUMINAL_AMX`, 1 keeps the int8 products off
/// AMX, 2 lets them use it (the f32 kernel is not affected).
static INT8_OVERRIDE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Overrides `LUMINAL_AMX` for the int8 products (process-wide; for tests and benchmarks
/// comparing paths).
pub fn set_amx_int8(on: Option<bool>) {
    let v = match on {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    INT8_OVERRIDE.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Whether wide int8 products (prefill with block-quantized weights) run on AMX-INT8
/// tiles: the CPU and OS allow it ([`int8_hardware`]) and `LUMINAL_AMX` is not `0`. On by
/// default (unlike the f32 kernel): 3× the AVX-512 VNNI kernel's rate here.
pub(crate) fn int8_available() -> bool {
    static ENV: OnceLock<bool> = OnceLock::new();
    let asked = match INT8_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => *ENV.get_or_init(|| std::env::var("LUMINAL_AMX").map_or(true, |v| v != "0")),
    };
    asked && int8_hardware()
}

/// CPUID leaf 7, sub-leaf 0, EDX (0 where leaf 7 does not exist).
fn cpuid7_edx() -> u32 {
    use std::arch::x86_64::__cpuid_count;
    if __cpuid_count(0, 0).eax < 7 {
        return 0;
    }
    __cpuid_count(7, 0).edx
}

/// Whether the OS enables the tile state (XCR0 bits 17 and 18) and grants it to this
/// process (asked once).
fn tiles_granted() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // SAFETY: CPUID leaf 1 and (where OSXSAVE is set) XGETBV are available on every
        // x86_64 CPU that reports them; the syscall only requests a permission.
        unsafe {
            use std::arch::x86_64::{__cpuid_count, _xgetbv};
            let tile = cpuid7_edx() >> 24 & 1 == 1;
            let osxsave = __cpuid_count(1, 0).ecx >> 27 & 1 == 1;
            if !(tile && osxsave) {
                return false;
            }
            if _xgetbv(0) >> 17 & 3 != 3 {
                return false;
            }
            // The permission request below is Linux's system call.
            if cfg!(not(target_os = "linux")) {
                return false;
            }
            // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux asks each process to
            // request the (large) tile state before using it.
            let ret: i64;
            asm!(
                "syscall",
                inlateout("rax") 158i64 => ret,
                in("rdi") 0x1023i64,
                in("rsi") 18i64,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack)
            );
            ret == 0
        }
    })
}

/// The three bf16 pieces of `x` (as raw bits): `x ≈ h + m + l` to 24 bits.
#[inline(always)]
fn split(x: f32) -> [u16; 3] {
    let h = bf16(x);
    if !x.is_finite() {
        return [h, 0, 0];
    }
    let r = x - f32::from_bits((h as u32) << 16);
    let m = bf16(r);
    let r = r - f32::from_bits((m as u32) << 16);
    [h, m, bf16(r)]
}

/// `x` rounded to bf16 (nearest, ties to even), as bits; finite inputs.
#[inline(always)]
fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) as u16 | 0x40;
    }
    (b.wrapping_add(0x7fff + (b >> 16 & 1)) >> 16) as u16
}

type Buffers = (Aligned<u16>, Aligned<u16>, Aligned<f32>);

thread_local! {
    /// This thread's packed pieces of B (a column block) and of A (a row group), and its C
    /// accumulators (grown, never shrunk), aligned to cache lines: a tile row that splits two lines loads at a third
    /// of the rate (tile loads, not products, bound this kernel).
    static PACK: RefCell<Buffers> = RefCell::new(Default::default());
}

/// One 16 × 32 tile of bf16 values: 512 of them.
const TILE: usize = 512;

/// Row panels (16 rows each) of a row block: its C accumulators stay in L2 across the K
/// chunks, and each K chunk of a column block's packed B is reused by its 8 panel pairs.
const M_PANELS: usize = 16;

/// Bytes of packed A pieces a product keeps at once: taller products run in row groups
/// (this thread's buffers stay bounded whatever the product).
const A_GROUP_BYTES: usize = 16 << 20;

/// Bytes of a column block's packed B (all of K): deep products take narrower blocks.
const B_BLOCK_BYTES: usize = 4 << 20;

/// Bytes of packed B (one K chunk of a column block, all pieces): with the row block's
/// accumulators, it stays in L2 (2 MiB a core here) while the row panels sweep it
/// (512 KiB: 1.3× the rate of 1 MiB on BERT's products, measured).
const B_CHUNK_BYTES: usize = 512 << 10;

/// The tile configuration: palette 1, tiles 0–7 all 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

static CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// The piece products `(A piece, B piece)` of f32 accuracy (`Highest`: `hh, mh, hm, lh,
/// mm, hl`), in the order a K block runs them: each product shares one operand with the one
/// before, except once (`lh` after `hl`, both operands new), so a K block loads 16 tiles
/// for its 24 tile products instead of 18, and every load is spread between products
/// (see [`chunk`]: a burst of loads right before the products that read them halved the
/// tile-product rate; 16 spread loads per 24 products ran at 1.26× the grouped order's rate
/// with L1-resident tiles).
const TRAIL_F32: [(usize, usize); 6] = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (2, 0)];

/// The three-product form (`mh, hh, hm`: two pieces each, ~2⁻¹⁶ relative, PyTorch's
/// "high" float32 matmul precision): one trail, 8 loads for 12 tile products.
const TRAIL_HIGH: [(usize, usize); 3] = [(1, 0), (0, 0), (0, 1)];

/// `C[m × n] = A[m × k] · B[k × n]`, C row-major with row stride `c_rs` (overwritten), at
/// f32 accuracy (`Highest`: the six piece products of [`TRAIL_F32`]) or at PyTorch's "high"
/// (the three of [`TRAIL_HIGH`]).
///
/// Returns false, C then holding anything, when an operand holds a value the pieces cannot
/// carry (infinite, NaN, or past bf16's largest finite value, where a piece product such as
/// `inf · 0` would give NaN for f32's ±inf): the caller computes the product elsewhere.
///
/// # Safety
/// As `gemm_f32::sgemm`, and [`hardware`] must have returned true.
#[must_use]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
    precision: MatmulPrecision,
) -> bool {
    match precision {
        MatmulPrecision::Highest => sgemm_passes(m, n, k, a, b, c, c_rs, &TRAIL_F32, 3),
        MatmulPrecision::High => sgemm_passes(m, n, k, a, b, c, c_rs, &TRAIL_HIGH, 2),
    }
}

/// `C = A · B` with the piece products `passes` over the first `pieces` pieces.
///
/// Blocking: A is packed whole (its pieces, K zero-padded to 32; products taller than
/// [`A_GROUP_BYTES`] of pieces run in row groups), B one column block at a time: column
/// blocks whose K chunk of packed B fits [`B_CHUNK_BYTES`], row blocks of [`M_PANELS`]
/// panels whose f32 accumulators (`acc`) stay in L2 between K chunks, then K chunks; a
/// panel pair's pieces of the chunk stay in L1 while the column panels sweep them, and each
/// 32 × 32 block of C runs the chunk's piece products in four accumulator tiles, loaded
/// from and stored to `acc` between chunks (the last chunk of an inner block stores to C).
/// K is summed in the same order whatever the split.
///
/// # Safety
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn sgemm_passes(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
    passes: &[(usize, usize)],
    pieces: usize,
) -> bool {
    let kb = k.div_ceil(32);
    // Rows whose packed pieces fit A_GROUP_BYTES, a multiple of 32 (at least 256): taller
    // products run as groups of them, each packing its rows (and B again).
    let group = (A_GROUP_BYTES / (kb * 32 * pieces * 2) / 32 * 32).max(256);
    if m > group {
        for r0 in (0..m).step_by(group) {
            let rows = group.min(m - r0);
            let a_rows = Mat {
                ptr: a.ptr.offset(r0 as isize * a.rs),
                ..a
            };
            if !sgemm_passes(
                rows,
                n,
                k,
                a_rows,
                b,
                c.add(r0 * c_rs),
                c_rs,
                passes,
                pieces,
            ) {
                return false;
            }
        }
        return true;
    }
    let (mp, np) = (m.div_ceil(32) * 2, n.div_ceil(32) * 2);
    // K chunk: the two A panels' pieces fill about half of L1 (24 KiB).
    let kcb = (24 * 1024 / (2 * pieces * TILE * 2)).clamp(1, kb);
    // Column block: panels (even) whose chunk of packed B fits B_CHUNK_BYTES and whose
    // whole K of packed B fits B_BLOCK_BYTES.
    let ncp = ((B_CHUNK_BYTES / (kcb * pieces * TILE * 2))
        .min(B_BLOCK_BYTES / (kb * pieces * TILE * 2))
        & !1)
        .clamp(2, np);
    PACK.with(|pack| {
        let mut pack = pack.borrow_mut();
        let (pb, pa, acc) = &mut *pack;
        pb.resize(pieces * ncp * kb * TILE);
        pa.resize(pieces * mp * kb * TILE);
        acc.resize(M_PANELS * 16 * ncp * 16);
        let (pb, pa, acc) = (pb.as_mut_slice(), pa.as_mut_slice(), acc.as_mut_slice());
        if !pack_a(a, m, k, mp, kb, pieces, pa) {
            return false;
        }
        asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        let acc = acc.as_mut_ptr();
        for jb in (0..np).step_by(ncp) {
            let jn = ncp.min(np - jb);
            // This column block of B, packed (its panels numbered from 0).
            let b_block = Mat {
                ptr: b.ptr.offset((jb * 16) as isize * b.cs),
                ..b
            };
            if !pack_b(b_block, k, (n - jb * 16).min(jn * 16), jn, kb, pieces, pb) {
                asm!("tilerelease", options(nostack, nomem));
                return false;
            }
            let ops = Operands {
                pa: pa.as_ptr(),
                mp,
                pb: pb.as_ptr(),
                np: jn,
                kb,
            };
            // acc rows: jn panels of 16 floats.
            let acc_rs = jn * 16;
            for ib in (0..mp).step_by(M_PANELS) {
                let im = M_PANELS.min(mp - ib);
                for kc in (0..kb).step_by(kcb) {
                    let kn = kcb.min(kb - kc);
                    let last = kc + kn == kb;
                    for ip in (ib..ib + im).step_by(2) {
                        for jp in (jb..jb + jn).step_by(2) {
                            let at = acc.add((ip - ib) * 16 * acc_rs + (jp - jb) * 16);
                            let (r0, c0) = (ip * 16, jp * 16);
                            let inside = r0 + 32 <= m && c0 + 32 <= n;
                            let src = if kc == 0 { None } else { Some((at, acc_rs)) };
                            if last && inside {
                                // The finished block straight into C.
                                chunk(
                                    &ops,
                                    ip,
                                    jp - jb,
                                    kc,
                                    kn,
                                    passes,
                                    src,
                                    (c.add(r0 * c_rs + c0), c_rs),
                                );
                                continue;
                            }
                            chunk(&ops, ip, jp - jb, kc, kn, passes, src, (at, acc_rs));
                            if last {
                                // An edge block: its valid part.
                                let rows = m.saturating_sub(r0).min(32);
                                let cols = (n - c0.min(n)).min(32);
                                for i in 0..rows {
                                    std::ptr::copy_nonoverlapping(
                                        at.add(i * acc_rs),
                                        c.add((r0 + i) * c_rs + c0),
                                        cols,
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
        true
    })
}

/// The packed pieces of A (`mp` 16-row panels) and B (`np` 16-column panels), `kb` K
/// blocks each (layouts of [`pack_a`] and [`pack_b`]).
struct Operands {
    pa: *const u16,
    mp: usize,
    pb: *const u16,
    np: usize,
    kb: usize,
}

/// K blocks `kc..kc + kn` of the 32 × 32 block of C at A panels `ip, ip+1` and B panels
/// `jp, jp+1`: accumulators 0 = (ip, jp), 1 = (ip, jp+1), 2 = (ip+1, jp), 3 = (ip+1, jp+1)
/// start at zero (`src` none) or from `src` (f32, the given row stride), and are stored to
/// `dst`.
///
/// Each K block runs the piece products of `trail` in order, four tile products each
/// (operands: A pieces in tmm4/tmm5, B pieces in tmm6/tmm7). Between two products only the
/// operand that changes is loaded, each of its two tiles as soon as the products reading the
/// old tile are issued, and each product issues first the tile products whose operands
/// were loaded longest ago: a tile load waits for the products still reading its register,
/// and a product for the load of its operands.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk(
    ops: &Operands,
    ip: usize,
    jp: usize,
    kc: usize,
    kn: usize,
    trail: &[(usize, usize)],
    src: Option<(*mut f32, usize)>,
    dst: (*mut f32, usize),
) {
    // Each trail compiled on its own: the schedule's branches fold away.
    if trail == TRAIL_F32 {
        chunk_with(ops, ip, jp, kc, kn, &TRAIL_F32, src, dst)
    } else if trail == TRAIL_HIGH {
        chunk_with(ops, ip, jp, kc, kn, &TRAIL_HIGH, src, dst)
    } else {
        chunk_with(ops, ip, jp, kc, kn, trail, src, dst)
    }
}

/// [`chunk`] for one trail.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn chunk_with(
    ops: &Operands,
    ip: usize,
    jp: usize,
    kc: usize,
    kn: usize,
    trail: &[(usize, usize)],
    src: Option<(*mut f32, usize)>,
    dst: (*mut f32, usize),
) {
    let Operands { pa, mp, pb, np, kb } = *ops;
    // Tile of piece `p`, panel `q`, K block `x` of A / B.
    let at = |p: usize, q: usize, x: usize| pa.add(((p * mp + q) * kb + x) * TILE);
    let bt = |p: usize, q: usize, x: usize| pb.add(((p * np + q) * kb + x) * TILE);
    let s = 64usize;
    macro_rules! ld {
        ($t:literal, $ptr:expr) => {
            asm!(
                concat!("tileloadd ", $t, ", [{0} + {1}*1]"),
                in(reg) $ptr,
                in(reg) s,
                options(nostack, readonly)
            )
        };
    }
    macro_rules! tdp {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tdpbf16ps ", $c, ", ", $a, ", ", $b),
                options(nostack, nomem)
            )
        };
    }
    match src {
        None => asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        ),
        Some((c, rs)) => asm!(
            "tileloadd tmm0, [{0} + {4}*1]",
            "tileloadd tmm1, [{1} + {4}*1]",
            "tileloadd tmm2, [{2} + {4}*1]",
            "tileloadd tmm3, [{3} + {4}*1]",
            in(reg) c,
            in(reg) c.add(16),
            in(reg) c.add(16 * rs),
            in(reg) c.add(16 * rs + 16),
            in(reg) rs * 4,
            options(nostack, readonly)
        ),
    }
    /// Which operand the next product replaces.
    #[derive(Clone, Copy, PartialEq)]
    enum Next {
        A,
        B,
        Both,
        End,
    }
    // The first product's operands.
    let (a0, b0) = trail[0];
    ld!("tmm4", at(a0, ip, kc));
    ld!("tmm6", bt(b0, jp, kc));
    ld!("tmm5", at(a0, ip + 1, kc));
    ld!("tmm7", bt(b0, jp + 1, kc));
    // Whether the last load replaced B (its products go first).
    let mut b_last = true;
    let end = kc + kn;
    for x in kc..end {
        for (i, &(pa_i, pb_i)) in trail.iter().enumerate() {
            // The next product's operands: the trail's next, or the next K block's first.
            let (nx, (na, nb)) = match trail.get(i + 1) {
                Some(&p) => (x, p),
                None => (x + 1, trail[0]),
            };
            let next = if nx == end {
                Next::End
            } else if nx != x || (na != pa_i && nb != pb_i) {
                Next::Both
            } else if na != pa_i {
                Next::A
            } else {
                Next::B
            };
            let (a_0, a_1) = (at(na, ip, nx), at(na, ip + 1, nx));
            let (b_0, b_1) = (bt(nb, jp, nx), bt(nb, jp + 1, nx));
            match (b_last, next) {
                (_, Next::End) => {
                    tdp!("tmm0", "tmm4", "tmm6");
                    tdp!("tmm1", "tmm4", "tmm7");
                    tdp!("tmm2", "tmm5", "tmm6");
                    tdp!("tmm3", "tmm5", "tmm7");
                }
                (false, Next::A) => {
                    tdp!("tmm0", "tmm4", "tmm6");
                    tdp!("tmm1", "tmm4", "tmm7");
                    ld!("tmm4", a_0);
                    tdp!("tmm2", "tmm5", "tmm6");
                    tdp!("tmm3", "tmm5", "tmm7");
                    ld!("tmm5", a_1);
                }
                (true, Next::A) => {
                    tdp!("tmm0", "tmm4", "tmm6");
                    tdp!("tmm2", "tmm5", "tmm6");
                    tdp!("tmm1", "tmm4", "tmm7");
                    ld!("tmm4", a_0);
                    tdp!("tmm3", "tmm5", "tmm7");
                    ld!("tmm5", a_1);
                }
                (false, Next::B) => {
                    tdp!("tmm0", "tmm4", "tmm6");
                    tdp!("tmm1", "tmm4", "tmm7");
                    tdp!("tmm2", "tmm5", "tmm6");
                    ld!("tmm6", b_0);
                    tdp!("tmm3", "tmm5", "tmm7");
                    ld!("tmm7", b_1);
                }
                (true, Next::B) => {
                    tdp!("tmm0", "tmm4", "tmm6");
                    tdp!("tmm2", "tmm5", "tmm6");
                    ld!("tmm6", b_0);
                    tdp!("tmm1", "tmm4", "tmm7");
                    tdp!("tmm3", "tmm5", "tmm7");
                    ld!("tmm7", b_1);
                }
                (false, Next::Both) => {
                    tdp!("tmm0", "tmm4", "tmm6");
                    tdp!("tmm1", "tmm4", "tmm7");
                    ld!("tmm4", a_0);
                    tdp!("tmm2", "tmm5", "tmm6");
                    ld!("tmm6", b_0);
                    tdp!("tmm3", "tmm5", "tmm7");
                    ld!("tmm5", a_1);
                    ld!("tmm7", b_1);
                }
                (true, Next::Both) => {
                    tdp!("tmm0", "tmm4", "tmm6");
                    tdp!("tmm2", "tmm5", "tmm6");
                    ld!("tmm6", b_0);
                    tdp!("tmm1", "tmm4", "tmm7");
                    ld!("tmm4", a_0);
                    tdp!("tmm3", "tmm5", "tmm7");
                    ld!("tmm5", a_1);
                    ld!("tmm7", b_1);
                }
            }
            b_last = matches!(next, Next::B | Next::Both);
        }
    }
    let (c, rs) = dst;
    asm!(
        "tilestored [{0} + {4}*1], tmm0",
        "tilestored [{1} + {4}*1], tmm1",
        "tilestored [{2} + {4}*1], tmm2",
        "tilestored [{3} + {4}*1], tmm3",
        in(reg) c,
        in(reg) c.add(16),
        in(reg) c.add(16 * rs),
        in(reg) c.add(16 * rs + 16),
        in(reg) rs * 4,
        options(nostack)
    );
}

/// The three pieces of 16 floats: per piece, the 16 values' bf16 bits in the low 16 bits of
/// each 32-bit lane (`lo`) and in the high 16 bits (`hi`).
#[inline(always)]
unsafe fn split16(
    v: std::arch::x86_64::__m512,
) -> [(std::arch::x86_64::__m512i, std::arch::x86_64::__m512i); 3] {
    use std::arch::x86_64::*;
    // (No closure here: closures do not inherit the caller's target features, and the
    // intrinsics then stay calls.)
    let mut x = v;
    let mut out = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 3];
    for o in &mut out {
        let b = _mm512_castps_si512(x);
        // Round to nearest even at bit 16 (finite values; the scalar path guards the rest).
        let odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        let r = _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
        let hi = _mm512_and_si512(r, _mm512_set1_epi32(0xffff0000u32 as i32));
        x = _mm512_sub_ps(x, _mm512_castsi512_ps(hi));
        *o = (_mm512_srli_epi32(r, 16), hi);
    }
    out
}

/// Values the pieces carry: finite, and small enough that rounding to bf16 stays finite
/// (bf16's largest finite value is 3.3895e38).
const PIECES_MAX: f32 = 3.0e38;

/// Whether `x` is one of the values the pieces carry ([`PIECES_MAX`]).
#[inline(always)]
fn plain(x: f32) -> bool {
    x.abs() <= PIECES_MAX
}

/// Whether all 16 values are [`plain`] (the vector split assumes it).
#[inline(always)]
unsafe fn plain16(v: std::arch::x86_64::__m512) -> bool {
    use std::arch::x86_64::*;
    // Ordered and not greater: false for NaN.
    _mm512_cmp_ps_mask::<_CMP_LE_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(PIECES_MAX)) == 0xffff
}

/// Packs A (`m × k`; rows past `m` and columns past `k` are zeros) into `mp` 16-row panels
/// of `kb` tiles per piece, for the first `pieces` pieces. False (stopping) at a value that
/// is not [`plain`].
#[target_feature(enable = "avx512f,avx512bw")]
#[inline(never)]
unsafe fn pack_a(
    a: Mat,
    m: usize,
    k: usize,
    mp: usize,
    kb: usize,
    pieces: usize,
    out: &mut [u16],
) -> bool {
    use std::arch::x86_64::*;
    let o = out.as_mut_ptr();
    // Word offsets of tile rows 0..16 (a tile row is 16 32-bit words).
    let rows16 = _mm512_setr_epi32(
        0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
    );
    // Row-major A is read along its rows (panels outer), column-major A along its columns
    // (K blocks outer).
    for t in 0..mp * kb {
        let (q, x) = if a.rs == 1 && a.cs != 1 {
            (t % mp, t / mp)
        } else {
            (t / kb, t % kb)
        };
        {
            let tiles: [usize; 3] = std::array::from_fn(|p| ((p * mp + q) * kb + x) * TILE);
            if a.rs == 1 && (q + 1) * 16 <= m && (x + 1) * 32 <= k {
                // Column-major: a column's 16 rows are contiguous. Columns 2c and 2c+1 make
                // one 32-bit word per row (tile word r·16 + c), scattered down the tile.
                let mut ok = true;
                for c in 0..16 {
                    let src = a
                        .ptr
                        .offset((q * 16) as isize + (x * 32 + 2 * c) as isize * a.cs);
                    let (v0, v1) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.offset(a.cs)));
                    if !(plain16(v0) && plain16(v1)) {
                        ok = false;
                        break;
                    }
                    let (s0, s1) = (split16(v0), split16(v1));
                    for p in 0..pieces {
                        let w = _mm512_or_si512(s0[p].0, s1[p].1);
                        _mm512_i32scatter_epi32::<4>(
                            (o.add(tiles[p]) as *mut i32).add(c),
                            rows16,
                            w,
                        );
                    }
                }
                if ok {
                    continue;
                }
            }
            for r in 0..16 {
                let i = q * 16 + r;
                let full = i < m && (x + 1) * 32 <= k && a.cs == 1;
                if full {
                    let src = a.ptr.offset(i as isize * a.rs + (x * 32) as isize);
                    let (v0, v1) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.add(16)));
                    if plain16(v0) && plain16(v1) {
                        let (s0, s1) = (split16(v0), split16(v1));
                        for p in 0..pieces {
                            let d = o.add(tiles[p] + r * 32);
                            _mm256_storeu_si256(d as *mut __m256i, _mm512_cvtepi32_epi16(s0[p].0));
                            _mm256_storeu_si256(
                                d.add(16) as *mut __m256i,
                                _mm512_cvtepi32_epi16(s1[p].0),
                            );
                        }
                        continue;
                    }
                }
                for c in 0..32 {
                    let kk = x * 32 + c;
                    let v = if i < m && kk < k {
                        let x = a.at(i, kk);
                        if !plain(x) {
                            return false;
                        }
                        split(x)
                    } else {
                        [0; 3]
                    };
                    for p in 0..pieces {
                        *o.add(tiles[p] + r * 32 + c) = v[p];
                    }
                }
            }
        }
    }
    true
}

/// Packs B (`k × n`) into `np` 16-column panels of `kb` tiles per piece (the first
/// `pieces`), pair-interleaved: tile row `p`, slot `2j + e` holds `B[32x + 2p + e][16q + j]`
/// (zero-padded). False (stopping) at a value that is not [`plain`].
#[target_feature(enable = "avx512f,avx512bw")]
#[inline(never)]
unsafe fn pack_b(
    b: Mat,
    k: usize,
    n: usize,
    np: usize,
    kb: usize,
    pieces: usize,
    out: &mut [u16],
) -> bool {
    use std::arch::x86_64::*;
    let o = out.as_mut_ptr();
    // Word offsets of tile rows 0..16 (a tile row is 16 32-bit words).
    let rows16 = _mm512_setr_epi32(
        0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240,
    );
    // Row-major B is read along its rows (K block outer, panels inner), column-major B
    // along its columns: the source streams instead of striding across pages.
    for t in 0..np * kb {
        let (q, x) = if b.cs == 1 {
            (t % np, t / np)
        } else {
            (t / kb, t % kb)
        };
        {
            let tiles: [usize; 3] = std::array::from_fn(|p| ((p * np + q) * kb + x) * TILE);
            let full = (q + 1) * 16 <= n && (x + 1) * 32 <= k;
            if full && b.cs == 1 {
                // Rows 2p and 2p+1, 16 columns each: one tile row per piece.
                let mut ok = true;
                for pr in 0..16 {
                    let r0 = b
                        .ptr
                        .offset((x * 32 + 2 * pr) as isize * b.rs + (q * 16) as isize);
                    let (v0, v1) = (_mm512_loadu_ps(r0), _mm512_loadu_ps(r0.offset(b.rs)));
                    if !(plain16(v0) && plain16(v1)) {
                        ok = false;
                        break;
                    }
                    let (s0, s1) = (split16(v0), split16(v1));
                    for p in 0..pieces {
                        let w = _mm512_or_si512(s0[p].0, s1[p].1);
                        _mm512_storeu_si512(o.add(tiles[p] + pr * 32) as *mut _, w);
                    }
                }
                if ok {
                    continue;
                }
            } else if full && b.rs == 1 {
                // Column j's 32 values are contiguous: its 16 pair-words go down column j
                // of the tile (word p·16 + j).
                let mut ok = true;
                for j in 0..16 {
                    let c0 = b
                        .ptr
                        .offset((q * 16 + j) as isize * b.cs + (x * 32) as isize);
                    let (v0, v1) = (_mm512_loadu_ps(c0), _mm512_loadu_ps(c0.add(16)));
                    if !(plain16(v0) && plain16(v1)) {
                        ok = false;
                        break;
                    }
                    let (s0, s1) = (split16(v0), split16(v1));
                    for p in 0..pieces {
                        // 32 bf16 in k order = 16 pair-words.
                        let lo = _mm512_cvtepi32_epi16(s0[p].0);
                        let hi = _mm512_cvtepi32_epi16(s1[p].0);
                        let words = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                        _mm512_i32scatter_epi32::<4>(
                            (o.add(tiles[p]) as *mut i32).add(j),
                            rows16,
                            words,
                        );
                    }
                }
                if ok {
                    continue;
                }
            }
            for kk in 0..32 {
                let kg = x * 32 + kk;
                for j in 0..16 {
                    let col = q * 16 + j;
                    let v = if kg < k && col < n {
                        let x = b.at(kg, col);
                        if !plain(x) {
                            return false;
                        }
                        split(x)
                    } else {
                        [0; 3]
                    };
                    let at = (kk / 2) * 32 + 2 * j + kk % 2;
                    for p in 0..pieces {
                        *o.add(tiles[p] + at) = v[p];
                    }
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use MatmulPrecision::{High, Highest};

    /// `v` as a row-major matrix of `cols` columns.
    fn rows(v: &[f32], cols: usize) -> Mat {
        Mat {
            ptr: v.as_ptr(),
            rs: cols as isize,
            cs: 1,
        }
    }

    /// `v` as a column-major matrix of `rows` rows.
    fn cols(v: &[f32], rows: usize) -> Mat {
        Mat {
            ptr: v.as_ptr(),
            rs: 1,
            cs: rows as isize,
        }
    }

    /// Row `i` of row-major `a` (`k` columns) times column `j` of row-major `b` (`n`
    /// columns) in f64: the sum and the sum of the products' magnitudes.
    fn f64_dot(a: &[f32], b: &[f32], (i, j): (usize, usize), k: usize, n: usize) -> (f64, f64) {
        (0..k)
            .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
            .fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()))
    }

    #[test]
    fn pieces_hold_24_bits() {
        for &x in &[1.0f32, -3.14159265, 1e-20, 7.0e12, 0.1, -0.33333334] {
            let [h, m, l] = split(x);
            let back = |b: u16| f32::from_bits((b as u32) << 16) as f64;
            let sum = back(h) + back(m) + back(l);
            assert!(
                ((sum - x as f64) / x as f64).abs() < 2f64.powi(-24),
                "{x}: {sum}"
            );
        }
    }

    #[test]
    fn products_match_f64_at_f32_accuracy() {
        if !hardware() {
            eprintln!("skipping: no AMX-BF16 here");
            return;
        }
        check_against_f64(Highest, 4.0 * f32::EPSILON as f64);
    }

    /// The three-pass form: within 2⁻¹⁵ of the sum of magnitudes (the dropped `mm` term and
    /// the pieces' 16 bits: ~2⁻¹⁶ each).
    #[test]
    fn three_pass_products_match_f64_within_2_pow_minus_15() {
        if !hardware() {
            eprintln!("skipping: no AMX-BF16 here");
            return;
        }
        check_against_f64(High, 2f64.powi(-15));
    }

    /// Infinities, NaNs and values past bf16's range are refused by the pieces, and the
    /// f32 product then comes from the SIMD kernel: `inf · 1` stays `inf` (the pieces would
    /// give `inf · 0 = NaN` for the lower piece of 1.0), `3.39e38 · 1` stays finite, a NaN
    /// spreads along its row only.
    #[test]
    fn values_the_pieces_cannot_carry_give_f32_results() {
        let (m, n, k) = (40, 160, 160);
        if !crate::kernels::matmul::gemm_f32::amx_for(n, k) {
            eprintln!("skipping: no AMX-BF16 here (or capped by LUMINAL_CPU_ISA / LUMINAL_AMX)");
            return;
        }
        for (bad, want) in [
            (f32::INFINITY, f32::INFINITY),
            (f32::NEG_INFINITY, f32::NEG_INFINITY),
            (3.39e38, 3.39e38 + 159.0),
            (f32::NAN, f32::NAN),
        ] {
            let mut a = vec![1f32; m * k];
            a[3 * k + 7] = bad;
            let b = vec![1f32; k * n];
            let am = rows(&a, k);
            let bm = rows(&b, n);
            for precision in [Highest, High] {
                let mut c = vec![0f32; m * n];
                assert!(!unsafe { sgemm(m, n, k, am, bm, c.as_mut_ptr(), n, precision) });
            }
            // Through the dispatcher, on AMX otherwise.
            let mut c = vec![0f32; m * n];
            unsafe { crate::kernels::matmul::gemm_f32::sgemm(m, n, k, am, bm, c.as_mut_ptr(), n) };
            for i in 0..m {
                for j in 0..n {
                    let got = c[i * n + j];
                    if i == 3 {
                        assert!(
                            got == want || (want.is_nan() && got.is_nan()),
                            "{bad}: ({i}, {j}) {got}"
                        );
                    } else {
                        assert_eq!(got, k as f32, "{bad}: ({i}, {j})");
                    }
                }
            }
        }
    }

    /// A product taller than `A_GROUP_BYTES` of pieces runs in row groups: rows on both
    /// sides of the group boundary and the last rows against f64.
    #[test]
    fn tall_products_run_in_row_groups() {
        if !hardware() {
            eprintln!("skipping: no AMX-BF16 here");
            return;
        }
        let (m, n, k) = (6000, 40, 1024);
        let group = A_GROUP_BYTES / (k * 3 * 2) / 32 * 32;
        assert!(group < m, "the product must span two groups");
        let vals = crate::kernels::matmul::testing::vals;
        let (a, b) = (vals(m * k, 3), vals(k * n, 4));
        let mut c = vec![f32::NAN; m * n];
        let am = rows(&a, k);
        let bm = rows(&b, n);
        assert!(unsafe { sgemm(m, n, k, am, bm, c.as_mut_ptr(), n, Highest) });
        for i in [0, group - 1, group, group + 1, m - 1] {
            for j in 0..n {
                let (want, mag) = f64_dot(&a, &b, (i, j), k, n);
                let got = c[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 4.0 * f32::EPSILON as f64 * mag,
                    "({i}, {j}): want {want}, got {got}"
                );
            }
        }
        assert!(c.iter().all(|x| x.is_finite()), "every element written");
    }

    /// [`sgemm`] at `precision` against f64 sums on odd shapes (K across several chunks, row
    /// and column blocks with edges), A and B row-major and column-major: each element
    /// within `rel` of the sum of the magnitudes of its products.
    fn check_against_f64(precision: MatmulPrecision, rel: f64) {
        let vals = crate::kernels::matmul::testing::vals;
        for &(m, n, k) in &[
            (32, 32, 32),
            (37, 45, 70),
            (64, 100, 384),
            (129, 33, 1000),
            (100, 1500, 200),
        ] {
            let (a, b) = (vals(m * k, 1), vals(k * n, 2));
            // B transposed in memory too: element (r, c) at c·k + r; A likewise: (i, p) at
            // p·m + i.
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let at: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
            let a_layouts = [
                (rows(&a, k), "A row-major"),
                (cols(&at, m), "A column-major"),
            ];
            let b_layouts = [
                (rows(&b, n), "B row-major"),
                (cols(&bt, k), "B column-major"),
            ];
            for ((am, a_label), (bm, b_label)) in a_layouts
                .iter()
                .flat_map(|a| b_layouts.iter().map(move |b| (*a, *b)))
            {
                let label = format!("{a_label}, {b_label}");
                let mut c = vec![f32::NAN; m * (n + 3)];
                assert!(unsafe { sgemm(m, n, k, am, bm, c.as_mut_ptr(), n + 3, precision) });
                for i in 0..m {
                    for j in 0..n {
                        let (want, mag) = f64_dot(&a, &b, (i, j), k, n);
                        let got = c[i * (n + 3) + j] as f64;
                        assert!(
                            (got - want).abs() <= rel * mag.max(1e-30),
                            "{label} {m}x{n}x{k} ({i}, {j}): want {want}, got {got}"
                        );
                    }
                }
                // The padding columns of C are not written.
                assert!(c[n].is_nan(), "{label}: wrote past the row");
            }
        }
    }

    /// One thread, BERT-sized and Llama-sized products: AMX against the AVX-512 kernel
    /// (`cargo test --release -p luminal_cpu --lib amx_speed -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn amx_speed() {
        if !hardware() {
            eprintln!("skipping: no AMX-BF16 here");
            return;
        }
        for &(m, n, k) in &[
            (2048, 1536, 384),
            (2048, 384, 1536),
            (512, 2048, 2048),
            (128, 576, 576),
            // The tiny GPT's training products (forward, dX, dW).
            (1024, 192, 64),
            (1024, 64, 256),
            (64, 192, 1024),
            (512, 64, 64),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0)
                .collect();
            let c = vec![0f32; m * n];
            let am = rows(&a, k);
            let bm = rows(&b, n);
            let time = |f: &dyn Fn(*mut f32)| {
                f(c.as_ptr() as *mut f32);
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t = std::time::Instant::now();
                    f(c.as_ptr() as *mut f32);
                    best = best.min(t.elapsed().as_secs_f64());
                }
                best
            };
            let t_amx = time(&|c| assert!(unsafe { sgemm(m, n, k, am, bm, c, n, Highest) }));
            let t_high = time(&|c| assert!(unsafe { sgemm(m, n, k, am, bm, c, n, High) }));
            let t_simd =
                time(&|c| unsafe { super::super::gemm_f32::sgemm_simd(m, n, k, am, bm, c, n) });
            let gf = |t: f64| 2.0 * (m * n * k) as f64 / t / 1e9;
            println!(
                "{m}x{n}x{k}: AMX 6 passes {:.2} ms ({:.0} GFLOP/s), 3 passes {:.2} ms ({:.0}), \
                 AVX-512 {:.2} ms ({:.0}); AVX-512 / AMX {:.2}x, {:.2}x",
                t_amx * 1e3,
                gf(t_amx),
                t_high * 1e3,
                gf(t_high),
                t_simd * 1e3,
                gf(t_simd),
                t_simd / t_amx,
                t_simd / t_high
            );
        }
    }
}

#[cfg(test)]
mod peak_probe {
    use super::*;
    use std::arch::asm;

    /// Tile-product rates on one thread with every operand in L1 (a measurement that
    /// asserts nothing; quoted in benches/README.md): no loads at all, the order by B piece
    /// used before [`TRAIL_F32`] (two B tiles, then two A tiles before each four products:
    /// 18 loads for 24 products, in bursts), and [`chunk`] itself over L1-resident tiles
    /// (`cargo test --release -p luminal_cpu --lib tmul_rates -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn tmul_rates() {
        if !available() {
            eprintln!("skipping: no AMX-BF16 here");
            return;
        }
        // 3 pieces × 2 panels × 2 K blocks of A and of B (24 KiB), and a 32 × 32 C.
        let buf = vec![0u16; 24 * TILE];
        let mut c = vec![0f32; 32 * 32];
        let reps = 300_000usize;
        let rate = |blocks: usize, secs: f64| {
            let macs = (blocks * 24 * 16 * 16 * 32) as f64;
            format!(
                "{:.0} GMAC/s ({:.0} GFLOP/s at f32 accuracy)",
                macs / secs / 1e9,
                2.0 * macs / secs / 1e9 / 6.0
            )
        };
        let p = buf.as_ptr();
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
            asm!("tileloadd tmm4, [{0} + {1}*1]", "tileloadd tmm5, [{0} + {1}*1]",
                 "tileloadd tmm6, [{0} + {1}*1]", "tileloadd tmm7, [{0} + {1}*1]",
                 in(reg) p, in(reg) 64usize, options(nostack, readonly));
            let t = std::time::Instant::now();
            for _ in 0..reps * 6 {
                asm!(
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    options(nostack, nomem)
                );
            }
            println!("no loads: {}", rate(reps, t.elapsed().as_secs_f64()));
            // `LOADS` tile loads before each four products, read by them.
            macro_rules! loads_then_products {
                ($name:literal, $($load:literal),*) => {{
                    let t = std::time::Instant::now();
                    for i in 0..reps * 6 {
                        let o = p.add((i & 1) * 8 * TILE);
                        $(asm!(concat!("tileloadd ", $load, ", [{0} + {1}*1]"),
                               in(reg) o.add(TILE * ($load.as_bytes()[3] - b'0') as usize),
                               in(reg) 64usize, options(nostack, readonly));)*
                        asm!("tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7",
                             "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                             options(nostack, nomem));
                    }
                    println!("{}: {}", $name, rate(reps, t.elapsed().as_secs_f64()));
                }};
            }
            loads_then_products!("1 load before every 4 products", "tmm4");
            loads_then_products!("2 loads before every 4 products", "tmm4", "tmm5");
            loads_then_products!(
                "4 loads before every 4 products",
                "tmm4",
                "tmm5",
                "tmm6",
                "tmm7"
            );
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for (bp, a_pieces) in [(0usize, 3usize), (1, 2), (2, 1)] {
                    asm!("tileloadd tmm6, [{0} + {1}*1]", "tileloadd tmm7, [{2} + {1}*1]",
                         in(reg) p.add((6 + 2 * bp) * TILE), in(reg) 64usize,
                         in(reg) p.add((7 + 2 * bp) * TILE), options(nostack, readonly));
                    for ap in 0..a_pieces {
                        asm!("tileloadd tmm4, [{0} + {2}*1]", "tileloadd tmm5, [{1} + {2}*1]",
                             "tdpbf16ps tmm0, tmm4, tmm6", "tdpbf16ps tmm1, tmm4, tmm7",
                             "tdpbf16ps tmm2, tmm5, tmm6", "tdpbf16ps tmm3, tmm5, tmm7",
                             in(reg) p.add(2 * ap * TILE), in(reg) p.add((2 * ap + 1) * TILE),
                             in(reg) 64usize, options(nostack, readonly));
                    }
                }
            }
            println!(
                "grouped by B piece: {}",
                rate(reps, t.elapsed().as_secs_f64())
            );
            // `chunk`: four K blocks per call (C loaded and stored once a call, as in a
            // product), over the same tiles: two distinct K blocks, each read twice.
            let ops = Operands {
                pa: p,
                mp: 2,
                pb: p.add(12 * TILE),
                np: 2,
                kb: 2,
            };
            let t = std::time::Instant::now();
            for _ in 0..reps / 4 {
                let c = (c.as_mut_ptr(), 32);
                chunk(&ops, 0, 0, 0, 2, &TRAIL_F32, Some(c), c);
                chunk(&ops, 0, 0, 0, 2, &TRAIL_F32, Some(c), c);
            }
            println!(
                "chunk (the trail): {}",
                rate(reps / 4 * 4, t.elapsed().as_secs_f64())
            );
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}
