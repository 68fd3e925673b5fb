//! Instruction-set dispatch and the vectorisable inner loops of the fused kernels.
//!
//! Kernels are plain Rust loops written so that LLVM vectorises them (no branches in the
//! loop bodies, no libm calls): `exp2`, `log2` and `sin` are polynomial approximations
//! accurate to about 1–2 ulp. Each hot task is compiled three times — AVX-512, AVX2+FMA,
//! and the target's baseline — and [`run`] picks the best one the CPU supports, detected
//! once at run time (`LUMINAL_CPU_ISA=generic|avx2|avx512` caps the choice).

use crate::halfvec::HalfKind;
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
    detect()
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

// ---------------------------------------------------------------------------- scalar math

#[inline(always)]
pub fn fma<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `1.5 * 2^23`: adding and subtracting it rounds an f32 of magnitude < 2^22 to the
/// nearest integer (ties to even), and leaves that integer in the low mantissa bits.
const ROUND_MAGIC: f32 = 12582912.0;

/// 2^x, within 2 ulp over the whole f32 range (subnormal results included); NaN stays NaN.
#[inline(always)]
pub fn exp2<const F: bool>(x: f32) -> f32 {
    // Clamp (NaN passes through: comparisons with NaN are false).
    let x = if x < -151.0 { -151.0 } else { x };
    let x = if x > 129.0 { 129.0 } else { x };
    let t = x + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = x - n; // in [-0.5, 0.5]
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    // 2^r on [-0.5, 0.5] (Cephes exp2f, relative error 1.7e-7).
    let mut p = 1.535_336_2e-4;
    p = fma::<F>(p, r, 1.339_887_4e-3);
    p = fma::<F>(p, r, 9.618_437e-3);
    p = fma::<F>(p, r, 5.550_332_5e-2);
    p = fma::<F>(p, r, 2.402_264_8e-1);
    p = fma::<F>(p, r, 6.931_472e-1);
    p = fma::<F>(p, r, 1.0);
    // 2^n as two normal factors, so that results down to the subnormals round once.
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) << 23) as u32);
    let s2 = f32::from_bits((n2.wrapping_add(127) << 23) as u32);
    p * s1 * s2
}

/// log2(x), within 2 ulp; log2(0) = -inf, log2(x<0) = NaN, log2(inf) = inf.
#[inline(always)]
pub fn log2<const F: bool>(x: f32) -> f32 {
    // Subnormals: scale into the normal range first.
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 8388608.0 } else { x };
    let bits = xs.to_bits() as i32;
    let mut e = ((bits >> 23) & 0xff).wrapping_sub(126);
    if tiny {
        e = e.wrapping_sub(23);
    }
    // Mantissa in [0.5, 1).
    let m = f32::from_bits(((bits & 0x007f_ffff) | 0x3f00_0000) as u32);
    // Fold to [sqrt(1/2), sqrt(2)) and take f = m - 1 (Cephes log2f).
    let small = m < std::f32::consts::FRAC_1_SQRT_2;
    let e = if small { e.wrapping_sub(1) } else { e };
    let f = if small { m + m - 1.0 } else { m - 1.0 };
    let z = f * f;
    let mut p = 7.037_683_6e-2;
    p = fma::<F>(p, f, -1.151_461e-1);
    p = fma::<F>(p, f, 1.167_699_9e-1);
    p = fma::<F>(p, f, -1.242_014_1e-1);
    p = fma::<F>(p, f, 1.424_932_3e-1);
    p = fma::<F>(p, f, -1.666_805_8e-1);
    p = fma::<F>(p, f, 2.000_071_4e-1);
    p = fma::<F>(p, f, -2.499_999_4e-1);
    p = fma::<F>(p, f, 3.333_333e-1);
    let y = fma::<F>(f * z, p, -0.5 * z);
    // log2(1 + f) = (f + y) * log2(e), with log2(e) = 1 + 0.44269504 for accuracy.
    const LOG2EA: f32 = 0.442_695_04;
    let mut r = y * LOG2EA;
    r = fma::<F>(f, LOG2EA, r);
    r += y;
    r += f;
    r += e as f32;
    let r = if x == f32::INFINITY { x } else { r };
    let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
    // Negative or NaN.
    if x >= 0.0 {
        r
    } else {
        f32::NAN
    }
}

/// Largest |x| the vector `sin` reduces accurately; beyond it (and for inf/NaN) the slice
/// kernel patches in libm's `sin`.
pub const SIN_MAX: f32 = 8192.0;

/// Whether `sin(x)` needs libm (|x| above [`SIN_MAX`], inf or NaN).
#[allow(clippy::neg_cmp_op_on_partial_ord)] // true for NaN on purpose
#[inline(always)]
pub fn sin_big(x: f32) -> bool {
    !(x.abs() <= SIN_MAX)
}

