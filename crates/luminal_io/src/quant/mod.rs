//! Decoding ggml tensor data (plain and block-quantized) to f32.
//!
//! One function per type (`dequantize_q4_1(blocks, out)`, …) works on whole blocks and panics
//! only if the caller passes buffers of mismatched lengths (a programming error, like
//! `copy_from_slice`). [`dequantize`] checks lengths and dispatches on a [`GgmlType`];
//! [`dequantize_parallel`] does the same split over rayon's thread pool for large tensors.
//! Every decoder reproduces ggml's f32 arithmetic order, so results match ggml and gguf-py
//! bit for bit.

pub use luminal::quant::{
    convert_bf16, convert_f16, convert_f32, dequantize_q2_k, dequantize_q3_k, dequantize_q4_0,
    dequantize_q4_1, dequantize_q4_k, dequantize_q5_0, dequantize_q5_1, dequantize_q5_k,
    dequantize_q6_k, dequantize_q8_0, dequantize_q8_k, f16_to_f32, BlockDecoder,
};

use rayon::prelude::*;

use crate::error::{IoError, Result};
pub use crate::ggml_type::GgmlType;

/// Views `bytes` as whole `B`-byte values and `out` as matching outputs.
///
/// # Panics
/// If the lengths do not match.
fn values_and_outputs<'a, 'b, const B: usize>(
    bytes: &'a [u8],
    out: &'b mut [f32],
    type_name: &str,
) -> (&'a [[u8; B]], &'b mut [f32]) {
    let (values, rest) = bytes.as_chunks::<B>();
    assert!(
        rest.is_empty() && values.len() == out.len(),
        "{type_name}: {} bytes do not hold the {} values of the output",
        bytes.len(),
        out.len()
    );
    (values, out)
}

fn convert_f64(bytes: &[u8], out: &mut [f32]) {
    let (values, out) = values_and_outputs::<8>(bytes, out, "F64");
    for (v, y) in values.iter().zip(out) {
        *y = f64::from_le_bytes(*v) as f32;
    }
}

fn convert_i8(bytes: &[u8], out: &mut [f32]) {
    let (values, out) = values_and_outputs::<1>(bytes, out, "I8");
    for (v, y) in values.iter().zip(out) {
        *y = (v[0] as i8) as f32;
    }
}

fn convert_i16(bytes: &[u8], out: &mut [f32]) {
    let (values, out) = values_and_outputs::<2>(bytes, out, "I16");
    for (v, y) in values.iter().zip(out) {
        *y = i16::from_le_bytes(*v) as f32;
    }
}

fn convert_i32(bytes: &[u8], out: &mut [f32]) {
    let (values, out) = values_and_outputs::<4>(bytes, out, "I32");
    for (v, y) in values.iter().zip(out) {
        *y = i32::from_le_bytes(*v) as f32;
    }
}

/// The block decoder of `ty`, if this crate has one.
pub fn decoder(ty: GgmlType) -> Option<BlockDecoder> {
    use GgmlType::*;
    let f: BlockDecoder = match ty {
        F32 => convert_f32,
        F16 => convert_f16,
        BF16 => convert_bf16,
        F64 => convert_f64,
        I8 => convert_i8,
        I16 => convert_i16,
        I32 => convert_i32,
        Q4_0 => dequantize_q4_0,
        Q4_1 => dequantize_q4_1,
        Q5_0 => dequantize_q5_0,
        Q5_1 => dequantize_q5_1,
        Q8_0 => dequantize_q8_0,
        Q2_K => dequantize_q2_k,
        Q3_K => dequantize_q3_k,
        Q4_K => dequantize_q4_k,
        Q5_K => dequantize_q5_k,
        Q6_K => dequantize_q6_k,
        Q8_K => dequantize_q8_k,
        _ => return None,
    };
    Some(f)
}

