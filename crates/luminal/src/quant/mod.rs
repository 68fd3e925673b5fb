//! Block-quantized storage (GGUF's `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`, `Q2_K` … `Q6_K`):
//! the block layouts, their decoders to f32, and [`SharedBytes`], the raw data a
//! [`crate::HostData::Bytes`] carries (possibly a window into a memory-mapped file).
//!
//! These decoders are the reference semantics of every quantized dtype: the reference runtime
//! dequantizes with them, and fast backends' kernels are tested against them. Each reproduces
//! ggml's f32 arithmetic order, so results match ggml and gguf-py bit for bit.
//!
//! One function per type (`dequantize_q4_1(blocks, out)`, …) works on whole blocks and panics
//! only if the caller passes buffers of mismatched lengths (a programming error, like
//! `copy_from_slice`); [`decode`] dispatches on a [`DType`].

mod encode;
mod kquants;
mod legacy;

pub use encode::{quantize_q4_0, quantize_q4_1, quantize_q5_0, quantize_q5_1, quantize_q8_0};
pub use kquants::{
    dequantize_q2_k, dequantize_q3_k, dequantize_q4_k, dequantize_q5_k, dequantize_q6_k,
    dequantize_q8_k, k4_scale_min, q3_k_scales,
};
pub use legacy::{
    dequantize_q4_0, dequantize_q4_1, dequantize_q5_0, dequantize_q5_1, dequantize_q8_0,
};

use crate::dtype::DType;
use std::fmt;
use std::sync::Arc;

/// Converts IEEE half-precision bits to f32, exactly (subnormals, infinities and NaN payloads
/// included).
///
/// Branch-free so that loops over it vectorise (the `half` crate's portable path does not,
/// without the F16C target feature): the exponent and mantissa are moved into f32 position
/// and rebiased by multiplying with 2^112, which is exact for normal and subnormal halves
/// alike; the all-ones exponent (inf/NaN) is patched in separately.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits & 0x8000) as u32) << 16;
    let magnitude = (bits & 0x7FFF) as u32;
    let rebiased = f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000); // × 2^112
    let finite = rebiased.to_bits();
    let special = (magnitude << 13) | 0x7F80_0000;
    let value = if magnitude >= 0x7C00 { special } else { finite };
    f32::from_bits(sign | value)
}

/// Reads the little-endian f16 at `bytes[at..at + 2]` as f32.
#[inline(always)]
pub fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Views `blocks` as whole `B`-byte blocks and `out` as matching `N`-value groups.
///
/// # Panics
/// If the lengths are not exactly `k·B` and `k·N` for the same `k`.
#[inline]
pub(crate) fn blocks_and_outputs<'a, 'b, const B: usize, const N: usize>(
    blocks: &'a [u8],
    out: &'b mut [f32],
    type_name: &str,
) -> (&'a [[u8; B]], &'b mut [[f32; N]]) {
    let (blocks, rest) = blocks.as_chunks::<B>();
    assert!(
        rest.is_empty(),
        "{type_name}: input of {} bytes is not a whole number of {B}-byte blocks",
        blocks.len() * B + rest.len()
    );
    let n_blocks = blocks.len();
    let (out, out_rest) = out.as_chunks_mut::<N>();
    assert!(
        out_rest.is_empty() && out.len() == n_blocks,
        "{type_name}: {n_blocks} blocks decode to {} values but the output holds {}",
        n_blocks * N,
        out.len() * N + out_rest.len()
    );
    (blocks, out)
}

/// Converts little-endian f32 bytes.
///
/// # Panics
/// If `bytes.len() != 4 * out.len()`.
pub fn convert_f32(bytes: &[u8], out: &mut [f32]) {
    let (values, out) = blocks_and_outputs::<4, 1>(bytes, out, "F32");
    for (v, y) in values.iter().zip(out) {
        y[0] = f32::from_le_bytes(*v);
    }
}

/// Converts little-endian IEEE half-precision bytes.
///
/// # Panics
/// If `bytes.len() != 2 * out.len()`.
pub fn convert_f16(bytes: &[u8], out: &mut [f32]) {
    let (values, out) = blocks_and_outputs::<2, 1>(bytes, out, "F16");
    for (v, y) in values.iter().zip(out) {
        y[0] = f16_to_f32(u16::from_le_bytes(*v));
    }
}

/// Converts little-endian bfloat16 bytes (exact: bf16 is the top half of an f32).
///
/// # Panics
/// If `bytes.len() != 2 * out.len()`.
pub fn convert_bf16(bytes: &[u8], out: &mut [f32]) {
    let (values, out) = blocks_and_outputs::<2, 1>(bytes, out, "BF16");
    for (v, y) in values.iter().zip(out) {
        y[0] = f32::from_bits((u16::from_le_bytes(*v) as u32) << 16);
    }
}

/// A decoder of whole blocks: `(block bytes, output values)`.
pub type BlockDecoder = fn(&[u8], &mut [f32]);

