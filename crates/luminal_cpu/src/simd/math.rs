//! Scalar math written to vectorise: fma, `exp2`, `log2`, `sin` (polynomials, 1–2 ulp).

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
pub(crate) const ROUND_MAGIC: f32 = 12582912.0;

/// 2^r on [-0.5, 0.5] (Cephes exp2f, relative error 1.7e-7): its coefficients, highest
/// degree first, shared by every scalar and vector `exp2` here (the same operations, so the
/// same bits).
pub(crate) const EXP2_POLY: [f32; 7] = [
    1.535_336_2e-4,
    1.339_887_4e-3,
    9.618_437e-3,
    5.550_332_5e-2,
    2.402_264_8e-1,
    6.931_472e-1,
    1.0,
];

/// [`EXP2_POLY`] at `r` (Horner, multiply-adds).
#[inline(always)]
fn exp2_poly<const F: bool>(r: f32) -> f32 {
    let mut p = EXP2_POLY[0];
    for &c in &EXP2_POLY[1..] {
        p = fma::<F>(p, r, c);
    }
    p
}

/// 2^x, within 2 ulp over the whole f32 range (subnormal results included); NaN stays NaN.
#[inline(always)]
pub fn exp2<const F: bool>(x: f32) -> f32 {
    // Below -150 the result rounds to 0. Those lanes compute 2^0 instead and are zeroed at
    // the end: the underflowing multiply would cost a microcode assist (~100+ cycles an
    // element on x86), and every masked softmax entry (-inf) lands here.
    let zero = x < -150.0;
    let x = if zero { 0.0 } else { x };
    // Clamp (NaN passes through: comparisons with NaN are false).
    let x = if x < -151.0 { -151.0 } else { x };
    let x = if x > 129.0 { 129.0 } else { x };
    let t = x + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = x - n; // in [-0.5, 0.5]
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let p = exp2_poly::<F>(r);
    // 2^n as two normal factors, so that results down to the subnormals round once.
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) << 23) as u32);
    let s2 = f32::from_bits((n2.wrapping_add(127) << 23) as u32);
    let y = p * s1 * s2;
    if zero {
        0.0
    } else {
        y
    }
}

/// 2^x for the shifted scores of a softmax (`x ≤ 0`, or NaN): [`exp2`]'s polynomial and
/// the same bits for `x` in `[-126, 126]`, but `x` clamped to `[-127, 126]` and `2^n` one
/// scale factor, so there are no lanes to patch: about half the operations of [`exp2`].
/// `x` below about -126.5 (a masked key's −∞ included) gives 0; a softmax weight that
/// small is 0 in the sum anyway.
#[inline(always)]
pub fn exp2_softmax<const F: bool>(x: f32) -> f32 {
    // NaN passes both clamps (comparisons with NaN are false) and stays NaN below.
    let x = if x < -127.0 { -127.0 } else { x };
    let x = if x > 126.0 { 126.0 } else { x };
    let t = x + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = x - n;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let p = exp2_poly::<F>(r);
    // n + 127 in [0, 253]: 0 is the bit pattern of 0.0.
    p * f32::from_bits((ni.wrapping_add(127) << 23) as u32)
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
