//! Buffers. `f32`, `f16` and `bf16` tensors are stored in their own type (the fast paths
//! work on them); `i32` and `bool` are stored as exact `f64` values (both embed exactly),
//! which the reference-semantics fallback kernels read and write. Quantized inputs (and
//! half weights handed over as raw bytes) keep their raw blocks (`Bytes`), which only the
//! weight kernels of `quant/` read.

use crate::simd::half::HalfElem;
use half::{bf16, f16};
use luminal::{ByteData, DType, HostData};

#[derive(Clone, Debug)]
pub enum Storage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    /// Raw blocks of a quantized (or half) weight, shared with whoever handed them over (a
    /// memory-mapped file): never copied.
    Bytes(ByteData),
}

/// Which element type a buffer holds. Buffers are reused only within one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageKind {
    F32,
    F16,
    BF16,
    F64,
    Bytes,
}

impl StorageKind {
    /// The storage of a dtype.
    pub fn of(dtype: DType) -> StorageKind {
        match dtype {
            DType::F32 => StorageKind::F32,
            DType::F16 => StorageKind::F16,
            DType::BF16 => StorageKind::BF16,
            DType::I32 | DType::Bool => StorageKind::F64,
            _ => StorageKind::Bytes,
        }
    }
}

impl Storage {
    pub fn empty(dtype: DType) -> Storage {
        match StorageKind::of(dtype) {
            StorageKind::F32 => Storage::F32(Vec::new()),
            StorageKind::F16 => Storage::F16(Vec::new()),
            StorageKind::BF16 => Storage::BF16(Vec::new()),
            StorageKind::F64 => Storage::F64(Vec::new()),
            StorageKind::Bytes => Storage::Bytes(
                ByteData::new(dtype, luminal::SharedBytes::from_vec(vec![]))
                    .expect("empty data of a quantized dtype"),
            ),
        }
    }

    pub fn kind(&self) -> StorageKind {
        match self {
            Storage::F32(_) => StorageKind::F32,
            Storage::F16(_) => StorageKind::F16,
            Storage::BF16(_) => StorageKind::BF16,
            Storage::F64(_) => StorageKind::F64,
            Storage::Bytes(_) => StorageKind::Bytes,
        }
    }

    /// The storage of input data. Raw float data becomes a typed buffer (a copy) unless
    /// `weight_only` (only weight kernels read the input, see `quant/`).
    pub fn from_host(data: HostData, weight_only: bool) -> Storage {
        let data = match data {
            HostData::Bytes(b) if b.dtype().is_quantized() || weight_only => {
                return Storage::Bytes(b)
            }
            other => other.into_typed(),
        };
        match data {
            HostData::F32(v) => Storage::F32(v),
            HostData::F16(v) => Storage::F16(v),
            HostData::BF16(v) => Storage::BF16(v),
            other => Storage::F64(other.to_f64()),
        }
    }

    pub fn to_host(&self, dtype: DType, len: usize) -> HostData {
        match self {
            Storage::F32(v) => HostData::F32(v[..len].to_vec()),
            Storage::F16(v) => HostData::F16(v[..len].to_vec()),
            Storage::BF16(v) => HostData::BF16(v[..len].to_vec()),
            Storage::F64(v) => HostData::from_f64(dtype, &v[..len]),
            Storage::Bytes(b) => HostData::Bytes(b.clone()),
        }
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        match self {
            Storage::Bytes(b) => b.len(),
            s => s.as_ref().len(),
        }
    }

