//! Parsing a GGUF header from a byte slice, validating everything against the slice's length
//! before use (with checked arithmetic), so hostile input yields a typed error, never a panic,
//! an overflow or an allocation the file cannot back.

use std::collections::HashMap;

use super::metadata::{Metadata, MetadataArray, MetadataType, MetadataValue};
use super::TensorInfo;
use crate::error::{IoError, Result};
use crate::ggml_type::GgmlType;

/// "GGUF" as stored at the start of every file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's limit on tensor rank.
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted; real files nest at most once.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most slots reserved up front for a count read from the file. Counts are already checked
/// against the bytes left, but an entry in memory is larger than its smallest encoding, so
/// vectors beyond this grow as elements are actually read instead.
const MAX_PREALLOCATION: u64 = 1 << 16;
/// Fewest bytes of one metadata entry: key length, value type, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes of one tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Everything the header says, checked against the file.
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub by_name: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// A cursor over the file bytes whose reads fail with `Truncated` (naming what was being read)
/// instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            let what = what();
            return Err(match (self.pos as u64).checked_add(n) {
                Some(end) => IoError::Truncated {
                    what,
                    end,
                    file_len: self.file_len(),
                },
                None => IoError::ImplausibleCount {
                    what: format!("length of {what}"),
                    count: n,
                    needed: n as u128,
                    remaining: self.remaining(),
                },
            });
        }
        // n <= remaining <= usize::MAX, so the cast and the slice are in range.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 byte length, then the bytes (no terminator).
    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let len = self.u64(|| format!("length of {}", what()))?;
        self.take(len, what)
    }

    /// A string that must be valid UTF-8 (keys, tensor names).
    fn strict_string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let bytes = self.string_bytes(what)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| IoError::InvalidUtf8 { what: what() })
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in the rest of the file.
    fn check_count(&self, count: u64, min_size: u64, what: impl FnOnce() -> String) -> Result<()> {
        let needed = count as u128 * min_size as u128;
        if needed > self.remaining() as u128 {
            return Err(IoError::ImplausibleCount {
                what: what(),
                count,
                needed,
                remaining: self.remaining(),
            });
        }
        Ok(())
    }
}

/// Parses and validates the header of the GGUF file `bytes`.
pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header> {
    let mut r = Reader { bytes, pos: 0 };
    let magic: [u8; 4] = r.array(|| "GGUF magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(IoError::BadMagic { found: magic });
    }
    let version = r.u32(|| "GGUF version".into())?;
    check_version(version)?;
    let n_tensors = r.u64(|| "tensor count".into())?;
    let n_kv = r.u64(|| "metadata entry count".into())?;
    r.check_count(n_kv, MIN_KV_BYTES, || "metadata entry count".into())?;
    r.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, || "tensor count".into())?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = r.strict_string(&|| format!("metadata key #{i}"))?;
        let type_id = r.u32(|| format!("value type of metadata key {key}"))?;
        let value = read_value(&mut r, &key, type_id)?;
        metadata.insert(key, value)?;
    }
    let alignment = alignment(&metadata)?;

    let reserve = n_tensors.min(MAX_PREALLOCATION) as usize;
    let mut tensors = Vec::with_capacity(reserve);
    let mut by_name = HashMap::with_capacity(reserve);
    for i in 0..n_tensors {
        let info = read_tensor_info(&mut r, i, alignment)?;
        if by_name.insert(info.name.clone(), tensors.len()).is_some() {
            return Err(IoError::DuplicateTensor { name: info.name });
        }
        tensors.push(info);
    }

    let data_offset = align_up(r.pos as u64, alignment).ok_or_else(|| IoError::Overflow {
        what: "start of the tensor data section".into(),
    })?;
    for info in &tensors {
        let end = data_offset
            .checked_add(info.offset)
            .and_then(|start| start.checked_add(info.n_bytes))
            .ok_or_else(|| IoError::Overflow {
                what: format!(
                    "end of tensor {} (data section at {data_offset}, offset {}, {} bytes)",
                    info.name, info.offset, info.n_bytes
                ),
            })?;
        if end > r.file_len() {
            return Err(IoError::Truncated {
                what: format!("tensor {}", info.name),
                end,
                file_len: r.file_len(),
            });
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        by_name,
        alignment,
        data_offset,
    })
}

