//! Buffers. `f32`, `f16` and `bf16` tensors are stored in their own type (the fast paths
//! work on them); `i32` and `bool` are stored as exact `f64` values (both embed exactly),
//! which the reference-semantics fallback kernels read and write. Quantized inputs (and
//! half weights handed over as raw bytes) keep their raw blocks (`Bytes`), which only the
//! weight kernels of `quant/` read.

use crate::simd::half::{bf16_bits, fast};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use luminal::graph::NodeId;
use luminal::{ByteData, DType, HostData};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Buffers of at least this many bytes are asked to live in 2 MiB pages.
const HUGE_BYTES: usize = 4 << 20;

/// `v.resize(n, zero)`, where a buffer of [`HUGE_BYTES`] or more is allocated anew and
/// advised `MADV_HUGEPAGE` before its first write (Linux; a hint the kernel may ignore):
/// kernels stream activations of tens of MiB (prefill, BERT batches), and with 4 KiB pages
/// each 4 KiB costs a page walk.
fn grow<T: Copy>(v: &mut Vec<T>, n: usize, zero: T) {
    let bytes = n * std::mem::size_of::<T>();
    if bytes < HUGE_BYTES || v.capacity() >= n || !cfg!(target_os = "linux") {
        v.resize(n, zero);
        return;
    }
    let mut fresh: Vec<T> = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        // The whole 2 MiB pages inside the allocation.
        let start = fresh.as_ptr() as usize;
        let (lo, hi) = (
            start.next_multiple_of(2 << 20),
            (start + bytes) & !((2 << 20) - 1),
        );
        if hi > lo {
            // SAFETY: madvise only changes how the kernel backs this range, which lies inside
            // the allocation just made (not yet written).
            unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
    fresh.extend_from_slice(v);
    fresh.resize(n, zero);
    *v = fresh;
}

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
            Storage::F32(v) if v.len() < n => grow(v, n, 0.0),
            Storage::F16(v) if v.len() < n => grow(v, n, f16::ZERO),
            Storage::BF16(v) if v.len() < n => grow(v, n, bf16::ZERO),
            Storage::F64(v) if v.len() < n => grow(v, n, 0.0),
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
            BufRef::F16(v) => Elem::widen(&v[range], out),
            BufRef::BF16(v) => Elem::widen(&v[range], out),
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

/// A buffer of the plan. While lowering, a kernel names the value of node `n` as
/// `BufId::of(n)`; the memory plan then maps those onto the physical buffers
/// (`CpuKernel::remap`). Distinct from `NodeId`, so the two cannot be mixed up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

impl BufId {
    /// The value of node `n` (before buffer assignment).
    pub fn of(n: NodeId) -> BufId {
        BufId(n.0)
    }
    /// Index into the runtime's buffer list.
    #[inline(always)]
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

impl std::ops::Index<BufId> for [Storage] {
    type Output = Storage;
    #[inline(always)]
    fn index(&self, b: BufId) -> &Storage {
        &self[b.idx()]
    }
}

// ---------------------------------------------------------------- the element trait

// The one element trait: the value types a [`Storage`] variant holds (`f32`, `f64` for
// integers and bools, `f16`, `bf16`), with the conversions every kernel family needs.
// Data-movement kernels are generic over it (copies of any type), the half kernels read
// and write through it (exact widening, one rounding when narrowing, F16C where present).

/// An element type of a storage variant.
pub trait Elem: Copy + Send + Sync + 'static {
    const ZERO: Self;
    /// The storage's data when it holds this element type.
    fn of(s: &Storage) -> Option<&[Self]>;
    /// `v` rounded once to this type (the reference's `DType::round`).
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// The value as `f32` (exact for the float types).
    fn to_f32(self) -> f32;
    /// `self + 0` in the type's own arithmetic (what a padded `Add` computes: `-0.0`
    /// becomes `0.0`, everything else is unchanged).
    fn plus_zero(self) -> Self;
    /// `src` converted into `dst` (same lengths; exact for the float types).
    fn widen(src: &[Self], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    /// `src` rounded into `dst` (same lengths).
    fn narrow(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len());
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f64(s as f64);
        }
    }
    /// Eight elements from `p`, as `f32`.
    ///
    /// # Safety
    /// The CPU supports AVX2 and F16C, and `p .. p + 8` is readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
}

