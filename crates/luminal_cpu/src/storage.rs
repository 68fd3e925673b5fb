//! Buffers. `f32` tensors are stored as `f32` (the fast paths work on them); every other
//! dtype is stored as exact `f64` values (all five dtypes embed exactly), which the
//! reference-semantics fallback kernels read and write.

use luminal::{DType, HostData};

#[derive(Clone, Debug)]
pub enum Storage {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// Which storage a dtype uses.
pub fn is_f32_stored(dtype: DType) -> bool {
    dtype == DType::F32
}

impl Storage {
    pub fn empty(dtype: DType) -> Storage {
        if is_f32_stored(dtype) {
            Storage::F32(Vec::new())
        } else {
            Storage::F64(Vec::new())
        }
    }

    pub fn from_host(data: HostData) -> Storage {
        match data {
            HostData::F32(v) => Storage::F32(v),
            other => Storage::F64(other.to_f64()),
        }
    }

    pub fn to_host(&self, dtype: DType, len: usize) -> HostData {
        match self {
            Storage::F32(v) => HostData::F32(v[..len].to_vec()),
            Storage::F64(v) => HostData::from_f64(dtype, &v[..len]),
        }
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::F64(v) => v.len(),
        }
    }

    /// Grows to at least `n` elements; never shrinks, so the same dims never reallocate.
    pub fn ensure_len(&mut self, n: usize) {
        match self {
            Storage::F32(v) if v.len() < n => v.resize(n, 0.0),
            Storage::F64(v) if v.len() < n => v.resize(n, 0.0),
            _ => {}
        }
    }

    pub fn as_ref(&self) -> BufRef<'_> {
        match self {
            Storage::F32(v) => BufRef::F32(v),
            Storage::F64(v) => BufRef::F64(v),
        }
    }
}

/// A read-only buffer of either storage.
#[derive(Clone, Copy, Debug)]
pub enum BufRef<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

impl<'a> BufRef<'a> {
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        match self {
            BufRef::F32(v) => v.len(),
            BufRef::F64(v) => v.len(),
        }
    }
    #[inline]
    pub fn get_f32(&self, i: usize) -> f32 {
        match self {
            BufRef::F32(v) => v[i],
            BufRef::F64(v) => v[i] as f32,
        }
    }
    #[inline]
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            BufRef::F32(v) => v[i] as f64,
            BufRef::F64(v) => v[i],
        }
    }
    #[inline]
    pub fn copy_to_f32(&self, start: usize, out: &mut [f32]) {
        match self {
            BufRef::F32(v) => out.copy_from_slice(&v[start..start + out.len()]),
            BufRef::F64(v) => {
                let n = out.len();
                for (o, &x) in out.iter_mut().zip(&v[start..start + n]) {
                    *o = x as f32;
                }
            }
        }
    }
}