/// Checks that `data` holds whole blocks of `ty` and `out` the values they decode to, and
/// returns the decoder.
fn checked_decoder(tensor: &str, ty: GgmlType, data: &[u8], out: &[f32]) -> Result<BlockDecoder> {
    let decode = decoder(ty).ok_or_else(|| IoError::UnsupportedDtype {
        tensor: tensor.to_string(),
        dtype: ty.name().to_string(),
    })?;
    let type_size = ty.type_size() as usize;
    let block_size = ty.block_size() as usize;
    if !data.len().is_multiple_of(type_size) {
        return Err(IoError::LengthMismatch {
            tensor: tensor.to_string(),
            what: format!("{ty} data (not a whole number of {type_size}-byte blocks)"),
            expected: (data.len() / type_size * type_size) as u64,
            found: data.len() as u64,
        });
    }
    let n_values = (data.len() / type_size) as u128 * block_size as u128;
    if n_values != out.len() as u128 {
        return Err(IoError::LengthMismatch {
            tensor: tensor.to_string(),
            what: "output buffer".into(),
            expected: n_values as u64,
            found: out.len() as u64,
        });
    }
    Ok(decode)
}

/// Decodes `data` (whole blocks of `ty`) into `out`, on the calling thread.
///
/// Errors with [`IoError::UnsupportedDtype`] for types without a decoder and
/// [`IoError::LengthMismatch`] when the lengths do not fit.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    dequantize_tensor("(buffer)", ty, data, out, false)
}

/// Like [`dequantize`], but splits large inputs over rayon's thread pool.
pub fn dequantize_parallel(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    dequantize_tensor("(buffer)", ty, data, out, true)
}

/// Output values per parallel task: large enough that scheduling costs nothing, small enough
/// to balance work on many cores.
const VALUES_PER_TASK: usize = 1 << 16;

pub(crate) fn dequantize_tensor(
    tensor: &str,
    ty: GgmlType,
    data: &[u8],
    out: &mut [f32],
    parallel: bool,
) -> Result<()> {
    let decode = checked_decoder(tensor, ty, data, out)?;
    if !parallel || out.len() <= VALUES_PER_TASK {
        decode(data, out);
        return Ok(());
    }
    let blocks_per_task = (VALUES_PER_TASK / ty.block_size() as usize).max(1);
    let bytes_per_task = blocks_per_task * ty.type_size() as usize;
    let values_per_task = blocks_per_task * ty.block_size() as usize;
    data.par_chunks(bytes_per_task)
        .zip(out.par_chunks_mut(values_per_task))
        .for_each(|(data, out)| decode(data, out));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decodable_type_has_a_decoder() {
        for id in 0..64 {
            if let Some(ty) = GgmlType::from_id(id) {
                assert_eq!(decoder(ty).is_some(), ty.can_dequantize(), "{ty}");
            }
        }
    }

    #[test]
    fn length_errors_are_typed() {
        let mut out = [0f32; 32];
        let err = dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
        assert!(matches!(err, IoError::LengthMismatch { .. }), "{err}");
        let err = dequantize(GgmlType::Q4_0, &[0u8; 36], &mut out).unwrap_err();
        assert!(matches!(err, IoError::LengthMismatch { .. }), "{err}");
        let err = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut [0f32; 256]).unwrap_err();
        assert!(matches!(err, IoError::UnsupportedDtype { .. }), "{err}");
    }

    #[test]
    fn parallel_matches_serial() {
        // 9000 Q8_0 blocks: more than one parallel task, last task partial.
        let n_blocks = 9000;
        let mut data = vec![0u8; n_blocks * 34];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for (i, byte) in data.iter_mut().enumerate() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Keep each block's f16 scale finite: zero the exponent's top bit.
            *byte = if i % 34 == 1 {
                (state as u8) & 0x3B
            } else {
                state as u8
            };
        }
        let mut serial = vec![0f32; n_blocks * 32];
        let mut parallel = vec![0f32; n_blocks * 32];
        dequantize(GgmlType::Q8_0, &data, &mut serial).unwrap();
        dequantize_parallel(GgmlType::Q8_0, &data, &mut parallel).unwrap();
        assert_eq!(serial, parallel);
    }

    #[test]
    fn plain_int_types_convert() {
        // (f16 / bf16 conversions are tested with the core's decoders.)
        let mut out = [0f32; 1];
        dequantize(GgmlType::I16, &(-7i16).to_le_bytes(), &mut out).unwrap();
        assert_eq!(out, [-7.0]);
    }
}
