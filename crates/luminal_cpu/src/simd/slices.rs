//! Elementwise loops over slices: unary, binary, max, scalar-operand maps.

use super::*;

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

#[inline(always)]
pub fn not_zero(a: &[f32], out: &mut [f32]) {
    map1!(out, a, |x| (x != 0.0) as u8 as f32)
}

/// A function of one value that a fused program evaluates in one step instead of the
/// primops it was built from (recognised by a core matcher, see `lower`). Each evaluates
/// the same ops in the same order as the primops (no fused multiply-add), so it differs
/// from them only where `exp2` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FnOp {
    /// `GraphTensor::gelu_tanh`: `x / (1 + 2^(x·(x·x·k₂ + k₁)))`.
    GeluTanh,
    /// `GraphTensor::gelu_tanh_grad`: `s·(x·q·(1 − s) + 1)`, `s = 1 / (1 + 2^w)` as above,
    /// `q = x·x·c₂ + c₁`.
    GeluTanhGrad,
    /// `GraphTensor::gelu` (erf form): `(x + |x|)·½ + c·q·½`, `c = max(−|x|, −12)`,
    /// `q = poly(1 / (c·(−p) + 1)) · 2^(c·c·e)`.
    GeluErf,
}

impl FnOp {
    pub fn name(self) -> &'static str {
        match self {
            FnOp::GeluTanh => "GeluTanh",
            FnOp::GeluTanhGrad => "GeluTanhGrad",
            FnOp::GeluErf => "GeluErf",
        }
    }
}

/// The constants of [`FnOp`]: `(k₁, k₂, c₁, c₂)`, from the core's builders.
#[inline]
fn fn_constants() -> (f32, f32, f32, f32) {
    let (k1, k2) = luminal::hl_ops::gelu_tanh_constants();
    let (c1, c2) = luminal::hl_ops::gelu_tanh_grad_constants();
    (k1, k2, c1, c2)
}

#[inline(always)]
fn gelu_tanh_parts<const F: bool>(x: f32, k1: f32, k2: f32) -> (f32, f32) {
    let xx = x * x;
    let w = x * (xx * k2 + k1);
    (xx, 1.0 / (exp2::<F>(w) + 1.0))
}

/// `GraphTensor::gelu` of one value, op for op (`p`, `e`: `gelu_constants`).
#[inline(always)]
fn gelu_erf<const F: bool>(x: f32, p: f32, e: f32) -> f32 {
    let a = luminal::hl_ops::ERF_A;
    let ax = max_one(x, x * -1.0);
    let c = max_one(ax * -1.0, -12.0);
    let t = 1.0 / (c * -p + 1.0);
    let mut poly = t * a[4];
    poly = (poly + a[3]) * t;
    poly = (poly + a[2]) * t;
    poly = (poly + a[1]) * t;
    poly = (poly + a[0]) * t;
    let q = poly * exp2::<F>(c * c * e);
    (x + ax) * 0.5 + c * q * 0.5
}

/// [`FnOp`] of one value.
#[inline(always)]
pub fn fn_one<const F: bool>(op: FnOp, x: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if F && isa() == Isa::Avx512 {
        // The vector path's arithmetic, so that a value does not depend on whether it was
        // computed alone or in a slice.
        let mut out = [0f32];
        // SAFETY: AVX-512F is present (`isa`).
        unsafe { fn_slice_avx512(op, &[x], &mut out) };
        return out[0];
    }
    if op == FnOp::GeluErf {
        let (p, e) = luminal::hl_ops::gelu_constants();
        return gelu_erf::<F>(x, p, e);
    }
    let (k1, k2, c1, c2) = fn_constants();
    let (xx, s) = gelu_tanh_parts::<F>(x, k1, k2);
    match op {
        FnOp::GeluTanh => x * s,
        _ => s * (x * (xx * c2 + c1) * (s * -1.0 + 1.0) + 1.0),
    }
}

/// [`FnOp`] over a slice (vectorised: the loop bodies are branch-free).
#[inline(always)]
pub fn fn_slice<const F: bool>(op: FnOp, a: &[f32], out: &mut [f32]) {
    let n = out.len();
    let a = &a[..n];
    #[cfg(target_arch = "x86_64")]
    if F && isa() == Isa::Avx512 {
        // SAFETY: AVX-512F is present (`isa`).
        unsafe { fn_slice_avx512(op, a, out) };
        return;
    }
    let (k1, k2, c1, c2) = fn_constants();
    match op {
        FnOp::GeluTanh => {
            for i in 0..n {
                let x = a[i];
                out[i] = x * gelu_tanh_parts::<F>(x, k1, k2).1;
            }
        }
        FnOp::GeluTanhGrad => {
            for i in 0..n {
                let x = a[i];
                let (xx, s) = gelu_tanh_parts::<F>(x, k1, k2);
                out[i] = s * (x * (xx * c2 + c1) * (s * -1.0 + 1.0) + 1.0);
            }
        }
        FnOp::GeluErf => {
            let (p, e) = luminal::hl_ops::gelu_constants();
            for i in 0..n {
                out[i] = gelu_erf::<F>(a[i], p, e);
            }
        }
    }
}

