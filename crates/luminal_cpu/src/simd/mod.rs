//! Instruction-set dispatch and the vectorisable inner loops of the fused kernels.
//!
//! Kernels are plain Rust loops written so that LLVM vectorises them (no branches in the
//! loop bodies, no libm calls): `exp2`, `log2` and `sin` are polynomial approximations
//! accurate to about 1–2 ulp. Each hot task is compiled three times — AVX-512, AVX2+FMA,
//! and the target's baseline — and [`run`] picks the best one the CPU supports, detected
//! once at run time (`LUMINAL_CPU_ISA=generic|avx2|avx512` caps the choice).

use crate::simd::half::HalfKind;
use luminal::op::{BinaryOp, ReduceOp, UnaryOp};
use std::sync::atomic::{AtomicU8, Ordering};

/// Instruction sets the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The compilation target's baseline (SSE2 on x86-64, NEON on aarch64).
    Generic = 1,
    /// x86-64 AVX2 + FMA.
    Avx2 = 2,
    /// x86-64 AVX-512 (F, VL, BW, DQ).
    Avx512 = 3,
}

static ISA: AtomicU8 = AtomicU8::new(0);

fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Isa::Avx512;
        }
        // F16C (half conversions) ships with every AVX2 CPU; the kernels rely on it.
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Isa::Avx2;
        }
    }
    Isa::Generic
}

/// The best instruction set this CPU supports (what the kernels use unless capped by
/// `LUMINAL_CPU_ISA` or [`set_max_isa`]).
pub fn detected_isa() -> Isa {
    // Detected once: kernels ask per block (the attention fast path's soundness check).
    static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *DETECTED.get_or_init(detect)
}

/// The instruction set the kernels run with.
#[inline]
pub fn isa() -> Isa {
    match ISA.load(Ordering::Relaxed) {
        1 => Isa::Generic,
        2 => Isa::Avx2,
        3 => Isa::Avx512,
        _ => {
            let cap = match std::env::var("LUMINAL_CPU_ISA").as_deref() {
                Ok("generic") => Isa::Generic,
                Ok("avx2") => Isa::Avx2,
                _ => Isa::Avx512,
            };
            let chosen = detect().min(cap);
            ISA.store(chosen as u8, Ordering::Relaxed);
            chosen
        }
    }
}

/// Caps the instruction set at `max` (never above what the CPU supports); returns the one
/// now in use. Process-wide: meant for tests and benchmarks comparing code paths.
pub fn set_max_isa(max: Isa) -> Isa {
    let chosen = detect().min(max);
    ISA.store(chosen as u8, Ordering::Relaxed);
    chosen
}

/// Whether the baseline target has a fused multiply-add instruction (otherwise `mul_add`
/// would be a libm call, so the generic path uses a separate multiply and add).
pub(crate) const NATIVE_FMA: bool = cfg!(any(target_feature = "fma", target_arch = "aarch64"));

/// A unit of work compiled once per instruction set. `FMA` says whether `fma` may use a
/// fused multiply-add. Implementations mark `run` `#[inline(always)]` (and everything hot
/// it calls), so the whole body is compiled with the caller's target features.
pub trait Task {
    type Output;
    fn run<const FMA: bool>(self) -> Self::Output;
}

// Not inlined: each task type gets one copy per instruction set, whatever calls it.
#[cfg(target_arch = "x86_64")]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
unsafe fn run_avx512<T: Task>(t: T) -> T::Output {
    t.run::<true>()
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<T: Task>(t: T) -> T::Output {
    t.run::<true>()
}

/// Runs `t` compiled for the best available instruction set.
#[inline]
pub fn run<T: Task>(t: T) -> T::Output {
    match isa() {
        // SAFETY: `isa()` only returns Avx512/Avx2 when `is_x86_feature_detected!` found
        // every feature the wrapper enables on this CPU.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { run_avx512(t) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { run_avx2(t) },
        _ => t.run::<NATIVE_FMA>(),
    }
}

// ---------------------------------------------------------------------------- streaming stores

/// Outputs at least this large are written with non-temporal stores: they cannot stay in
/// the last-level cache for their consumer anyway, and streaming them skips the
/// read-for-ownership of every destination line (a third of the traffic of a copy).
pub fn stream_threshold_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        // Half the last-level cache (Linux reports it; 32 MiB when unknown).
        let l3 = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size")
            .ok()
            .and_then(|s| {
                let s = s.trim();
                let (num, mul) = match s.strip_suffix('K') {
                    Some(n) => (n, 1024),
                    None => match s.strip_suffix('M') {
                        Some(n) => (n, 1 << 20),
                        None => (s, 1),
                    },
                };
                num.parse::<usize>().ok().map(|n| n * mul)
            })
            .filter(|&b| b >= 1 << 20)
            .unwrap_or(32 << 20);
        l3 / 2
    })
}