/// sin(x) for |x| <= [`SIN_MAX`] (Cephes sinf: octant reduction with a three-part pi/4,
/// then a degree-7 sine or degree-8 cosine polynomial), about 1 ulp.
#[inline(always)]
pub fn sin_reduced<const F: bool>(x: f32) -> f32 {
    const FOPI: f32 = 1.273_239_5; // 4 / pi
    const DP1: f32 = 0.785_156_25;
    const DP2: f32 = 2.418_756_5e-4;
    const DP3: f32 = 3.774_895e-8;
    let ax = x.abs();
    // j = floor(ax * 4/pi), made even by rounding odd octants up.
    let v = ax * FOPI;
    let t = v + 8388608.0; // 2^23: integer part in the low mantissa bits (v < 2^22)
    let r = t - 8388608.0;
    let jf = if r > v { r - 1.0 } else { r };
    let j = ((jf + 8388608.0).to_bits() as i32).wrapping_sub(0x4B00_0000);
    let odd = (j & 1) != 0;
    let j = if odd { j.wrapping_add(1) } else { j };
    let y = if odd { jf + 1.0 } else { jf };
    let j = j & 7;
    let flip = j > 3;
    let j = if flip { j - 4 } else { j };
    let xr = ((ax - y * DP1) - y * DP2) - y * DP3;
    let z = xr * xr;
    let mut s = -1.951_529_6e-4;
    s = fma::<F>(s, z, 8.332_161e-3);
    s = fma::<F>(s, z, -1.666_665_5e-1);
    let s = fma::<F>(s * z, xr, xr);
    let mut c = 2.443_315_7e-5;
    c = fma::<F>(c, z, -1.388_731_6e-3);
    c = fma::<F>(c, z, 4.166_664_6e-2);
    let c = fma::<F>(c * z, z, fma::<F>(-0.5, z, 1.0));
    let v = if j == 1 || j == 2 { c } else { s };
    // Sign: of x, flipped in the lower half-turn.
    let sign = (x.to_bits() ^ if flip { 0x8000_0000 } else { 0 }) & 0x8000_0000;
    f32::from_bits(v.to_bits() ^ sign)
}

// ---------------------------------------------------------------------------- slice loops

#[inline(always)]
pub fn unary<const F: bool>(op: UnaryOp, a: &[f32], out: &mut [f32]) {
    let n = out.len();
    let a = &a[..n];
    match op {
        UnaryOp::Exp2 => {
            for i in 0..n {
                out[i] = exp2::<F>(a[i]);
            }
        }
        UnaryOp::Log2 => {
            for i in 0..n {
                out[i] = log2::<F>(a[i]);
            }
        }
        UnaryOp::Sin => {
            let mut big = false;
            for i in 0..n {
                out[i] = sin_reduced::<F>(a[i]);
                big |= sin_big(a[i]);
            }
            if big {
                for i in 0..n {
                    if sin_big(a[i]) {
                        out[i] = a[i].sin();
                    }
                }
            }
        }
        UnaryOp::Sqrt => {
            for i in 0..n {
                out[i] = a[i].sqrt();
            }
        }
        UnaryOp::Recip => {
            for i in 0..n {
                out[i] = 1.0 / a[i];
            }
        }
    }
}

/// A unary op of one value (scalar steps of a fused program).
#[inline(always)]
pub fn unary_one<const F: bool>(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Exp2 => exp2::<F>(x),
        UnaryOp::Log2 => log2::<F>(x),
        UnaryOp::Sin if x.abs() <= SIN_MAX => sin_reduced::<F>(x),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
    }
}

#[inline(always)]
pub fn binary_one(op: BinaryOp, x: f32, y: f32) -> f32 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Mul => x * y,
        // Rust's `%` on floats is C fmod (sign of the dividend), as the reference.
        BinaryOp::Mod => x % y,
        BinaryOp::LessThan => (x < y) as u8 as f32,
    }
}

macro_rules! zip2 {
    ($out:ident, $a:ident, $b:ident, |$x:ident, $y:ident| $e:expr) => {{
        let n = $out.len();
        let ($a, $b) = (&$a[..n], &$b[..n]);
        for i in 0..n {
            let ($x, $y) = ($a[i], $b[i]);
            $out[i] = $e;
        }
    }};
}

/// `out = a op b`, elementwise.
#[inline(always)]
pub fn binary(op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    match op {
        BinaryOp::Add => zip2!(out, a, b, |x, y| x + y),
        BinaryOp::Mul => zip2!(out, a, b, |x, y| x * y),
        BinaryOp::Mod => zip2!(out, a, b, |x, y| x % y),
        BinaryOp::LessThan => zip2!(out, a, b, |x, y| (x < y) as u8 as f32),
    }
}

/// NaN-propagating maximum (the reference's `MaxReduce` combine of two values; which zero
/// `max(-0, +0)` gives is unspecified there too).
#[inline(always)]
pub fn max_one(x: f32, y: f32) -> f32 {
    if x > y || x.is_nan() {
        x
    } else {
        y
    }
}

/// `out = max(a, b)`, elementwise ([`max_one`]).
#[inline(always)]
pub fn max(a: &[f32], b: &[f32], out: &mut [f32]) {
    zip2!(out, a, b, |x, y| max_one(x, y))
}

/// `out = max(a, s)`, elementwise ([`max_one`]).
#[inline(always)]
pub fn max_scalar(a: &[f32], s: f32, out: &mut [f32]) {
    let n = out.len();
    let a = &a[..n];
    for i in 0..n {
        out[i] = max_one(a[i], s);
    }
}

macro_rules! map1 {
    ($out:ident, $a:ident, |$x:ident| $e:expr) => {{
        let n = $out.len();
        let $a = &$a[..n];
        for i in 0..n {
            let $x = $a[i];
            $out[i] = $e;
        }
    }};
}

/// `out = a op s` (`scalar_first`: `out = s op a`).
#[inline(always)]
pub fn binary_scalar(op: BinaryOp, a: &[f32], s: f32, scalar_first: bool, out: &mut [f32]) {
    match (op, scalar_first) {
        (BinaryOp::Add, _) => map1!(out, a, |x| x + s),
        (BinaryOp::Mul, _) => map1!(out, a, |x| x * s),
        (BinaryOp::Mod, false) => map1!(out, a, |x| x % s),
        (BinaryOp::Mod, true) => map1!(out, a, |x| s % x),
        (BinaryOp::LessThan, false) => map1!(out, a, |x| (x < s) as u8 as f32),
        (BinaryOp::LessThan, true) => map1!(out, a, |x| (s < x) as u8 as f32),
    }
}