fn check_version(version: u32) -> Result<()> {
    match version {
        2 | 3 => Ok(()),
        1 => Err(IoError::UnsupportedVersion {
            version,
            reason: "GGUF v1 uses 32-bit counts and lengths; re-convert the model",
        }),
        // A big-endian file (allowed since v3) reads as a byte-swapped small version.
        v if v > 0xFFFF && (1..=3).contains(&v.swap_bytes()) => Err(IoError::UnsupportedVersion {
            version: v.swap_bytes(),
            reason: "big-endian GGUF files are not supported",
        }),
        _ => Err(IoError::UnsupportedVersion {
            version,
            reason: "only versions 2 and 3 are supported",
        }),
    }
}

/// `general.alignment`: a non-zero power of two stored as u32, or the default 32.
fn alignment(metadata: &Metadata) -> Result<u64> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(MetadataValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(MetadataValue::U32(a)) => Err(IoError::BadAlignment {
            reason: format!("{a} is not a non-zero power of two"),
        }),
        Some(other) => Err(IoError::BadAlignment {
            reason: format!("has type {}, must be u32", other.type_description()),
        }),
    }
}

fn align_up(pos: u64, alignment: u64) -> Option<u64> {
    Some(pos.checked_add(alignment - 1)? / alignment * alignment)
}

fn read_value(r: &mut Reader<'_>, key: &str, type_id: u32) -> Result<MetadataValue> {
    use MetadataValue as V;
    let ty = MetadataType::from_id(type_id).ok_or_else(|| IoError::UnknownMetadataType {
        key: key.to_string(),
        type_id,
    })?;
    let what = || format!("value of metadata key {key}");
    Ok(match ty {
        MetadataType::U8 => V::U8(r.array(what).map(u8::from_le_bytes)?),
        MetadataType::I8 => V::I8(r.array(what).map(i8::from_le_bytes)?),
        MetadataType::U16 => V::U16(r.array(what).map(u16::from_le_bytes)?),
        MetadataType::I16 => V::I16(r.array(what).map(i16::from_le_bytes)?),
        MetadataType::U32 => V::U32(r.array(what).map(u32::from_le_bytes)?),
        MetadataType::I32 => V::I32(r.array(what).map(i32::from_le_bytes)?),
        MetadataType::F32 => V::F32(r.array(what).map(f32::from_le_bytes)?),
        MetadataType::U64 => V::U64(r.array(what).map(u64::from_le_bytes)?),
        MetadataType::I64 => V::I64(r.array(what).map(i64::from_le_bytes)?),
        MetadataType::F64 => V::F64(r.array(what).map(f64::from_le_bytes)?),
        MetadataType::Bool => V::Bool(to_bool(key, r.array::<1>(what)?[0])?),
        MetadataType::String => V::String(lossy_string(r.string_bytes(&what)?)),
        MetadataType::Array => V::Array(read_array(r, key, 1)?),
    })
}

/// Token strings in real files are almost always UTF-8; a stray invalid byte sequence in one
/// token should not make the whole model unloadable, so values are decoded lossily (keys and
/// tensor names, which are looked up by name, must be valid).
fn lossy_string(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn to_bool(key: &str, byte: u8) -> Result<bool> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(IoError::InvalidBool {
            key: key.to_string(),
            value,
        }),
    }
}

/// Reads `len` fixed-size little-endian values in one slice.
fn fixed<const N: usize, T>(
    r: &mut Reader<'_>,
    key: &str,
    len: u64,
    convert: impl Fn([u8; N]) -> T,
) -> Result<Vec<T>> {
    let n_bytes = len.checked_mul(N as u64).ok_or_else(|| IoError::Overflow {
        what: format!("size of the array of metadata key {key}"),
    })?;
    let bytes = r.take(n_bytes, || format!("array of metadata key {key}"))?;
    let (chunks, _) = bytes.as_chunks::<N>();
    Ok(chunks.iter().map(|c| convert(*c)).collect())
}