/// [`FnOp`] over a slice with AVX-512 (where [`fn_slice`] runs with fused multiply-adds and
/// the CPU has it), every value through the same sixteen-lane arithmetic ([`fn_avx512`];
/// the tail under a mask).
///
/// # Safety
/// AVX-512F must be present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn fn_slice_avx512(op: FnOp, a: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len().min(a.len());
    let (src, dst) = (a.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n`, within both slices.
        _mm512_storeu_ps(dst.add(i), fn_avx512(op, _mm512_loadu_ps(src.add(i))));
        i += 16;
    }
    if i < n {
        let m: __mmask16 = ((1u32 << (n - i)) - 1) as u16;
        // SAFETY: the mask covers lanes `i .. n` only.
        let v = _mm512_maskz_loadu_ps(m, src.add(i));
        _mm512_mask_storeu_ps(dst.add(i), m, fn_avx512(op, v));
    }
}

/// [`FnOp`] of sixteen lanes. Faster than the primops' own arithmetic, and within a few
/// ulp of it:
/// - `1 / d` is `vrcp14ps` refined by one Newton step (~1 ulp; `vdivps` on sixteen lanes
///   is one of the slowest instructions);
/// - `2^w` is [`exp2_softmax_avx512`] (`w` clamped to `[-127, 126]`: no infinities,
///   subnormals or zero lanes to patch); the logistic `1 / (1 + 2^w)` is 0 above
///   `w = 126` (it is below 2⁻¹²⁶ there).
///
/// NaN stays NaN, `gelu_tanh(−∞)` and `gelu(−∞)` are NaN and `+∞` maps to `+∞`, as the
/// primops give.
///
/// # Safety
/// AVX-512F must be present.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn fn_avx512(op: FnOp, x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let splat = _mm512_set1_ps;
    match op {
        FnOp::GeluTanh => _mm512_mul_ps(x, logistic_avx512(x).1),
        FnOp::GeluTanhGrad => {
            let (_, _, c1, c2) = fn_constants();
            let (xx, s) = logistic_avx512(x);
            let q = _mm512_fmadd_ps(xx, splat(c2), splat(c1));
            let t = _mm512_mul_ps(_mm512_mul_ps(x, q), _mm512_sub_ps(splat(1.0), s));
            _mm512_mul_ps(s, _mm512_add_ps(t, splat(1.0)))
        }
        FnOp::GeluErf => {
            let (ep, ee) = luminal::hl_ops::gelu_constants();
            let erf_a = luminal::hl_ops::ERF_A;
            let ax = _mm512_abs_ps(x);
            // c = max(−|x|, −12) (−12 for a NaN x, whose x + |x| keeps the result NaN).
            let c = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), ax), splat(-12.0));
            let t = recip_avx512(_mm512_fmadd_ps(c, splat(-ep), splat(1.0)));
            let mut poly = _mm512_mul_ps(t, splat(erf_a[4]));
            for &k in erf_a[..4].iter().rev() {
                poly = _mm512_mul_ps(_mm512_add_ps(poly, splat(k)), t);
            }
            // c²·e lies in [−104, 0]: no clamp needed.
            let e = exp2_softmax_avx512(_mm512_mul_ps(_mm512_mul_ps(c, c), splat(ee)));
            let q = _mm512_mul_ps(poly, e);
            let half = splat(0.5);
            _mm512_fmadd_ps(
                _mm512_add_ps(x, ax),
                half,
                _mm512_mul_ps(_mm512_mul_ps(c, q), half),
            )
        }
    }
}

/// `x²` and the logistic `1 / (1 + 2^w)`, `w = x·(x²·k₂ + k₁)`, of GELU's tanh form
/// (a NaN `w` counts as high: `s = 0`, and `x·s` stays NaN).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn logistic_avx512(
    x: std::arch::x86_64::__m512,
) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    let (k1, k2, _, _) = fn_constants();
    let splat = _mm512_set1_ps;
    let xx = _mm512_mul_ps(x, x);
    let w = _mm512_mul_ps(x, _mm512_add_ps(_mm512_mul_ps(xx, splat(k2)), splat(k1)));
    let high = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(w, splat(126.0));
    let s = recip_avx512(_mm512_add_ps(exp2_softmax_avx512(w), splat(1.0)));
    (xx, _mm512_maskz_mov_ps(!high, s))
}

/// `1 / d` for finite `d ≥ 1`: the 14-bit estimate and one Newton step.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn recip_avx512(d: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let r = _mm512_rcp14_ps(d);
    _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0)), r)
}