/// One op of a fused chain, applied to the chain's running value `acc` (see [`chain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainOp {
    /// `acc op b` (`swap`: `b op acc`).
    Binary {
        op: BinaryOp,
        swap: bool,
    },
    /// `max(acc, b)` ([`max_one`]; the order of the operands is immaterial).
    Max,
    Unary(UnaryOp),
    /// `acc != 0` as 0/1.
    NotZero,
    /// `acc` rounded to a half type.
    Round(HalfKind),
}

/// The second operand of a [`ChainOp`], if it has one.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    None,
    Scalar(f32),
    /// Read at the same positions as the chain's first operand.
    Vector(&'a [f32]),
}

/// `out = ops(a)`: starting from `a`, each op of `ops` is applied to the running value in
/// turn, and every op rounds as the unfused op would (results are identical). On x86 with
/// AVX2 the running value lives in registers, 64 elements at a time ([`chain_tiles_avx2`]),
/// so a chain of any length reads each input once and writes `out` once; elsewhere it is
/// accumulated in `out` (cache-resident blocks), one pass per op or common pair of ops.
/// `stream` (AVX2 tiles only): write `out` with non-temporal stores (the caller fences). At
/// most 16 ops.
#[inline(always)]
pub fn chain<const F: bool>(
    a: &[f32],
    ops: &[(ChainOp, Operand<'_>)],
    out: &mut [f32],
    stream: bool,
) {
    chain_with::<F>(a, ops, out, stream, crate::halfvec::fast())
}

/// [`chain`], with the AVX2 tile loop (`avx2`: the CPU must have AVX2, FMA and F16C) or the
/// portable one.
#[inline(always)]
fn chain_with<const F: bool>(
    a: &[f32],
    ops: &[(ChainOp, Operand<'_>)],
    out: &mut [f32],
    stream: bool,
    avx2: bool,
) {
    let n = out.len();
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        debug_assert!(
            detected_isa() >= Isa::Avx2 && std::arch::is_x86_feature_detected!("f16c"),
            "AVX2 tiles on a CPU without AVX2 / F16C"
        );
        // Streamed tiles start at a 16-byte boundary (heap buffers already do).
        let head = if stream {
            out.as_ptr().align_offset(16).min(n)
        } else {
            0
        };
        chain_in_out::<F>(a, ops, 0, &mut out[..head]);
        // SAFETY: the caller passes `avx2` only when AVX2, FMA and F16C were detected on this
        // CPU (`chain`: `halfvec::fast()`; the tests check the same).
        i = unsafe { chain_tiles_avx2::<F>(a, ops, head, out, stream) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx2;
    assert!(avx2 || !stream, "streamed chains need the AVX2 tiles");
    chain_in_out::<F>(a, ops, i, &mut out[i..]);
}

/// Elements `i .. i + out.len()` of a chain, accumulated in `out`: one pass over it per op
/// (or common pair of ops).
#[inline(always)]
fn chain_in_out<const F: bool>(
    a: &[f32],
    ops: &[(ChainOp, Operand<'_>)],
    i: usize,
    out: &mut [f32],
) {
    let t = out.len();
    if t == 0 {
        return;
    }
    out.copy_from_slice(&a[i..i + t]);
    let (tile_ops, n_tile_ops) = tile_ops(ops);
    // The merged pairs in one pass; every other op through `chain_in_place`.
    for &op in &tile_ops[..n_tile_ops] {
        match op {
            TileOp::MulSAddS(m, c) => {
                for p in out.iter_mut() {
                    *p = *p * m + c;
                }
            }
            TileOp::MulSAddV(m, v) => {
                for (p, &y) in out.iter_mut().zip(&v[i..i + t]) {
                    *p = *p * m + y;
                }
            }
            TileOp::MulVAddV(u, v) => {
                let (u, v) = (&u[i..i + t], &v[i..i + t]);
                for ((p, &x), &y) in out.iter_mut().zip(u).zip(v) {
                    *p = *p * x + y;
                }
            }
            other => {
                let (op, b) = other.chain_op();
                chain_in_place::<F>(op, b, i, out);
            }
        }
    }
}

/// One op of a chain in place: `x = op(x, b)` where `x` holds the running value of elements
/// `i .. i + x.len()`.
#[inline(always)]
fn chain_in_place<const F: bool>(op: ChainOp, b: Operand<'_>, i: usize, x: &mut [f32]) {
    let t = x.len();
    macro_rules! with_v {
        ($v:ident, |$p:ident, $q:ident| $e:expr) => {{
            for ($p, &$q) in x.iter_mut().zip(&$v[i..i + t]) {
                *$p = $e;
            }
        }};
    }
    macro_rules! with_s {
        (|$p:ident| $e:expr) => {{
            for $p in x.iter_mut() {
                *$p = $e;
            }
        }};
    }
    // Add and Mul commute exactly, so `swap` does not matter for them; nor does the order of
    // max's operands.
    match (op, b) {
        (ChainOp::Binary { op, swap }, Operand::Vector(v)) => match (op, swap) {
            (BinaryOp::Add, _) => with_v!(v, |p, q| *p + q),
            (BinaryOp::Mul, _) => with_v!(v, |p, q| *p * q),
            (BinaryOp::Mod, false) => with_v!(v, |p, q| *p % q),
            (BinaryOp::Mod, true) => with_v!(v, |p, q| q % *p),
            (BinaryOp::LessThan, false) => with_v!(v, |p, q| (*p < q) as u8 as f32),
            (BinaryOp::LessThan, true) => with_v!(v, |p, q| (q < *p) as u8 as f32),
        },
        (ChainOp::Binary { op, swap }, Operand::Scalar(s)) => match (op, swap) {
            (BinaryOp::Add, _) => with_s!(|p| *p + s),
            (BinaryOp::Mul, _) => with_s!(|p| *p * s),
            (BinaryOp::Mod, false) => with_s!(|p| *p % s),
            (BinaryOp::Mod, true) => with_s!(|p| s % *p),
            (BinaryOp::LessThan, false) => with_s!(|p| (*p < s) as u8 as f32),
            (BinaryOp::LessThan, true) => with_s!(|p| (s < *p) as u8 as f32),
        },
        (ChainOp::Max, Operand::Vector(v)) => with_v!(v, |p, q| max_one(*p, q)),
        (ChainOp::Max, Operand::Scalar(s)) => with_s!(|p| max_one(*p, s)),
        (ChainOp::NotZero, _) => with_s!(|p| (*p != 0.0) as u8 as f32),
        // The slice loops read and write different buffers: a piece at a time via the stack.
        (ChainOp::Unary(_) | ChainOp::Round(_), _) => {
            let mut tmp = [0f32; 64];
            for piece in x.chunks_mut(64) {
                let tmp = &mut tmp[..piece.len()];
                tmp.copy_from_slice(piece);
                match op {
                    ChainOp::Unary(u) => unary::<F>(u, tmp, piece),
                    ChainOp::Round(kind) => crate::halfvec::round_block(kind, tmp, piece),
                    _ => unreachable!(),
                }
            }
        }
        (ChainOp::Binary { .. } | ChainOp::Max, Operand::None) => {
            unreachable!("a binary chain op without its operand")
        }
    }
}

/// A chain op as the tile loops run it: the common ops with their operand unpacked, the rest
/// through the in-place chunk loop.
#[derive(Clone, Copy)]
enum TileOp<'a> {
    AddV(&'a [f32]),
    MulV(&'a [f32]),
    AddS(f32),
    MulS(f32),
    MaxS(f32),
    RoundF16,
    RoundBF16,
    Exp2,
    Recip,
    Sqrt,
    Other(ChainOp, Operand<'a>),
    // Common pairs in one dispatch (each op still rounds): `acc · m + c`, `acc · m + v`,
    // `acc · u + v`.
    MulSAddS(f32, f32),
    MulSAddV(f32, &'a [f32]),
    MulVAddV(&'a [f32], &'a [f32]),
}

/// The tile ops of `ops` (at most 16), with common pairs of consecutive ops merged into one
/// (fewer dispatches per tile); returns them and their count.
fn tile_ops<'a>(ops: &[(ChainOp, Operand<'a>)]) -> ([TileOp<'a>; 16], usize) {
    let mut t = [TileOp::AddS(0.0); 16];
    for (t, &(op, b)) in t.iter_mut().zip(ops) {
        // Add and Mul commute exactly, so `swap` does not matter for them; nor does the
        // order of max's operands.
        let (add, mul) = (
            |op| {
                matches!(
                    op,
                    ChainOp::Binary {
                        op: BinaryOp::Add,
                        ..
                    }
                )
            },
            |op| {
                matches!(
                    op,
                    ChainOp::Binary {
                        op: BinaryOp::Mul,
                        ..
                    }
                )
            },
        );
        *t = match (op, b) {
            (op, Operand::Vector(v)) if add(op) => TileOp::AddV(v),
            (op, Operand::Vector(v)) if mul(op) => TileOp::MulV(v),
            (op, Operand::Scalar(s)) if add(op) => TileOp::AddS(s),
            (op, Operand::Scalar(s)) if mul(op) => TileOp::MulS(s),
            (ChainOp::Max, Operand::Scalar(s)) => TileOp::MaxS(s),
            (ChainOp::Round(HalfKind::F16), _) => TileOp::RoundF16,
            (ChainOp::Round(HalfKind::BF16), _) => TileOp::RoundBF16,
            (ChainOp::Unary(UnaryOp::Exp2), _) => TileOp::Exp2,
            (ChainOp::Unary(UnaryOp::Recip), _) => TileOp::Recip,
            (ChainOp::Unary(UnaryOp::Sqrt), _) => TileOp::Sqrt,
            _ => TileOp::Other(op, b),
        };
    }
    let (mut n, mut i) = (0, 0);
    while i < ops.len() {
        let merged = match (t[i], t.get(i + 1).copied().filter(|_| i + 1 < ops.len())) {
            (TileOp::MulS(m), Some(TileOp::AddS(c))) => Some(TileOp::MulSAddS(m, c)),
            (TileOp::MulS(m), Some(TileOp::AddV(v))) => Some(TileOp::MulSAddV(m, v)),
            (TileOp::MulV(u), Some(TileOp::AddV(v))) => Some(TileOp::MulVAddV(u, v)),
            _ => None,
        };
        t[n] = merged.unwrap_or(t[i]);
        i += if merged.is_some() { 2 } else { 1 };
        n += 1;
    }
    (t, n)
}

impl<'a> TileOp<'a> {
    /// The chain op (and operand) of a single tile op (not of the merged pairs).
    fn chain_op(self) -> (ChainOp, Operand<'a>) {
        let unary = |u| (ChainOp::Unary(u), Operand::None);
        let bin = |op| ChainOp::Binary { op, swap: false };
        match self {
            TileOp::AddV(v) => (bin(BinaryOp::Add), Operand::Vector(v)),
            TileOp::MulV(v) => (bin(BinaryOp::Mul), Operand::Vector(v)),
            TileOp::AddS(s) => (bin(BinaryOp::Add), Operand::Scalar(s)),
            TileOp::MulS(s) => (bin(BinaryOp::Mul), Operand::Scalar(s)),
            TileOp::MaxS(s) => (ChainOp::Max, Operand::Scalar(s)),
            TileOp::Other(op, b) => (op, b),
            TileOp::RoundF16 => (ChainOp::Round(HalfKind::F16), Operand::None),
            TileOp::RoundBF16 => (ChainOp::Round(HalfKind::BF16), Operand::None),
            TileOp::Exp2 => unary(UnaryOp::Exp2),
            TileOp::Recip => unary(UnaryOp::Recip),
            TileOp::Sqrt => unary(UnaryOp::Sqrt),
            TileOp::MulSAddS(..) | TileOp::MulSAddV(..) | TileOp::MulVAddV(..) => {
                unreachable!("a merged pair")
            }
        }
    }
}

/// [`exp2`] of eight lanes, operation for operation (the same results, bit for bit).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn exp2_avx2<const F: bool>(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let fma = |a, b, c| {
        if F {
            _mm256_fmadd_ps(a, b, c)
        } else {
            _mm256_add_ps(_mm256_mul_ps(a, b), c)
        }
    };
    // `max(c, x)` / `min(c, x)` return `x` when it is NaN, as the scalar clamps do.
    let x = _mm256_max_ps(_mm256_set1_ps(-151.0), x);
    let x = _mm256_min_ps(_mm256_set1_ps(129.0), x);
    let magic = _mm256_set1_ps(ROUND_MAGIC);
    let t = _mm256_add_ps(x, magic);
    let n = _mm256_sub_ps(t, magic);
    let r = _mm256_sub_ps(x, n);
    let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B40_0000));
    let mut p = _mm256_set1_ps(1.535_336_2e-4);
    p = fma(p, r, _mm256_set1_ps(1.339_887_4e-3));
    p = fma(p, r, _mm256_set1_ps(9.618_437e-3));
    p = fma(p, r, _mm256_set1_ps(5.550_332_5e-2));
    p = fma(p, r, _mm256_set1_ps(2.402_264_8e-1));
    p = fma(p, r, _mm256_set1_ps(6.931_472e-1));
    p = fma(p, r, _mm256_set1_ps(1.0));
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    _mm256_mul_ps(_mm256_mul_ps(p, s1), s2)
}

/// Elements of a chain's running value held at once by [`chain_tiles_avx2`]: eight of the
/// sixteen AVX registers (the per-op dispatch is paid once per tile).
#[cfg(target_arch = "x86_64")]
const AVX_TILE: usize = 64;

/// The whole tiles of [`chain`] from element `i` on, with the running value in AVX
/// registers (the compiler's vectorisation of the portable loop keeps it in memory).
/// Returns where the tiles ended.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chain_tiles_avx2<const F: bool>(
    a: &[f32],
    ops: &[(ChainOp, Operand<'_>)],
    mut i: usize,
    out: &mut [f32],
    stream: bool,
) -> usize {
    use std::arch::x86_64::*;
    let n = out.len();
    let (tile_ops, n_tile_ops) = tile_ops(ops);
    let tile_ops = &tile_ops[..n_tile_ops];
    // Every vector operand covers the chain's elements (checked once, not per tile).
    assert!(a.len() >= n);
    for op in tile_ops {
        match *op {
            TileOp::AddV(v) | TileOp::MulV(v) | TileOp::MulSAddV(_, v) => assert!(v.len() >= n),
            TileOp::MulVAddV(u, v) => assert!(u.len() >= n && v.len() >= n),
            _ => {}
        }
    }
    while i + AVX_TILE <= n {
        // SAFETY (all loads and stores below): `i + AVX_TILE <= n` and every slice read holds
        // at least `n` elements (asserted above); stores go to `out[i .. i + AVX_TILE]`, which
        // is 16-byte aligned when streaming (`chain`'s head).
        let ld = |p: &[f32], k: usize| unsafe { _mm256_loadu_ps(p.as_ptr().add(i + 8 * k)) };
        let mut acc: [__m256; AVX_TILE / 8] = std::array::from_fn(|k| ld(a, k));
        for &op in tile_ops {
            match op {
                TileOp::AddV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_add_ps(*x, ld(v, k));
                    }
                }
                TileOp::MulV(v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_mul_ps(*x, ld(v, k));
                    }
                }
                TileOp::AddS(s) => {
                    let s = _mm256_set1_ps(s);
                    for x in acc.iter_mut() {
                        *x = _mm256_add_ps(*x, s);
                    }
                }
                TileOp::MulS(s) => {
                    let s = _mm256_set1_ps(s);
                    for x in acc.iter_mut() {
                        *x = _mm256_mul_ps(*x, s);
                    }
                }
                TileOp::MaxS(s) => {
                    // `max_one`: x where x > s or x is NaN, else s.
                    let s = _mm256_set1_ps(s);
                    for x in acc.iter_mut() {
                        let keep = _mm256_or_ps(
                            _mm256_cmp_ps::<_CMP_GT_OQ>(*x, s),
                            _mm256_cmp_ps::<_CMP_UNORD_Q>(*x, *x),
                        );
                        *x = _mm256_blendv_ps(s, *x, keep);
                    }
                }
                // Separate mul and add instructions, never an FMA: each op rounds.
                TileOp::MulSAddS(m, c) => {
                    let (m, c) = (_mm256_set1_ps(m), _mm256_set1_ps(c));
                    for x in acc.iter_mut() {
                        *x = _mm256_add_ps(_mm256_mul_ps(*x, m), c);
                    }
                }
                TileOp::MulSAddV(m, v) => {
                    let m = _mm256_set1_ps(m);
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_add_ps(_mm256_mul_ps(*x, m), ld(v, k));
                    }
                }
                TileOp::MulVAddV(u, v) => {
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_add_ps(_mm256_mul_ps(*x, ld(u, k)), ld(v, k));
                    }
                }
                TileOp::Exp2 => {
                    for x in acc.iter_mut() {
                        *x = exp2_avx2::<F>(*x);
                    }
                }
                TileOp::Recip => {
                    let one = _mm256_set1_ps(1.0);
                    for x in acc.iter_mut() {
                        *x = _mm256_div_ps(one, *x);
                    }
                }
                TileOp::Sqrt => {
                    for x in acc.iter_mut() {
                        *x = _mm256_sqrt_ps(*x);
                    }
                }
                TileOp::RoundF16 => {
                    for x in acc.iter_mut() {
                        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*x);
                        *x = _mm256_cvtph_ps(h);
                    }
                }
                TileOp::RoundBF16 => {
                    // `halfvec::bf16_round`: add 0x7FFF plus the kept lowest bit, clear the
                    // low half; a NaN keeps its upper bits, quieted.
                    let one = _mm256_set1_epi32(1);
                    let bias = _mm256_set1_epi32(0x7FFF);
                    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
                    let quiet = _mm256_set1_epi32(0x0040_0000);
                    for x in acc.iter_mut() {
                        let b = _mm256_castps_si256(*x);
                        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), one);
                        let r = _mm256_add_epi32(b, _mm256_add_epi32(bias, lsb));
                        let r = _mm256_and_si256(r, high);
                        let nan = _mm256_and_si256(_mm256_or_si256(b, quiet), high);
                        let is_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(*x, *x);
                        *x = _mm256_blendv_ps(
                            _mm256_castsi256_ps(r),
                            _mm256_castsi256_ps(nan),
                            is_nan,
                        );
                    }
                }
                TileOp::Other(op, b) => {
                    let mut t = [0f32; AVX_TILE];
                    for (k, x) in acc.iter().enumerate() {
                        _mm256_storeu_ps(t.as_mut_ptr().add(8 * k), *x);
                    }
                    chain_in_place::<F>(op, b, i, &mut t);
                    for (k, x) in acc.iter_mut().enumerate() {
                        *x = _mm256_loadu_ps(t.as_ptr().add(8 * k));
                    }
                }
            }
        }
        let o = out.as_mut_ptr().add(i);
        for (k, x) in acc.iter().enumerate() {
            if stream {
                // 16-byte streams: heap buffers are 16-byte aligned, so the whole block
                // runs as tiles (measured as fast as 32-byte streams).
                _mm_stream_ps(o.add(8 * k), _mm256_castps256_ps128(*x));
                _mm_stream_ps(o.add(8 * k + 4), _mm256_extractf128_ps::<1>(*x));
            } else {
                _mm256_storeu_ps(o.add(8 * k), *x);
            }
        }
        i += AVX_TILE;
    }
    i
}