impl Elem for f32 {
    const ZERO: f32 = 0.0;
    fn of(s: &Storage) -> Option<&[f32]> {
        match s {
            Storage::F32(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn plus_zero(self) -> f32 {
        self + 0.0
    }
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn narrow(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees AVX2 and 8 readable elements.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl Elem for f64 {
    const ZERO: f64 = 0.0;
    fn of(s: &Storage) -> Option<&[f64]> {
        match s {
            Storage::F64(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    fn from_f64(v: f64) -> f64 {
        v
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline]
    fn plus_zero(self) -> f64 {
        self + 0.0
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f64) -> __m256 {
        // SAFETY: the caller guarantees AVX2 and 8 readable elements.
        unsafe {
            let (lo, hi) = (
                _mm256_cvtpd_ps(_mm256_loadu_pd(p)),
                _mm256_cvtpd_ps(_mm256_loadu_pd(p.add(4))),
            );
            _mm256_set_m128(hi, lo)
        }
    }
}

impl Elem for f16 {
    const ZERO: f16 = f16::ZERO;
    fn of(s: &Storage) -> Option<&[f16]> {
        match s {
            Storage::F16(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    fn from_f64(v: f64) -> f16 {
        // One correct rounding, as the reference's `DType::round`.
        luminal::dtype::f16_from_f64(v)
    }
    #[inline]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn plus_zero(self) -> f16 {
        // Exact in the half type: only `-0.0` changes (to `+0.0`).
        if self == f16::ZERO {
            f16::ZERO
        } else {
            self
        }
    }
    #[inline]
    fn widen(src: &[f16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        #[cfg(target_arch = "x86_64")]
        if fast() {
            // SAFETY: AVX2 and F16C were detected; the lengths match.
            unsafe { crate::simd::half::widen_f16_f16c(src, dst) };
            return;
        }
        src.convert_to_f32_slice(dst)
    }
    #[inline]
    fn narrow(src: &[f32], dst: &mut [f16]) {
        assert_eq!(src.len(), dst.len());
        #[cfg(target_arch = "x86_64")]
        if fast() {
            // SAFETY: AVX2 and F16C were detected; the lengths match.
            unsafe { crate::simd::half::narrow_f16_f16c(src, dst) };
            return;
        }
        dst.convert_from_f32_slice(src)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees F16C and 8 readable elements (16 bytes).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

impl Elem for bf16 {
    const ZERO: bf16 = bf16::ZERO;
    fn of(s: &Storage) -> Option<&[bf16]> {
        match s {
            Storage::BF16(v) => Some(v),
            _ => None,
        }
    }
    #[inline]
    fn from_f64(v: f64) -> bf16 {
        // One correct rounding, as the reference's `DType::round`.
        luminal::dtype::bf16_from_f64(v)
    }
    #[inline]
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn plus_zero(self) -> bf16 {
        // Exact in the half type: only `-0.0` changes (to `+0.0`).
        if self == bf16::ZERO {
            bf16::ZERO
        } else {
            self
        }
    }
    #[inline(always)]
    fn widen(src: &[bf16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [bf16]) {
        assert_eq!(src.len(), dst.len());
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16::from_bits(bf16_bits(s));
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        // SAFETY: the caller guarantees AVX2 and 8 readable elements (16 bytes).
        unsafe {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growing_past_the_huge_page_size_keeps_the_contents() {
        let mut s = Storage::F32((0..1000).map(|i| i as f32).collect());
        let n = 3 * HUGE_BYTES / 4 + 17;
        s.ensure_len(n);
        let Storage::F32(v) = &s else { unreachable!() };
        assert_eq!(v.len(), n);
        assert!((0..1000).all(|i| v[i] == i as f32));
        assert!(v[1000..].iter().all(|&x| x == 0.0));
        // Growing within the capacity does not reallocate.
        let p = v.as_ptr();
        s.ensure_len(n);
        let Storage::F32(v) = &s else { unreachable!() };
        assert_eq!(v.as_ptr(), p);
    }
}
