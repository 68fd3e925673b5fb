//! Element types: what a tensor holds, and conversions between host data and the dtypes.

use crate::quant::SharedBytes;
use half::{bf16, f16};
use std::fmt;

/// The element type of a tensor.
///
/// `F32, F16, BF16, I32, Bool` are compute types. The block-quantized storage types (GGUF's
/// `Q4_0` … `Q6_K`) hold blocks of values that share scales (see [`crate::quant`]); a
/// tensor of one is an input (a weight) whose only consumer is a cast to a float type
/// (`w.dequantize()`), which matmul and gather read; fast backends read the blocks in place.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum DType {
    #[default]
    F32,
    F16,
    BF16,
    I32,
    Bool,
    /// 32 values: `d: f16, qs: [u8; 16]`; value `d · (q − 8)`.
    Q4_0,
    /// 32 values: `d: f16, m: f16, qs: [u8; 16]`; value `d · q + m`.
    Q4_1,
    /// 32 values: `d: f16, qh: u32, qs: [u8; 16]`; value `d · (q − 16)`.
    Q5_0,
    /// 32 values: `d: f16, m: f16, qh: u32, qs: [u8; 16]`; value `d · q + m`.
    Q5_1,
    /// 32 values: `d: f16, qs: [i8; 32]`; value `d · q`.
    Q8_0,
    /// 256 values in 16 groups of 16 with 4-bit scales and mins; 2-bit quants.
    Q2_K,
    /// 256 values in 16 groups of 16 with 6-bit scales; 3-bit quants.
    Q3_K,
    /// 256 values in 8 groups of 32 with 6-bit scales and mins; 4-bit quants.
    Q4_K,
    /// 256 values in 8 groups of 32 with 6-bit scales and mins; 5-bit quants.
    Q5_K,
    /// 256 values in 16 groups of 16 with 8-bit scales; 6-bit quants.
    Q6_K,
}

/// Every dtype, compute types first.
pub const ALL_DTYPES: [DType; 15] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::Bool,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

impl DType {
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32)
    }
    /// A block-quantized storage type (`Q4_0` … `Q6_K`).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }
    /// Values per block: 32 or 256 for the quantized types, 1 otherwise.
    pub fn block_size(self) -> usize {
        match self {
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
            _ => 1,
        }
    }
    /// Bytes per block (per element for the plain types), as ggml stores them.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
        }
    }
    /// Byte offsets of the f16 fields of one block (scales, and the minimums' scale where
    /// the format has one), as ggml lays the blocks out; empty for the plain types. What a
    /// test sets to make random blocks decode to ordinary numbers.
    pub fn half_fields(self) -> &'static [usize] {
        match self {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q2_K => &[80, 82],
            DType::Q3_K => &[108],
            DType::Q6_K => &[208],
            _ => &[],
        }
    }
    /// Bytes that `n` values occupy, `None` when `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_size())
            .then(|| n / self.block_size() * self.block_bytes())
    }
    /// Size of one element in bytes (as stored by a backend).
    ///
    /// # Panics
    /// For quantized types, whose elements have no whole size (see [`DType::bytes_for`]).
    pub fn size_bytes(self) -> usize {
        assert!(
            !self.is_quantized(),
            "{self} stores blocks of {} values: use bytes_for",
            self.block_size()
        );
        self.block_bytes()
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::Bool => "bool",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2_K => "q2_k",
            DType::Q3_K => "q3_k",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
        }
    }

    /// Round an exact value to the nearest value this dtype can hold.
    ///
    /// This is the reference semantics of storing a result: floats round to nearest even,
    /// integers truncate toward zero and wrap (NaN becomes 0), bools are `v != 0`.
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F32 => v as f32 as f64,
            DType::F16 => f16_from_f64(v).to_f64(),
            DType::BF16 => bf16_from_f64(v).to_f64(),
            DType::I32 => {
                if v.is_nan() {
                    0.0
                } else {
                    (v.trunc() as i64) as i32 as f64
                }
            }
            DType::Bool => (v != 0.0) as u8 as f64,
            // Nothing is ever computed into a quantized type (only inputs hold one).
            q => panic!("no value rounds to the quantized type {q}"),
        }
    }

    /// The smallest value of this dtype (`-inf` for floats); the identity of a max-reduction.
    pub fn lowest(self) -> f64 {
        match self {
            DType::I32 => i32::MIN as f64,
            DType::Bool => 0.0,
            _ => f64::NEG_INFINITY,
        }
    }
}