#[inline(always)]
pub fn not_zero(a: &[f32], out: &mut [f32]) {
    map1!(out, a, |x| (x != 0.0) as u8 as f32)
}

// ---------------------------------------------------------------------------- reductions

/// Lanes of a row accumulator: independent partial results, so the loop vectorises (and
/// sums pairwise-ish, more accurately than one serial f32 sum).
const LANES: usize = 32;

/// The value a reduction of nothing gives.
#[inline(always)]
pub fn reduce_identity(op: ReduceOp) -> f32 {
    if op == ReduceOp::Sum {
        0.0
    } else {
        f32::NEG_INFINITY
    }
}

/// A running sum (`MAX = false`) or max (`MAX = true`) over slices. The op is a type
/// parameter so the loops compile to plain vector adds / maxes with the lanes in
/// registers. A max lane that meets a NaN stays NaN (NaN propagates, like the reference
/// and PyTorch).
#[derive(Clone, Copy)]
pub struct Acc<const MAX: bool> {
    lanes: [f32; LANES],
}

/// One max step: NaN in either operand gives NaN, and a NaN accumulator stays NaN.
#[inline(always)]
fn max_step(acc: f32, x: f32) -> f32 {
    if x > acc || x.is_nan() {
        x
    } else {
        acc
    }
}