    /// Grows to at least `n` elements; never shrinks, so the same dims never reallocate.
    /// Replaces the contents with `data` when this buffer holds `T`'s element kind (f32 as
    /// f32, halves as halves, integers and booleans as f64); `false` otherwise. Reuses the
    /// capacity.
    pub fn write_from<T: luminal::Element>(&mut self, data: &[T]) -> bool {
        use std::any::TypeId;
        let t = TypeId::of::<T>();
        match self {
            Storage::F32(v) => match as_elements::<f32, _>(data) {
                Some(src) => {
                    v.clear();
                    v.extend_from_slice(src);
                    true
                }
                None => false,
            },
            Storage::F64(v) if t == TypeId::of::<i32>() => {
                v.clear();
                v.extend(
                    as_elements::<i32, _>(data)
                        .unwrap()
                        .iter()
                        .map(|&x| x as f64),
                );
                true
            }
            Storage::F64(v) if t == TypeId::of::<bool>() => {
                v.clear();
                v.extend(
                    as_elements::<bool, _>(data)
                        .unwrap()
                        .iter()
                        .map(|&x| x as u8 as f64),
                );
                true
            }
            Storage::F16(v) => match as_elements::<f16, _>(data) {
                Some(src) => {
                    v.clear();
                    v.extend_from_slice(src);
                    true
                }
                None => false,
            },
            Storage::BF16(v) => match as_elements::<bf16, _>(data) {
                Some(src) => {
                    v.clear();
                    v.extend_from_slice(src);
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    pub fn ensure_len(&mut self, n: usize) {
        match self {
            Storage::F32(v) if v.len() < n => v.resize(n, 0.0),
            Storage::F16(v) if v.len() < n => v.resize(n, f16::ZERO),
            Storage::BF16(v) if v.len() < n => v.resize(n, bf16::ZERO),
            Storage::F64(v) if v.len() < n => v.resize(n, 0.0),
            _ => {}
        }
    }

    pub fn as_ref(&self) -> BufRef<'_> {
        match self {
            Storage::F32(v) => BufRef::F32(v),
            Storage::F16(v) => BufRef::F16(v),
            Storage::BF16(v) => BufRef::BF16(v),
            Storage::F64(v) => BufRef::F64(v),
            Storage::Bytes(b) => panic!(
                "a {} weight buffer is read only by the weight kernels (see quant/)",
                b.dtype()
            ),
        }
    }

    /// Stores `v` at `i`, rounded to the buffer's type (the reference's single rounding).
    #[inline]
    pub fn set_f64(&mut self, i: usize, v: f64) {
        match self {
            Storage::F32(o) => o[i] = v as f32,
            Storage::F16(o) => o[i] = luminal::dtype::f16_from_f64(v),
            Storage::BF16(o) => o[i] = luminal::dtype::bf16_from_f64(v),
            Storage::F64(o) => o[i] = v,
            Storage::Bytes(_) => panic!("nothing is computed into a weight buffer"),
        }
    }
}

/// A read-only buffer of any storage.
#[derive(Clone, Copy, Debug)]
pub enum BufRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    F64(&'a [f64]),
}

impl<'a> BufRef<'a> {
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        match self {
            BufRef::F32(v) => v.len(),
            BufRef::F16(v) => v.len(),
            BufRef::BF16(v) => v.len(),
            BufRef::F64(v) => v.len(),
        }
    }
    /// Element `i` as `f32` (exact for the half types; `f64` values round once).
    #[inline]
    pub fn get_f32(&self, i: usize) -> f32 {
        match self {
            BufRef::F32(v) => v[i],
            BufRef::F16(v) => v[i].to_f32(),
            BufRef::BF16(v) => v[i].to_f32(),
            BufRef::F64(v) => v[i] as f32,
        }
    }
    #[inline]
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            BufRef::F32(v) => v[i] as f64,
            BufRef::F16(v) => v[i].to_f64(),
            BufRef::BF16(v) => v[i].to_f64(),
            BufRef::F64(v) => v[i],
        }
    }
    /// Elements `start .. start + out.len()` as `f32` (halves widen exactly, vectorised:
    /// F16C where the CPU has it, see `halfvec.rs`).
    #[inline]
    pub fn copy_to_f32(&self, start: usize, out: &mut [f32]) {
        let range = start..start + out.len();
        match self {
            BufRef::F32(v) => out.copy_from_slice(&v[range]),
            BufRef::F16(v) => HalfElem::widen(&v[range], out),
            BufRef::BF16(v) => HalfElem::widen(&v[range], out),
            BufRef::F64(v) => {
                for (o, &x) in out.iter_mut().zip(&v[range]) {
                    *o = x as f32;
                }
            }
        }
    }
}

/// `data` as a slice of `U` when `T` is `U` (same type), else `None`.
pub fn as_elements<U: 'static, T: 'static>(data: &[T]) -> Option<&[U]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<U>()).then(|| {
        // SAFETY: `T` and `U` are the same type, so the layout is identical.
        unsafe { std::slice::from_raw_parts(data.as_ptr() as *const U, data.len()) }
    })
}