/// `dst.copy_from_slice(src)` with non-temporal stores where the target has them; call
/// [`store_fence`] before another thread reads `dst`.
#[inline(always)]
pub fn stream_copy(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    let src = &src[..n];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        if isa() >= Isa::Avx2 {
            // SAFETY: AVX was detected on this CPU.
            unsafe { stream_copy_avx(dst, src) };
            return;
        }
        // Scalar head up to 16-byte alignment, streamed body, scalar tail.
        let head = (dst.as_ptr().align_offset(16)).min(n);
        dst[..head].copy_from_slice(&src[..head]);
        let body = (n - head) / 4 * 4;
        for i in (head..head + body).step_by(4) {
            // SAFETY: `i + 4 <= n` for both slices, and `dst[i]` is 16-byte aligned (head
            // skipped to alignment, steps of 4 floats). SSE is part of the x86-64 baseline.
            unsafe { _mm_stream_ps(dst.as_mut_ptr().add(i), _mm_loadu_ps(src.as_ptr().add(i))) }
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// [`stream_copy`] with 32-byte non-temporal stores.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_copy_avx(dst: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_stream_ps};
    let n = dst.len().min(src.len());
    let head = (dst.as_ptr().align_offset(32)).min(n);
    dst[..head].copy_from_slice(&src[..head]);
    let body = (n - head) / 8 * 8;
    let mut i = head;
    while i < head + body {
        // SAFETY: `i + 8 <= n` for both slices; `dst[i]` is 32-byte aligned (head skipped
        // to alignment, steps of 8 floats).
        unsafe {
            _mm256_stream_ps(
                dst.as_mut_ptr().add(i),
                _mm256_loadu_ps(src.as_ptr().add(i)),
            )
        };
        i += 8;
    }
    dst[head + body..n].copy_from_slice(&src[head + body..n]);
}

/// Asks the cache to start loading `data` (one hint per 64-byte line).
#[inline(always)]
pub fn prefetch(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..data.len()).step_by(16) {
        // SAFETY: a prefetch hint never faults; the address is inside `data`. SSE is part of
        // the x86-64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                data.as_ptr().add(i) as *const i8,
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Orders earlier non-temporal stores before later stores (end of a streaming task).
#[inline(always)]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86-64 baseline; a fence has no memory-safety effect.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}

/// Bytes ahead of the row being read that skinny products prefetch: a weight streamed from
/// memory once per step outruns the hardware prefetcher (one thread, 128 MiB weight, int8
/// path, ns per 64 weights: Q4_1 K = 576 6.6 -> 4.6, K = 1536 5.9 -> 3.9, Q8_0 9.4 -> 6.2;
/// `kernels/quant` `timing::int8_stream`).
pub(crate) const PREFETCH_AHEAD: usize = 2048;

/// Sum of the eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX is enabled in every caller (they enable AVX2).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }
}

mod chain;
pub(crate) mod half;
mod math;
mod reduce;
mod slices;
#[cfg(test)]
mod tests;
pub(crate) mod transpose;

pub use chain::*;
pub use math::*;
pub use reduce::*;
pub use slices::*;

/// Asks for the cache lines of `len` bytes from `p` to be brought into L1. Never faults and
/// never reads: `p` may point anywhere (a row past the end of a weight is merely wasted).
#[inline(always)]
pub(crate) fn prefetch_raw(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let mut o = 0;
        while o < len {
            // SAFETY: a prefetch is a hint with no architectural effect, valid on any
            // address; the pointer is formed with wrapping arithmetic and not dereferenced.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o) as *const i8) };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}