impl<const MAX: bool> Acc<MAX> {
    const IDENTITY: f32 = if MAX { f32::NEG_INFINITY } else { 0.0 };

    #[inline(always)]
    pub fn new() -> Self {
        Acc {
            lanes: [Self::IDENTITY; LANES],
        }
    }

    #[inline(always)]
    fn step(a: f32, x: f32) -> f32 {
        if MAX {
            max_step(a, x)
        } else {
            a + x
        }
    }

    #[inline(always)]
    pub fn add_slice(&mut self, xs: &[f32]) {
        // The auto-vectoriser splits these lanes unpredictably depending on the
        // surrounding code; with AVX the loop is written out with intrinsics.
        #[cfg(target_arch = "x86_64")]
        if isa() >= Isa::Avx2 {
            // SAFETY: `isa()` reports AVX2 (hence AVX) was detected on this CPU.
            unsafe { add_slice_avx::<MAX>(&mut self.lanes, xs) };
            return;
        }
        self.add_slice_generic(xs)
    }

    // Indexed lanes keep the accumulators in registers (the point of the loop).
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn add_slice_generic(&mut self, xs: &[f32]) {
        let mut chunks = xs.chunks_exact(LANES);
        let mut l = self.lanes;
        for c in &mut chunks {
            for i in 0..LANES {
                l[i] = Self::step(l[i], c[i]);
            }
        }
        // The tail goes through an identity-padded copy: indexing `l` only by constants
        // keeps the accumulators in registers.
        let rem = chunks.remainder();
        let mut tail = [Self::IDENTITY; LANES];
        tail[..rem.len()].copy_from_slice(rem);
        for i in 0..LANES {
            l[i] = Self::step(l[i], tail[i]);
        }
        self.lanes = l;
    }