/// An array (element type, length, elements) at nesting depth `depth` (1 = top-level array).
fn read_array(r: &mut Reader<'_>, key: &str, depth: usize) -> Result<MetadataArray> {
    use MetadataArray as A;
    if depth > MAX_ARRAY_DEPTH {
        return Err(IoError::NestingTooDeep {
            key: key.to_string(),
            max_depth: MAX_ARRAY_DEPTH,
        });
    }
    let type_id = r.u32(|| format!("element type of the array of metadata key {key}"))?;
    let ty = MetadataType::from_id(type_id).ok_or_else(|| IoError::UnknownMetadataType {
        key: key.to_string(),
        type_id,
    })?;
    let len = r.u64(|| format!("length of the array of metadata key {key}"))?;
    r.check_count(len, ty.min_encoded_size(), || {
        format!("length of the array of {} of metadata key {key}", ty.name())
    })?;
    // From here `len` elements provably fit in the rest of the file.
    Ok(match ty {
        MetadataType::U8 => A::U8(fixed(r, key, len, u8::from_le_bytes)?),
        MetadataType::I8 => A::I8(fixed(r, key, len, i8::from_le_bytes)?),
        MetadataType::U16 => A::U16(fixed(r, key, len, u16::from_le_bytes)?),
        MetadataType::I16 => A::I16(fixed(r, key, len, i16::from_le_bytes)?),
        MetadataType::U32 => A::U32(fixed(r, key, len, u32::from_le_bytes)?),
        MetadataType::I32 => A::I32(fixed(r, key, len, i32::from_le_bytes)?),
        MetadataType::F32 => A::F32(fixed(r, key, len, f32::from_le_bytes)?),
        MetadataType::U64 => A::U64(fixed(r, key, len, u64::from_le_bytes)?),
        MetadataType::I64 => A::I64(fixed(r, key, len, i64::from_le_bytes)?),
        MetadataType::F64 => A::F64(fixed(r, key, len, f64::from_le_bytes)?),
        MetadataType::Bool => {
            let bytes = fixed(r, key, len, |[b]: [u8; 1]| b)?;
            A::Bool(
                bytes
                    .into_iter()
                    .map(|b| to_bool(key, b))
                    .collect::<Result<_>>()?,
            )
        }
        MetadataType::String => {
            let mut strings = Vec::with_capacity(len.min(MAX_PREALLOCATION) as usize);
            for i in 0..len {
                let bytes = r.string_bytes(&|| format!("string #{i} of metadata key {key}"))?;
                strings.push(lossy_string(bytes));
            }
            A::String(strings)
        }
        MetadataType::Array => {
            let mut arrays = Vec::with_capacity(len.min(MAX_PREALLOCATION) as usize);
            for _ in 0..len {
                arrays.push(read_array(r, key, depth + 1)?);
            }
            A::Array(arrays)
        }
    })
}

fn read_tensor_info(r: &mut Reader<'_>, index: u64, alignment: u64) -> Result<TensorInfo> {
    let name = r.strict_string(&|| format!("name of tensor #{index}"))?;
    let n_dims = r.u32(|| format!("n_dims of tensor {name}"))?;
    if n_dims > MAX_DIMS {
        return Err(IoError::TooManyDims {
            tensor: name,
            n_dims,
            max: MAX_DIMS,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(r.u64(|| format!("dimension {d} of tensor {name}"))?);
    }
    let type_id = r.u32(|| format!("type of tensor {name}"))?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| IoError::UnknownGgmlType {
        tensor: name.clone(),
        type_id,
    })?;
    let offset = r.u64(|| format!("data offset of tensor {name}"))?;

    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| IoError::Overflow {
            what: format!("element count of tensor {name} (dims {dims:?})"),
        })?;
    let row_len = dims.first().copied().unwrap_or(1);
    let block_size = ggml_type.block_size();
    if row_len % block_size != 0 {
        return Err(IoError::BlockSizeMismatch {
            tensor: name,
            ggml_type: ggml_type.name(),
            row_len,
            n_elements,
            block_size,
        });
    }
    // Rows are whole blocks, so the element count is too and `bytes_for` fails only on overflow.
    let n_bytes = ggml_type
        .bytes_for(n_elements)
        .ok_or_else(|| IoError::Overflow {
            what: format!("byte size of tensor {name} ({n_elements} × {ggml_type})"),
        })?;
    if offset % alignment != 0 {
        return Err(IoError::MisalignedOffset {
            tensor: name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_elements,
        n_bytes,
    })
}
