//! Decoders of the 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Block layouts (little-endian, as in ggml's `ggml-common.h`):
//!
//! | type | bytes | layout                                            | value of element i     |
//! |------|-------|---------------------------------------------------|------------------------|
//! | Q4_0 | 18    | d: f16, qs: [u8; 16]                              | d · (q − 8)            |
//! | Q4_1 | 20    | d: f16, m: f16, qs: [u8; 16]                      | d · q + m              |
//! | Q5_0 | 22    | d: f16, qh: u32, qs: [u8; 16]                     | d · (q − 16)           |
//! | Q5_1 | 24    | d: f16, m: f16, qh: u32, qs: [u8; 16]             | d · q + m              |
//! | Q8_0 | 34    | d: f16, qs: [i8; 32]                              | d · q                  |
//!
//! The 4-bit quants of elements `j` and `j + 16` share byte `qs[j]` (low nibble, high nibble);
//! for the 5-bit types bit `i` of `qh` is the fifth bit of element `i`.
//! The arithmetic is done in f32 in the same order as ggml, so results are bit-identical.

use super::{blocks_and_outputs, f16_at};

/// Decodes Q4_0 blocks (18 bytes → 32 values each).
///
/// # Panics
/// If `blocks.len()` is not a multiple of 18 or `out.len()` is not 32 per block.
pub fn dequantize_q4_0(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<18, 32>(blocks, out, "Q4_0");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 0);
        for j in 0..16 {
            let q = block[2 + j];
            y[j] = d * ((q & 0x0F) as i32 - 8) as f32;
            y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

/// Decodes Q4_1 blocks (20 bytes → 32 values each).
///
/// # Panics
/// If `blocks.len()` is not a multiple of 20 or `out.len()` is not 32 per block.
pub fn dequantize_q4_1(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<20, 32>(blocks, out, "Q4_1");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 0);
        let m = f16_at(block, 2);
        for j in 0..16 {
            let q = block[4 + j];
            y[j] = d * (q & 0x0F) as f32 + m;
            y[j + 16] = d * (q >> 4) as f32 + m;
        }
    }
}

/// Decodes Q5_0 blocks (22 bytes → 32 values each).
///
/// # Panics
/// If `blocks.len()` is not a multiple of 22 or `out.len()` is not 32 per block.
pub fn dequantize_q5_0(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<22, 32>(blocks, out, "Q5_0");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 0);
        let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
        for j in 0..16 {
            let q = block[6 + j];
            let lo = (q & 0x0F) as u32 | ((qh >> j) & 1) << 4;
            let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (lo as i32 - 16) as f32;
            y[j + 16] = d * (hi as i32 - 16) as f32;
        }
    }
}

/// Decodes Q5_1 blocks (24 bytes → 32 values each).
///
/// # Panics
/// If `blocks.len()` is not a multiple of 24 or `out.len()` is not 32 per block.
pub fn dequantize_q5_1(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<24, 32>(blocks, out, "Q5_1");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 0);
        let m = f16_at(block, 2);
        let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        for j in 0..16 {
            let q = block[8 + j];
            let lo = (q & 0x0F) as u32 | ((qh >> j) & 1) << 4;
            let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
            y[j] = d * lo as f32 + m;
            y[j + 16] = d * hi as f32 + m;
        }
    }
}

/// Decodes Q8_0 blocks (34 bytes → 32 values each).
///
/// # Panics
/// If `blocks.len()` is not a multiple of 34 or `out.len()` is not 32 per block.
pub fn dequantize_q8_0(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<34, 32>(blocks, out, "Q8_0");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 0);
        for j in 0..32 {
            y[j] = (block[2 + j] as i8) as f32 * d;
        }
    }
}