    #[inline(always)]
    pub fn add_one(&mut self, x: f32) {
        self.lanes[0] = Self::step(self.lanes[0], x);
    }

    #[inline(always)]
    pub fn finish(&self) -> f32 {
        // Fold 8-lane groups first (the same shape as the main loop's vectors, so the
        // vectoriser keeps whole-register lanes), then the last 8 in order.
        let l = self.lanes;
        let mut g = [Self::IDENTITY; 8];
        for j in 0..LANES / 8 {
            for i in 0..8 {
                g[i] = Self::step(g[i], l[j * 8 + i]);
            }
        }
        let mut r = Self::IDENTITY;
        for x in g {
            r = Self::step(r, x);
        }
        r
    }
}

/// [`Acc::add_slice`] with AVX intrinsics: four 8-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn add_slice_avx<const MAX: bool>(l: &mut [f32; LANES], xs: &[f32]) {
    use std::arch::x86_64::*;
    #[inline(always)]
    unsafe fn step<const MAX: bool>(a: __m256, x: __m256) -> __m256 {
        if MAX {
            // x > a, or x is NaN: take x (NaN sticks: nothing compares greater than NaN
            // and a NaN accumulator is never replaced by a number).
            let take = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_GT_OQ>(x, a),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x),
            );
            _mm256_blendv_ps(a, x, take)
        } else {
            _mm256_add_ps(a, x)
        }
    }
    let p = l.as_mut_ptr();
    let (mut a0, mut a1, mut a2, mut a3) = (
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    );
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        let q = c.as_ptr();
        a0 = step::<MAX>(a0, _mm256_loadu_ps(q));
        a1 = step::<MAX>(a1, _mm256_loadu_ps(q.add(8)));
        a2 = step::<MAX>(a2, _mm256_loadu_ps(q.add(16)));
        a3 = step::<MAX>(a3, _mm256_loadu_ps(q.add(24)));
    }
    _mm256_storeu_ps(p, a0);
    _mm256_storeu_ps(p.add(8), a1);
    _mm256_storeu_ps(p.add(16), a2);
    _mm256_storeu_ps(p.add(24), a3);
    for (i, &x) in chunks.remainder().iter().enumerate() {
        l[i] = Acc::<MAX>::step(l[i], x);
    }
}