/// `v` rounded to the nearest `f32` with round-to-odd: truncated toward zero, and the last
/// mantissa bit set when anything was cut off. Rounding that once more to a format with at
/// least two fewer significand bits (f16: 11, bf16: 8, vs f32's 24) gives exactly the
/// round-to-nearest-even of `v` itself: no double-rounding error.
fn f32_round_to_odd(v: f64) -> f32 {
    let r = v as f32;
    if r.is_nan() || r as f64 == v {
        return r;
    }
    let mut bits = r.to_bits();
    if (r as f64).abs() > v.abs() {
        // Rounded away from zero (possibly to infinity): step back one ulp toward zero.
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// `v` rounded to the nearest `f16`, ties to even (overflow to ±inf, NaN stays NaN).
///
/// `half`'s own `f16::from_f64` is not correctly rounded: it drops the low 32 bits of the
/// `f64` before rounding (and with F16C goes through an `f32` rounding first), so a value
/// just above a tie can round down. This is the single rounding every backend must match.
pub fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(v))
}

/// `v` rounded to the nearest `bf16`, ties to even (see [`f16_from_f64`]).
pub fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(v))
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Host data of one tensor, in its dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
    /// Raw little-endian storage of a float or quantized dtype (see [`ByteData`]): the only
    /// form of block-quantized data, and a zero-copy form of f32/f16/bf16 data (a window
    /// into a memory-mapped file).
    Bytes(ByteData),
}

/// `n` zero halves (`f16` or `bf16`: all bits zero is +0) from `vec![0u16; n]`, which
/// allocates zeroed memory instead of writing every element (as `vec![f16::ZERO; n]` does).
fn zeroed_halves<T: HalfBits>(n: usize) -> Vec<T> {
    let mut v = std::mem::ManuallyDrop::new(vec![0u16; n]);
    // SAFETY: `T` is `f16` or `bf16`, both `repr(transparent)` over `u16` (same size and
    // alignment, every bit pattern valid), so the allocation, length and capacity carry over.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T>(), v.len(), v.capacity()) }
}

/// The half-precision types, whose values are 16 bits of a `u16`.
trait HalfBits {}
impl HalfBits for f16 {}
impl HalfBits for bf16 {}

/// Raw storage of `len` values of a float or block-quantized dtype, as ggml lays it out.
#[derive(Clone, Debug, PartialEq)]
pub struct ByteData {
    dtype: DType,
    bytes: SharedBytes,
}

impl ByteData {
    /// Checks that `bytes` is a whole number of `dtype`'s blocks (`dtype` must be a float or
    /// quantized type); the error names what is wrong.
    pub fn new(dtype: DType, bytes: SharedBytes) -> Result<ByteData, String> {
        if !(dtype.is_float() || dtype.is_quantized()) {
            return Err(format!("{dtype} data cannot be given as raw bytes"));
        }
        if !bytes.len().is_multiple_of(dtype.block_bytes()) {
            return Err(format!(
                "{} bytes are not a whole number of {dtype} blocks ({} bytes each)",
                bytes.len(),
                dtype.block_bytes()
            ));
        }
        Ok(ByteData { dtype, bytes })
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of values.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.block_bytes() * self.dtype.block_size()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    pub fn bytes(&self) -> &SharedBytes {
        &self.bytes
    }
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.as_slice()
    }
    /// The raw bytes, writable (copy-on-write, see [`SharedBytes::make_mut`]).
    pub fn make_mut(&mut self) -> &mut [u8] {
        self.bytes.make_mut()
    }
    /// `n` values of `dtype`, all zero bytes (zero values for every float and block type).
    ///
    /// # Panics
    /// If `dtype` cannot be given as bytes or `n` is not a whole number of its blocks.
    pub fn zeros(dtype: DType, n: usize) -> ByteData {
        let bytes = dtype
            .bytes_for(n)
            .unwrap_or_else(|| panic!("{n} values are not whole {dtype} blocks"));
        ByteData::new(dtype, SharedBytes::from_vec(vec![0; bytes]))
            .unwrap_or_else(|e| panic!("{e}"))
    }
    /// Every value decoded to f32 (the reference dequantization, [`crate::quant::decode`]).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        crate::quant::decode(self.dtype, self.as_slice(), &mut out);
        out
    }
}

