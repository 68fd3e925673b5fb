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
//! of C lives in four accumulator tiles; per K block the piece products run in an order
//! where each shares an operand with the one before (16 tile loads for 24 products in the
//! six-piece form, spread between the products: `chunk.rs`). Tile loads, not products,
//! bound the kernel, so the blocking keeps them in cache:
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
//!
//! Files: this one drives a product (availability, blocking, buffers); `pack.rs` splits
//! operands into pieces and packs them into tiles; `chunk.rs` runs the tile products of a
//! block of C; `tests.rs` checks products against f64 and holds the timings.

mod chunk;
mod pack;
#[cfg(test)]
mod tests;

use super::gemm_f32::{Done, Mat, MatmulPrecision};
use crate::kernels::quant::span_acts::Aligned;
use chunk::{chunk, TRAIL_F32, TRAIL_HIGH};
use pack::{pack_a, pack_b};
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

/// `C[m × n] = A[m × k] · B[k × n]`, C row-major with row stride `c_rs` (overwritten), at
/// f32 accuracy (`Highest`: the six piece products of [`TRAIL_F32`]) or at PyTorch's "high"
/// (the three of [`TRAIL_HIGH`]).
///
/// Returns false, C then holding anything, when an operand holds a value the pieces cannot
/// carry (infinite, NaN, or past bf16's largest finite value, where a piece product such as
/// `inf · 0` would give NaN for f32's ±inf): the caller computes the product elsewhere.
///
/// `done` (if any) is told of the whole of C once it is finished (see `gemm_f32::Done`).
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
    done: Done<'_>,
) -> bool {
    let ok = match precision {
        MatmulPrecision::Highest => sgemm_pieces(m, n, k, a, b, c, c_rs, &TRAIL_F32, 3),
        MatmulPrecision::High => sgemm_pieces(m, n, k, a, b, c, c_rs, &TRAIL_HIGH, 2),
    };
    // The whole product at once: run between the blocks, an epilogue evicts the packed
    // pieces and accumulators the next blocks read from L2 (BERT's GELU epilogue: 8% slower
    // end to end, measured).
    if let (true, Some(done)) = (ok, done) {
        done(0, m, 0, n);
    }
    ok
}

/// `C = A · B` with the piece products of `trail` (in that order) over the first `pieces` pieces.
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
unsafe fn sgemm_pieces(
    m: usize,
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: *mut f32,
    c_rs: usize,
    trail: &[(usize, usize)],
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
            if !sgemm_pieces(rows, n, k, a_rows, b, c.add(r0 * c_rs), c_rs, trail, pieces) {
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
                                    trail,
                                    src,
                                    (c.add(r0 * c_rs + c0), c_rs),
                                );
                                continue;
                            }
                            chunk(&ops, ip, jp - jb, kc, kn, trail, src, (at, acc_rs));
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
