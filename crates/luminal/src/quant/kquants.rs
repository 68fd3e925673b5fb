//! Decoders of the 256-element "k-quant" super-block types: Q2_K … Q6_K and Q8_K.
//!
//! Block layouts (little-endian, field order as in ggml's `ggml-common.h`):
//!
//! | type | bytes | layout                                                             |
//! |------|-------|--------------------------------------------------------------------|
//! | Q2_K | 84    | scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16                  |
//! | Q3_K | 110   | hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16            |
//! | Q4_K | 144   | d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]                 |
//! | Q5_K | 176   | d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]   |
//! | Q6_K | 210   | ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16              |
//! | Q8_K | 292   | d: f32, qs: [i8; 256], bsums: [i16; 16]                            |
//!
//! The arithmetic is done in f32 in the same order as ggml, so results are bit-identical.

use super::{blocks_and_outputs, f16_at};

/// Decodes Q2_K blocks (84 bytes → 256 values each): 16 sub-blocks of 16 elements with a 4-bit
/// scale and a 4-bit min each; 2-bit quants.
///
/// # Panics
/// If `blocks.len()` is not a multiple of 84 or `out.len()` is not 256 per block.
pub fn dequantize_q2_k(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<84, 256>(blocks, out, "Q2_K");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 80);
        let dmin = f16_at(block, 82);
        let (scales, qs) = (&block[0..16], &block[16..80]);
        // Element 128·half + 32·shift + l takes bits 2·shift of qs[32·half + l]; its
        // sub-block (scale index) is element / 16.
        for half in 0..2 {
            let qs = &qs[32 * half..32 * half + 32];
            for shift in 0..4 {
                for part in 0..2 {
                    let sub = 8 * half + 2 * shift + part;
                    let dl = d * (scales[sub] & 0x0F) as f32;
                    let ml = dmin * (scales[sub] >> 4) as f32;
                    let y = &mut y[16 * sub..16 * sub + 16];
                    for (value, &q) in y.iter_mut().zip(&qs[16 * part..16 * part + 16]) {
                        *value = dl * ((q >> (2 * shift)) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block, unpacked from 12 bytes: the low 4 bits of
/// scale j are nibble j/8 of byte j%8, the high 2 bits are bits 2·(j/4) of byte 8 + j%4.
pub fn q3_k_scales(packed: &[u8]) -> [i32; 16] {
    let mut scales = [0i32; 16];
    for (j, scale) in scales.iter_mut().enumerate() {
        let low = (packed[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        *scale = (low | high << 4) as i32 - 32;
    }
    scales
}

/// Decodes Q3_K blocks (110 bytes → 256 values each): 16 sub-blocks of 16 elements with a
/// signed 6-bit scale each; 2 low bits in `qs`, the third bit in `hmask` (a set bit means
/// "no −4 offset").
///
/// # Panics
/// If `blocks.len()` is not a multiple of 110 or `out.len()` is not 256 per block.
pub fn dequantize_q3_k(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<110, 256>(blocks, out, "Q3_K");
    for (block, y) in blocks.iter().zip(out) {
        let (hmask, qs) = (&block[0..32], &block[32..96]);
        let scales = q3_k_scales(&block[96..108]);
        let d = f16_at(block, 108);
        // Element 128·half + 32·shift + l: low bits (qs[32·half + l] >> 2·shift) & 3, high
        // bit number 4·half + shift of hmask[l].
        for half in 0..2 {
            let qs = &qs[32 * half..32 * half + 32];
            for shift in 0..4 {
                let bit = 4 * half + shift;
                for part in 0..2 {
                    let sub = 8 * half + 2 * shift + part;
                    let dl = d * scales[sub] as f32;
                    let range = 16 * part..16 * part + 16;
                    let y = &mut y[16 * sub..16 * sub + 16];
                    for ((value, &q), &h) in y.iter_mut().zip(&qs[range.clone()]).zip(&hmask[range])
                    {
                        // low − (high bit set ? 0 : 4), without a branch.
                        let q3 = ((q >> (2 * shift)) & 3) | ((h >> bit) & 1) << 2;
                        *value = dl * (q3 as i32 - 4) as f32;
                    }
                }
            }
        }
    }
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block, 6 bits each, packed in 12 bytes.
#[inline]
pub fn k4_scale_min(packed: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 0x3F, packed[j + 4] & 0x3F)
    } else {
        let scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
        let min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
        (scale, min)
    }
}

/// Decodes Q4_K blocks (144 bytes → 256 values each): 8 sub-blocks of 32 elements with a
/// 6-bit scale and min each; 4-bit quants, two sub-blocks per 32 bytes of `qs`.
///
/// # Panics
/// If `blocks.len()` is not a multiple of 144 or `out.len()` is not 256 per block.
pub fn dequantize_q4_k(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<144, 256>(blocks, out, "Q4_K");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, 2);
        let packed = &block[4..16];
        let qs = &block[16..144];
        for (sub, y) in y.chunks_exact_mut(32).enumerate() {
            let (scale, min) = k4_scale_min(packed, sub);
            let dl = d * scale as f32;
            let ml = dmin * min as f32;
            let bytes = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
            let shift = 4 * (sub % 2);
            for (value, &q) in y.iter_mut().zip(bytes) {
                *value = dl * ((q >> shift) & 0x0F) as f32 - ml;
            }
        }
    }
}

/// Decodes Q5_K blocks (176 bytes → 256 values each): like Q4_K plus a fifth bit per element
/// in `qh` (bit `sub` of `qh[l]` for element `l` of sub-block `sub`).
///
/// # Panics
/// If `blocks.len()` is not a multiple of 176 or `out.len()` is not 256 per block.
pub fn dequantize_q5_k(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<176, 256>(blocks, out, "Q5_K");
    for (block, y) in blocks.iter().zip(out) {
        let d = f16_at(block, 0);
        let dmin = f16_at(block, 2);
        let packed = &block[4..16];
        let qh = &block[16..48];
        let qs = &block[48..176];
        for (sub, y) in y.chunks_exact_mut(32).enumerate() {
            let (scale, min) = k4_scale_min(packed, sub);
            let dl = d * scale as f32;
            let ml = dmin * min as f32;
            let bytes = &qs[32 * (sub / 2)..32 * (sub / 2) + 32];
            let shift = 4 * (sub % 2);
            for (l, value) in y.iter_mut().enumerate() {
                let q = ((bytes[l] >> shift) & 0x0F) | (((qh[l] >> sub) & 1) << 4);
                *value = dl * q as f32 - ml;
            }
        }
    }
}

/// Decodes Q6_K blocks (210 bytes → 256 values each): 16 sub-blocks of 16 elements with a
/// signed 8-bit scale each; 4 low bits in `ql`, 2 high bits in `qh`, offset −32.
///
/// # Panics
/// If `blocks.len()` is not a multiple of 210 or `out.len()` is not 256 per block.
pub fn dequantize_q6_k(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<210, 256>(blocks, out, "Q6_K");
    for (block, y) in blocks.iter().zip(out) {
        let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
        let d = f16_at(block, 208);
        // Element 128·half + 32·k + l (k in 0..4, l in 0..32): nibble k/2 of
        // ql[64·half + 32·(k%2) + l], bits 2·k of qh[32·half + l]; sub-block element / 16.
        for half in 0..2 {
            for k in 0..4 {
                let ql = &ql[64 * half + 32 * (k % 2)..64 * half + 32 * (k % 2) + 32];
                let qh = &qh[32 * half..32 * half + 32];
                for part in 0..2 {
                    let sub = 8 * half + 2 * k + part;
                    let dl = d * (scales[sub] as i8) as f32;
                    let range = 16 * part..16 * part + 16;
                    let y = &mut y[16 * sub..16 * sub + 16];
                    for ((value, &lo), &hi) in y.iter_mut().zip(&ql[range.clone()]).zip(&qh[range])
                    {
                        let low = (lo >> (4 * (k / 2))) & 0x0F;
                        let high = (hi >> (2 * k)) & 0x03;
                        *value = dl * ((low | high << 4) as i32 - 32) as f32;
                    }
                }
            }
        }
    }
}

/// Decodes Q8_K blocks (292 bytes → 256 values each): an f32 scale and 256 signed bytes (the
/// 16 trailing `bsums` are sums used by dot products and carry no extra information).
///
/// # Panics
/// If `blocks.len()` is not a multiple of 292 or `out.len()` is not 256 per block.
pub fn dequantize_q8_k(blocks: &[u8], out: &mut [f32]) {
    let (blocks, out) = blocks_and_outputs::<292, 256>(blocks, out, "Q8_K");
    for (block, y) in blocks.iter().zip(out) {
        let d = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        for (value, &q) in y.iter_mut().zip(&block[4..260]) {
            *value = d * (q as i8) as f32;
        }
    }
}