impl HostData {
    /// `n` zeros of `dtype` (quantized types: whole blocks of zeros), in memory allocated
    /// zeroed: large buffers come straight from the OS and are only touched when written
    /// (a KV cache costs nothing at load and its resident size grows with the context used).
    ///
    /// # Panics
    /// If `dtype` is quantized and `n` is not a whole number of its blocks.
    pub fn zeros(dtype: DType, n: usize) -> HostData {
        match dtype {
            DType::F32 => HostData::F32(vec![0.0; n]),
            DType::F16 => HostData::F16(zeroed_halves(n)),
            DType::BF16 => HostData::BF16(zeroed_halves(n)),
            DType::I32 => HostData::I32(vec![0; n]),
            DType::Bool => HostData::Bool(vec![false; n]),
            q => HostData::Bytes(ByteData::zeros(q, n)),
        }
    }
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I32(_) => DType::I32,
            HostData::Bool(_) => DType::Bool,
            HostData::Bytes(b) => b.dtype(),
        }
    }
    /// Raw data of `dtype` (a float or quantized type); a typed error when `bytes` is not a
    /// whole number of its blocks.
    pub fn from_bytes(dtype: DType, bytes: SharedBytes) -> crate::Result<HostData> {
        ByteData::new(dtype, bytes)
            .map(HostData::Bytes)
            .map_err(crate::LuminalError::BadData)
    }
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::Bool(v) => v.len(),
            HostData::Bytes(b) => b.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every element as an exact `f64` (all dtypes embed exactly; quantized data is
    /// dequantized).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            HostData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            HostData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            HostData::Bytes(b) => b.to_f32().into_iter().map(|x| x as f64).collect(),
        }
    }
    /// Build host data of `dtype` from values, rounding each with [`DType::round`]; for a
    /// quantized type with an encoder ([`crate::quant::encoder`]) the values (as f32) are
    /// encoded block by block (Q8_0, Q4_0 and Q5_0 blocks' decoded values encode back to
    /// the same blocks).
    ///
    /// # Panics
    /// For quantized dtypes without an encoder, or values that are not whole blocks.
    pub fn from_f64(dtype: DType, values: &[f64]) -> HostData {
        if dtype.is_quantized() && crate::quant::encoder(dtype).is_some() {
            let x: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            let mut data = ByteData::zeros(dtype, x.len());
            crate::quant::encode(dtype, &x, data.make_mut());
            return HostData::Bytes(data);
        }
        match dtype {
            DType::F32 => HostData::F32(values.iter().map(|&x| x as f32).collect()),
            DType::F16 => HostData::F16(values.iter().map(|&x| f16_from_f64(x)).collect()),
            DType::BF16 => HostData::BF16(values.iter().map(|&x| bf16_from_f64(x)).collect()),
            DType::I32 => {
                HostData::I32(values.iter().map(|&x| DType::I32.round(x) as i32).collect())
            }
            DType::Bool => HostData::Bool(values.iter().map(|&x| x != 0.0).collect()),
            q => panic!("HostData::from_f64: no value rounds to the quantized type {q}"),
        }
    }
    /// Convert to `f32` values whatever the dtype (lossless except for large i32).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostData::F32(v) => v.clone(),
            HostData::Bytes(b) => b.to_f32(),
            _ => self.to_f64().into_iter().map(|x| x as f32).collect(),
        }
    }
    /// The typed form of raw float data (`Bytes` of f32/f16/bf16 decoded into a vector);
    /// everything else unchanged.
    pub fn into_typed(self) -> HostData {
        match self {
            HostData::Bytes(b) if b.dtype().is_float() => {
                let raw = b.as_slice();
                match b.dtype() {
                    DType::F32 => HostData::F32(
                        raw.chunks_exact(4)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                    ),
                    DType::F16 => HostData::F16(
                        raw.chunks_exact(2)
                            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                            .collect(),
                    ),
                    _ => HostData::BF16(
                        raw.chunks_exact(2)
                            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                            .collect(),
                    ),
                }
            }
            other => other,
        }
    }
}