/// The decoder of `dtype`'s byte storage (whole blocks → f32 values), for the float and
/// block-quantized dtypes; `None` for `I32` and `Bool`.
pub fn decoder(dtype: DType) -> Option<BlockDecoder> {
    let f: BlockDecoder = match dtype {
        DType::F32 => convert_f32,
        DType::F16 => convert_f16,
        DType::BF16 => convert_bf16,
        DType::Q4_0 => dequantize_q4_0,
        DType::Q4_1 => dequantize_q4_1,
        DType::Q5_0 => dequantize_q5_0,
        DType::Q5_1 => dequantize_q5_1,
        DType::Q8_0 => dequantize_q8_0,
        DType::Q2_K => dequantize_q2_k,
        DType::Q3_K => dequantize_q3_k,
        DType::Q4_K => dequantize_q4_k,
        DType::Q5_K => dequantize_q5_k,
        DType::Q6_K => dequantize_q6_k,
        DType::I32 | DType::Bool => return None,
    };
    Some(f)
}

/// An encoder of whole blocks: `(values, block bytes)`.
pub type BlockEncoder = fn(&[f32], &mut [u8]);

/// The encoder of `dtype` (f32 values → whole blocks, ggml's reference quantizer, see
/// `encode.rs`): the 32-element types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, which a tensor can
/// be cast to (a quantized KV cache); `None` for every other type.
pub fn encoder(dtype: DType) -> Option<BlockEncoder> {
    let f: BlockEncoder = match dtype {
        DType::Q4_0 => quantize_q4_0,
        DType::Q4_1 => quantize_q4_1,
        DType::Q5_0 => quantize_q5_0,
        DType::Q5_1 => quantize_q5_1,
        DType::Q8_0 => quantize_q8_0,
        _ => return None,
    };
    Some(f)
}

/// Encodes `values` (whole blocks of `dtype`) into `out`: the reference quantization.
///
/// # Panics
/// If `dtype` has no encoder (see [`encoder`]) or the lengths do not match.
pub fn encode(dtype: DType, values: &[f32], out: &mut [u8]) {
    let f = encoder(dtype).unwrap_or_else(|| panic!("nothing is encoded into {dtype}"));
    f(values, out)
}

/// Decodes `bytes` (whole blocks of `dtype`) into `out`: the reference dequantization.
///
/// # Panics
/// If `dtype` has no byte decoder (`I32`, `Bool`) or the lengths do not match (a programming
/// error: [`crate::HostData::Bytes`] checks them when it is built).
pub fn decode(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    let f = decoder(dtype).unwrap_or_else(|| panic!("{dtype} has no byte decoder"));
    f(bytes, out)
}

/// Shared bytes: an owner (a `Vec`, a memory-mapped file, …) and a window into it.
///
/// Cloning shares the owner, so a weight handed to a runtime from a mapped file is never
/// copied; the owner lives as long as any window onto it. [`SharedBytes::make_mut`] gives
/// write access copy-on-write (a quantized KV cache written in place): in place when this
/// is the only handle on a whole `Vec` it owns, else after copying the window once.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Owner,
    start: usize,
    len: usize,
}

#[derive(Clone)]
enum Owner {
    Shared(Arc<dyn AsRef<[u8]> + Send + Sync>),
    Vec(Arc<Vec<u8>>),
}

impl SharedBytes {
    /// A window `range` onto `owner`'s bytes; `None` when the range lies outside them.
    pub fn new(
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        range: std::ops::Range<usize>,
    ) -> Option<SharedBytes> {
        let total = owner.as_ref().as_ref().len();
        if range.start > range.end || range.end > total {
            return None;
        }
        Some(SharedBytes {
            owner: Owner::Shared(owner),
            start: range.start,
            len: range.end - range.start,
        })
    }

    /// Owns `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> SharedBytes {
        let len = bytes.len();
        SharedBytes {
            owner: Owner::Vec(Arc::new(bytes)),
            start: 0,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        let all: &[u8] = match &self.owner {
            Owner::Shared(o) => o.as_ref().as_ref(),
            Owner::Vec(v) => v,
        };
        &all[self.start..self.start + self.len]
    }

    /// The bytes, writable: in place when nothing else shares them, else a private copy
    /// is made first (other handles keep the old bytes).
    pub fn make_mut(&mut self) -> &mut [u8] {
        let whole = matches!(&self.owner, Owner::Vec(v) if self.start == 0 && v.len() == self.len);
        if !whole {
            let copy = self.as_slice().to_vec();
            *self = SharedBytes::from_vec(copy);
        }
        match &mut self.owner {
            Owner::Vec(v) => Arc::make_mut(v).as_mut_slice(),
            Owner::Shared(_) => unreachable!("a private copy was just made"),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact_for_every_bit_pattern() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32();
            let got = f16_to_f32(bits);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{bits:#06x}: {got:e} vs {want:e}"
            );
        }
    }

    #[test]
    fn plain_types_convert() {
        let mut out = [0f32; 2];
        convert_bf16(&[0x80, 0x3f, 0x00, 0xc0], &mut out);
        assert_eq!(out, [1.0, -2.0]);
        convert_f16(&[0x00, 0x3c, 0x00, 0xc0], &mut out);
        assert_eq!(out, [1.0, -2.0]);
    }

    #[test]
    fn shared_windows_check_their_range() {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![1u8, 2, 3, 4]);
        let w = SharedBytes::new(owner.clone(), 1..3).unwrap();
        assert_eq!(w.as_slice(), &[2, 3]);
        assert!(SharedBytes::new(owner.clone(), 2..5).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = SharedBytes::new(owner, 3..2);
        assert!(reversed.is_none());
    }
}
