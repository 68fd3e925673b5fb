//! Encoders of the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): f32 values to
//! whole blocks, as ggml's reference quantizers (`quantize_row_*_ref` in `ggml-quants.c`)
//! and gguf-py's `gguf.quants.quantize` compute them, bit for bit (the arithmetic is done in
//! f32 in the same order; scales are stored as f16 rounded to nearest even).
//!
//! What storing into a quantized type means (a quantized KV cache, `x.cast(DType::Q8_0)`):
//! each block of 32 consecutive values is encoded from its own values alone.
//!
//! - Q8_0: `d = max|x| / 127`, `q = round(x / d)` (halves away from zero).
//! - Q4_0 / Q5_0: `d = m / −8` (`/ −16`) for `m` the value of largest magnitude (the first
//!   one on ties), `q = min(15, trunc(x / d + 8.5))` (`min(31, trunc(x / d + 16.5))`).
//! - Q4_1 / Q5_1: `d = (max − min) / 15` (`/ 31`), `q = min(15, trunc((x − min) / d + 0.5))`
//!   (`min(31, …)`), the minimum stored as an f16 too.
//!
//! Division is by the reciprocal `1 / d` (0 when `d` is 0), as ggml does.

use half::f16;

fn put_f16(out: &mut [u8], at: usize, v: f32) {
    out[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The value of largest magnitude (the first such on ties; 0 for an all-zero block).
fn signed_max(x: &[f32; 32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32; 32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// `blocks` whole 32-value groups of `values` and `B`-byte blocks of `out`.
fn chunks<'a, 'b, const B: usize>(
    values: &'a [f32],
    out: &'b mut [u8],
    name: &str,
) -> (&'a [[f32; 32]], &'b mut [[u8; B]]) {
    let out_bytes = out.len();
    let (x, rest) = values.as_chunks::<32>();
    let (y, out_rest) = out.as_chunks_mut::<B>();
    assert!(
        rest.is_empty() && out_rest.is_empty() && x.len() == y.len(),
        "{name}: {} values do not fill {out_bytes} bytes of {B}-byte blocks",
        values.len(),
    );
    (x, y)
}

/// Encodes Q8_0 blocks (32 values → 34 bytes each).
///
/// # Panics
/// If `values.len()` is not a multiple of 32 or `out` does not hold 34 bytes per 32 values.
pub fn quantize_q8_0(values: &[f32], out: &mut [u8]) {
    let (x, y) = chunks::<34>(values, out, "Q8_0");
    for (x, y) in x.iter().zip(y) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = inverse(d);
        put_f16(y, 0, d);
        for j in 0..32 {
            y[2 + j] = (x[j] * id).round() as i8 as u8;
        }
    }
}

/// Encodes Q4_0 blocks (32 values → 18 bytes each).
///
/// # Panics
/// If `values.len()` is not a multiple of 32 or `out` does not hold 18 bytes per 32 values.
pub fn quantize_q4_0(values: &[f32], out: &mut [u8]) {
    let (x, y) = chunks::<18>(values, out, "Q4_0");
    for (x, y) in x.iter().zip(y) {
        let d = signed_max(x) / -8.0;
        let id = inverse(d);
        put_f16(y, 0, d);
        let q = |v: f32| ((v * id + 8.5) as u8).min(15);
        for j in 0..16 {
            y[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}

/// Encodes Q4_1 blocks (32 values → 20 bytes each).
///
/// # Panics
/// If `values.len()` is not a multiple of 32 or `out` does not hold 20 bytes per 32 values.
pub fn quantize_q4_1(values: &[f32], out: &mut [u8]) {
    let (x, y) = chunks::<20>(values, out, "Q4_1");
    for (x, y) in x.iter().zip(y) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        put_f16(y, 0, d);
        put_f16(y, 2, min);
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        for j in 0..16 {
            y[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}

/// The 5-bit quants' low nibbles into `qs` and fifth bits into `qh` (bit `j`: element `j`).
fn pack5(q: &[u8; 32], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
    for (j, &v) in q.iter().enumerate() {
        h |= ((v >> 4) as u32 & 1) << j;
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

/// Encodes Q5_0 blocks (32 values → 22 bytes each).
///
/// # Panics
/// If `values.len()` is not a multiple of 32 or `out` does not hold 22 bytes per 32 values.
pub fn quantize_q5_0(values: &[f32], out: &mut [u8]) {
    let (x, y) = chunks::<22>(values, out, "Q5_0");
    for (x, y) in x.iter().zip(y) {
        let d = signed_max(x) / -16.0;
        let id = inverse(d);
        put_f16(y, 0, d);
        let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 16.5) as u8).min(31));
        let (qh, qs) = y[2..].split_at_mut(4);
        pack5(&q, qh, qs);
    }
}

/// Encodes Q5_1 blocks (32 values → 24 bytes each).
///
/// # Panics
/// If `values.len()` is not a multiple of 32 or `out` does not hold 24 bytes per 32 values.
pub fn quantize_q5_1(values: &[f32], out: &mut [u8]) {
    let (x, y) = chunks::<24>(values, out, "Q5_1");
    for (x, y) in x.iter().zip(y) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        put_f16(y, 0, d);
        put_f16(y, 2, min);
        let q: [u8; 32] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u8).min(31));
        let (qh, qs) = y[4..].split_at_mut(4);
        pack5(&q, qh, qs);
    }
}