/// A Rust element type that maps one-to-one to a [`DType`].
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_host(data: &[Self]) -> HostData;
    /// `None` when `data` holds another dtype.
    fn from_host(data: HostData) -> Option<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn to_host(data: &[Self]) -> HostData {
                HostData::$variant(data.to_vec())
            }
            fn from_host(data: HostData) -> Option<Vec<Self>> {
                match data.into_typed() {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f16, F16);
element!(bf16, BF16);
element!(i32, I32);
element!(bool, Bool);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_zero_in_every_dtype() {
        for dtype in ALL_DTYPES {
            let n = dtype.block_size() * 3;
            let z = HostData::zeros(dtype, n);
            assert_eq!((z.dtype(), z.len()), (dtype, n), "{dtype}");
            // Plain types: +0, every bit clear. Blocks of zero bytes decode to ±0 (Q4_0 is
            // scale × (q − 8): 0 × −8 = −0).
            let zero = |v: &f64| v.to_bits() == 0 || (dtype.is_quantized() && *v == 0.0);
            assert!(z.to_f64().iter().all(zero), "{dtype}");
        }
    }

    #[test]
    fn rounding_follows_each_dtype() {
        assert_eq!(DType::F32.round(0.1), 0.1f32 as f64);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10 in f16: ties go to even (1.0).
        assert_eq!(DType::F16.round(1.0 + 2f64.powi(-11)), 1.0);
        assert_eq!(DType::F16.round(70000.0), f64::INFINITY);
        assert_eq!(DType::BF16.round(1.0 + 2f64.powi(-9)), 1.0);
        assert_eq!(DType::I32.round(-2.7), -2.0);
        assert_eq!(DType::I32.round(f64::NAN), 0.0);
        assert_eq!(DType::I32.round(2147483648.0), -2147483648.0);
        assert_eq!(DType::Bool.round(-0.5), 1.0);
        assert_eq!(DType::Bool.round(0.0), 0.0);
    }

    #[test]
    fn half_rounding_is_single_and_to_nearest_even() {
        // Just above the f16 tie between 1 and 1 + 2^-10 (the excess lies below f32
        // precision, so rounding through f32 or dropping low bits would see a tie).
        let above = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(DType::F16.round(above), 1.0 + 2f64.powi(-10));
        assert_eq!(DType::F16.round(1.0 + 2f64.powi(-11) - 2f64.powi(-40)), 1.0);
        let above = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(DType::BF16.round(above), 1.0 + 2f64.powi(-7));
        // An f32 just above a bf16 tie by its last mantissa bit.
        let x = f32::from_bits(0x3F80_8001) as f64;
        assert_eq!(DType::BF16.round(x), 1.0 + 2f64.powi(-7));
        // 1.5 * 2^-25 (between f16's zero and its smallest subnormal 2^-24, above the tie).
        assert_eq!(DType::F16.round(1.5 * 2f64.powi(-25)), 2f64.powi(-24));
        assert_eq!(DType::F16.round(2f64.powi(-25)), 0.0);
        assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
        assert_eq!(DType::F16.round(65519.99), 65504.0);
        assert_eq!(DType::BF16.round(f64::MAX), f64::INFINITY);
        assert_eq!(DType::BF16.round(-1e300), f64::NEG_INFINITY);
        assert_eq!(DType::BF16.round(1e-300), 0.0);
        assert!(DType::F16.round(f64::NAN).is_nan());
        assert_eq!(DType::F16.round(-0.0).to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn host_data_round_trips() {
        let h = HostData::from_f64(DType::BF16, &[1.0, -2.5, 3.0e38]);
        assert_eq!(h.dtype(), DType::BF16);
        assert_eq!(h.to_f64()[1], -2.5);
        let v: Vec<i32> = i32::from_host(HostData::from_f64(DType::I32, &[3.9, -3.9])).unwrap();
        assert_eq!(v, vec![3, -3]);
        assert!(f32::from_host(HostData::I32(vec![1])).is_none());
    }
}