/// Runs `$body` with `$M` bound to the const `MAX` flag of reduce op `$op`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_reduce {
    ($op:expr, |$M:ident| $body:expr) => {
        match $op {
            luminal::op::ReduceOp::Sum => {
                const $M: bool = false;
                $body
            }
            luminal::op::ReduceOp::Max => {
                const $M: bool = true;
                $body
            }
        }
    };
}

/// `dst[i] = dst[i] op src[i]` (the strided reduction's combine step).
#[inline(always)]
pub fn combine(op: ReduceOp, dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    let src = &src[..n];
    match op {
        ReduceOp::Sum => {
            for i in 0..n {
                dst[i] += src[i];
            }
        }
        ReduceOp::Max => {
            for i in 0..n {
                dst[i] = max_nan(dst[i], src[i]);
            }
        }
    }
}

/// Max that propagates NaN (like the reference and PyTorch).
#[inline(always)]
pub fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if b > a {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        if a == b || (a.is_nan() && b.is_nan()) {
            return 0;
        }
        if a.is_nan() || b.is_nan() || a.signum() != b.signum() {
            return u32::MAX;
        }
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    /// Every 97th f32 bit pattern (plus the specials), both signs.
    fn samples() -> impl Iterator<Item = f32> {
        (0..u32::MAX / 97).map(|i| f32::from_bits(i * 97)).chain([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ])
    }

    #[test]
    fn exp2_within_2_ulp() {
        for x in samples() {
            let want = (x as f64).exp2() as f32;
            let got = exp2::<true>(x);
            assert!(ulps(got, want) <= 2, "exp2({x:e}) = {got:e}, want {want:e}");
            let got = exp2::<false>(x);
            assert!(ulps(got, want) <= 2, "exp2({x:e}) = {got:e}, want {want:e}");
        }
    }

    #[test]
    fn log2_within_2_ulp() {
        for x in samples() {
            let want = (x as f64).log2() as f32;
            let got = log2::<true>(x);
            assert!(ulps(got, want) <= 2, "log2({x:e}) = {got:e}, want {want:e}");
            let got = log2::<false>(x);
            assert!(ulps(got, want) <= 2, "log2({x:e}) = {got:e}, want {want:e}");
        }
    }

    #[test]
    fn sin_close_to_libm() {
        for x in samples() {
            let want = (x as f64).sin();
            let got = unary_one::<true>(UnaryOp::Sin, x) as f64;
            if want.is_nan() {
                assert!(got.is_nan(), "sin({x:e}) = {got:e}");
                continue;
            }
            // Absolute error 2^-24 plus 2 ulp relative (the reduction is exact to ~1e-11
            // of |x| below SIN_MAX).
            let tol = 6e-8 + 2.5e-7 * want.abs() + 1e-11 * (x as f64).abs();
            assert!(
                (got - want).abs() <= tol,
                "sin({x:e}) = {got:e}, want {want:e}"
            );
        }
    }

    /// The AVX2 chain tiles' `exp2` is the scalar one, bit for bit, on every 97th f32.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp2_avx2_matches_scalar() {
        if !crate::halfvec::fast() {
            return;
        }
        let xs: Vec<f32> = samples().collect();
        for c in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: AVX2 and FMA were detected (`fast()`); `c` and `got` hold 8 floats.
            unsafe {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn run(c: &[f32], got: &mut [f32; 8]) {
                    use std::arch::x86_64::*;
                    let v = exp2_avx2::<true>(_mm256_loadu_ps(c.as_ptr()));
                    _mm256_storeu_ps(got.as_mut_ptr(), v);
                }
                run(c, &mut got);
            }
            for (x, g) in c.iter().zip(got) {
                let want = exp2::<true>(*x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "exp2({x:e}) = {g:e}, want {want:e}"
                );
            }
        }
    }

    #[test]
    fn slices_match_scalars() {
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.37).collect();
        let mut out = vec![0.0; xs.len()];
        for op in [
            UnaryOp::Exp2,
            UnaryOp::Log2,
            UnaryOp::Sin,
            UnaryOp::Sqrt,
            UnaryOp::Recip,
        ] {
            unary::<true>(op, &xs, &mut out);
            for (x, o) in xs.iter().zip(&out) {
                let want = unary_one::<true>(op, *x);
                assert!(o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()));
            }
        }
    }

    /// `chain` (every tile path, streamed or not, any output alignment) gives bit for bit
    /// what applying its ops one at a time with the scalar functions gives.
    #[test]
    fn chains_match_op_by_op() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        // Zeros, infinities, NaNs (one signalling), overflow, and ties of both half types.
        let specials = [
            0.0,
            -0.0,
            f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            f32::MAX,
            -3.5,
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            1.0 + 2f32.powi(-11),
            -(1.0 + 3.0 * 2f32.powi(-11)),
            65520.0,
        ];
        let value = |rand: &mut dyn FnMut(usize) -> usize| {
            if rand(6) == 0 {
                specials[rand(specials.len())]
            } else {
                (rand(20001) as f32 - 10000.0) / 997.0
            }
        };
        let kinds = [
            ChainOp::Binary {
                op: BinaryOp::Add,
                swap: false,
            },
            ChainOp::Binary {
                op: BinaryOp::Mul,
                swap: true,
            },
            ChainOp::Binary {
                op: BinaryOp::Mod,
                swap: false,
            },
            ChainOp::Binary {
                op: BinaryOp::Mod,
                swap: true,
            },
            ChainOp::Binary {
                op: BinaryOp::LessThan,
                swap: false,
            },
            ChainOp::Binary {
                op: BinaryOp::LessThan,
                swap: true,
            },
            ChainOp::Max,
            ChainOp::Unary(UnaryOp::Exp2),
            ChainOp::Unary(UnaryOp::Log2),
            ChainOp::Unary(UnaryOp::Sin),
            ChainOp::Unary(UnaryOp::Sqrt),
            ChainOp::Unary(UnaryOp::Recip),
            ChainOp::NotZero,
            ChainOp::Round(HalfKind::F16),
            ChainOp::Round(HalfKind::BF16),
        ];
        let avx2_options: &[bool] = if crate::halfvec::fast() {
            &[false, true]
        } else {
            &[false]
        };
        for case in 0..600 {
            // The first cases: one op on every special value (each in every position of a
            // tile, so every tile path meets it).
            let first = case < kinds.len();
            let n = if first { 200 } else { rand(300) };
            let a: Vec<f32> = (0..n)
                .map(|i| {
                    if first {
                        specials[i % specials.len()]
                    } else {
                        value(&mut rand)
                    }
                })
                .collect();
            let vectors: Vec<Vec<f32>> = (0..3)
                .map(|_| (0..n).map(|_| value(&mut rand)).collect())
                .collect();
            enum B {
                None,
                S(f32),
                V(usize),
            }
            let mut spec = vec![];
            for _ in 0..if first { 1 } else { 1 + rand(16) } {
                // Mostly Add / Mul (the register paths), the rest evenly.
                let op = if first {
                    kinds[case]
                } else if rand(2) == 0 {
                    kinds[rand(2)]
                } else {
                    kinds[rand(kinds.len())]
                };
                let b = match op {
                    ChainOp::Binary { .. } | ChainOp::Max => {
                        if rand(2) == 0 {
                            B::S(value(&mut rand))
                        } else {
                            B::V(rand(3))
                        }
                    }
                    _ => B::None,
                };
                spec.push((op, b));
            }
            let ops: Vec<(ChainOp, Operand<'_>)> = spec
                .iter()
                .map(|(op, b)| {
                    let b = match *b {
                        B::None => Operand::None,
                        B::S(s) => Operand::Scalar(s),
                        B::V(j) => Operand::Vector(&vectors[j]),
                    };
                    (*op, b)
                })
                .collect();
            let want: Vec<f32> = (0..n)
                .map(|i| {
                    spec.iter().fold(a[i], |x, (op, b)| {
                        let y = match *b {
                            B::None => 0.0,
                            B::S(s) => s,
                            B::V(j) => vectors[j][i],
                        };
                        match *op {
                            ChainOp::Binary { op, swap: false } => binary_one(op, x, y),
                            ChainOp::Binary { op, swap: true } => binary_one(op, y, x),
                            ChainOp::Max => max_one(x, y),
                            ChainOp::Unary(u) => unary_one::<true>(u, x),
                            ChainOp::NotZero => (x != 0.0) as u8 as f32,
                            ChainOp::Round(kind) => crate::halfvec::round_one(kind, x),
                        }
                    })
                })
                .collect();
            for &avx2 in avx2_options {
                for stream in [false, avx2] {
                    let skew = rand(8);
                    let mut buf = vec![f32::NAN; n + 8];
                    let out = &mut buf[skew..skew + n];
                    chain_with::<true>(&a, &ops, out, stream, avx2);
                    store_fence();
                    for i in 0..n {
                        let (got, w) = (out[i], want[i]);
                        assert!(
                            got.to_bits() == w.to_bits() || (got.is_nan() && w.is_nan()),
                            "case {case} (n {n}, avx2 {avx2}, stream {stream}, skew {skew}): \
                             element {i} = {got:e}, want {w:e}; ops {:?}",
                            spec.iter().map(|s| s.0).collect::<Vec<_>>()
                        );
                    }
                }
            }
        }
    }
}
