//! Host data as device bytes, and back.

use luminal::{DType, HostData, LuminalError, Result};

pub(super) fn size_of(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::I32 => 4,
        DType::F16 | DType::BF16 => 2,
        _ => 1,
    }
}

/// Bytes of `n` values of `dtype` on the device (whole blocks for the quantized types, as
/// ggml stores them; `None` when `n` is not a whole number of blocks).
pub(super) fn bytes_of(dtype: DType, n: usize) -> Option<usize> {
    if dtype.is_quantized() {
        dtype.bytes_for(n)
    } else {
        Some(n * size_of(dtype))
    }
}

/// Values that `bytes` bytes of `dtype` hold (rounded down to whole blocks).
pub(super) fn values_in(dtype: DType, bytes: usize) -> usize {
    bytes / dtype.block_bytes() * dtype.block_size()
}

/// Host data as the bytes of its device buffer (block-quantized data as its raw blocks:
/// kernels dequantize the elements they read).
pub(super) fn to_bytes(data: HostData) -> Result<Vec<u8>> {
    Ok(match data.into_typed() {
        HostData::Bytes(b) if b.dtype().is_quantized() => b.as_slice().to_vec(),
        HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::Bool(v) => v.iter().map(|&b| b as u8).collect(),
        other => {
            return Err(LuminalError::Backend(format!(
                "the CUDA backend does not support {} inputs yet",
                other.dtype()
            )))
        }
    })
}

pub(super) fn from_bytes(dtype: DType, b: &[u8]) -> HostData {
    match dtype {
        DType::F32 => HostData::F32(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        DType::F16 => HostData::F16(
            b.chunks_exact(2)
                .map(|c| luminal::half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        DType::BF16 => HostData::BF16(
            b.chunks_exact(2)
                .map(|c| luminal::half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        DType::I32 => HostData::I32(
            b.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => HostData::Bool(b.iter().map(|&x| x != 0).collect()),
    }
}
