//! safetensors reader: one memory-mapped file ([`SafetensorsFile`]) or a sharded model behind a
//! `model.safetensors.index.json` ([`SafetensorsModel`]).
//!
//! A file is an 8-byte little-endian header length `n`, `n` bytes of JSON mapping each tensor
//! name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the end of
//! the header, tensors packed back to back) plus an optional `"__metadata__"` string map, then
//! the data.
//!
//! The header is validated twice: first here, entry by entry with checked arithmetic, so that
//! errors name the tensor and the numbers (and no size computation can overflow); then by the
//! `safetensors` crate, which also checks that the tensors tile the data section exactly.

mod sharded;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use safetensors::Dtype;
pub use sharded::SafetensorsModel;

use crate::error::{IoError, Result};
use crate::quant;
use crate::storage::Storage;

/// Largest header accepted (the same limit as the `safetensors` crate).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafetensorInfo {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range within the data section.
    data_offsets: (usize, usize),
}

impl SafetensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stored element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Row-major shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements (the product of the shape; validated not to overflow).
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Byte range within the data section (after the header).
    pub fn data_offsets(&self) -> (usize, usize) {
        self.data_offsets
    }
}

/// A single safetensors file, memory-mapped (or held in memory), header validated.
#[derive(Debug)]
pub struct SafetensorsFile {
    storage: std::sync::Arc<Storage>,
    path: Option<PathBuf>,
    data_start: usize,
    tensors: Vec<SafetensorInfo>,
    by_name: HashMap<String, usize>,
    metadata: HashMap<String, String>,
}

impl SafetensorsFile {
    /// Memory-maps and validates the safetensors file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        Self::open_with(path.as_ref(), Storage::map)
    }

    /// Opens the file at `path` to run its model: as [`SafetensorsFile::open`], but a large
    /// file is read into memory backed by 2 MiB pages where the OS offers them (see
    /// `storage.rs`; `LUMINAL_MMAP=1` maps instead).
    pub fn load(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        Self::open_with(path.as_ref(), Storage::load)
    }

    pub(crate) fn open_with(
        path: &Path,
        read: fn(&Path) -> Result<Storage>,
    ) -> Result<SafetensorsFile> {
        let storage = read(path)?;
        let mut file = Self::from_storage(storage).map_err(|e| e.in_file(path))?;
        file.path = Some(path.to_path_buf());
        Ok(file)
    }

    /// Validates a safetensors file held in memory (same checks as [`SafetensorsFile::open`]).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<SafetensorsFile> {
        Self::from_storage(Storage::Owned(bytes.into()))
    }

    fn from_storage(storage: Storage) -> Result<SafetensorsFile> {
        let (data_start, metadata) = precheck_header(&storage)?;
        let (_, checked) =
            safetensors::SafeTensors::read_metadata(&storage).map_err(|e| IoError::BadHeader {
                reason: e.to_string(),
            })?;
        let mut tensors = Vec::with_capacity(checked.offset_keys().len());
        let mut by_name = HashMap::new();
        for name in checked.offset_keys() {
            let Some(info) = checked.info(&name) else {
                continue;
            };
            by_name.insert(name.clone(), tensors.len());
            tensors.push(SafetensorInfo {
                name,
                dtype: info.dtype,
                shape: info.shape.clone(),
                data_offsets: info.data_offsets,
            });
        }
        Ok(SafetensorsFile {
            storage: std::sync::Arc::new(storage),
            path: None,
            data_start,
            tensors,
            by_name,
            metadata,
        })
    }

    /// The path the file was opened from (`None` for [`SafetensorsFile::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Tensor infos, in data order.
    pub fn tensors(&self) -> &[SafetensorInfo] {
        &self.tensors
    }

    /// Tensor names, in data order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// Whether the file holds tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The free-form `__metadata__` string map (empty if absent).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Result<&SafetensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| IoError::TensorNotFound {
                name: name.to_string(),
            })
    }

    /// The raw little-endian bytes of tensor `name`, borrowed from the mapping.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor_info(name)?;
        // Validated at open: data_start + end <= file length, begin <= end.
        let (begin, end) = info.data_offsets;
        Ok(&self.storage[self.data_start + begin..self.data_start + end])
    }

    /// Tensor `name` as graph input data: F32, F16 and BF16 tensors as a window onto the
    /// file's mapping (no copy); other dtypes are an [`IoError::UnsupportedDtype`].
    pub fn tensor_data(&self, name: &str) -> Result<luminal::HostData> {
        let info = self.tensor_info(name)?;
        let dtype = match info.dtype {
            Dtype::F32 => luminal::DType::F32,
            Dtype::F16 => luminal::DType::F16,
            Dtype::BF16 => luminal::DType::BF16,
            other => {
                return Err(IoError::UnsupportedDtype {
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        let (begin, end) = info.data_offsets;
        let owner: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> = self.storage.clone();
        let bytes =
            luminal::SharedBytes::new(owner, self.data_start + begin..self.data_start + end)
                .expect("tensor ranges were checked against the file when it was opened");
        luminal::HostData::from_bytes(dtype, bytes).map_err(|e| IoError::LengthMismatch {
            tensor: name.to_string(),
            what: format!("{dtype} data ({e})"),
            expected: info.n_elements() as u64 * dtype.block_bytes() as u64,
            found: (end - begin) as u64,
        })
    }

    /// Tensor `name` converted to f32 (from F32, F16 or BF16; other dtypes are an
    /// [`IoError::UnsupportedDtype`]).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        let converter = f32_converter(info)?;
        let mut out = vec![0f32; info.n_elements()];
        converter(self.tensor_bytes(name)?, &mut out);
        Ok(out)
    }

    /// Converts tensor `name` into `out`, which must hold exactly its element count.
    pub fn tensor_f32_into(&self, name: &str, out: &mut [f32]) -> Result<()> {
        let info = self.tensor_info(name)?;
        let converter = f32_converter(info)?;
        if out.len() != info.n_elements() {
            return Err(IoError::LengthMismatch {
                tensor: name.to_string(),
                what: "output buffer".into(),
                expected: info.n_elements() as u64,
                found: out.len() as u64,
            });
        }
        converter(self.tensor_bytes(name)?, out);
        Ok(())
    }

    /// Like [`SafetensorsFile::tensor_f32`], but first checks that the shape is `expected`.
    pub fn tensor_f32_with_shape(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        check_shape(self.tensor_info(name)?, expected)?;
        self.tensor_f32(name)
    }
}

pub(crate) fn check_shape(info: &SafetensorInfo, expected: &[usize]) -> Result<()> {
    if info.shape != expected {
        return Err(IoError::ShapeMismatch {
            tensor: info.name.clone(),
            expected: expected.to_vec(),
            found: info.shape.clone(),
        });
    }
    Ok(())
}

/// The converter to f32 for a tensor's dtype. Lengths always match: the header check proved
/// `end - begin == n_elements · size_of(dtype)`.
fn f32_converter(info: &SafetensorInfo) -> Result<quant::BlockDecoder> {
    match info.dtype {
        Dtype::F32 => Ok(quant::convert_f32),
        Dtype::F16 => Ok(quant::convert_f16),
        Dtype::BF16 => Ok(quant::convert_bf16),
        other => Err(IoError::UnsupportedDtype {
            tensor: info.name.clone(),
            dtype: other.to_string(),
        }),
    }
}

fn bad_header(reason: impl Into<String>) -> IoError {
    IoError::BadHeader {
        reason: reason.into(),
    }
}

/// Checks the header entry by entry; returns where the data section starts and the
/// `__metadata__` map.
fn precheck_header(bytes: &[u8]) -> Result<(usize, HashMap<String, String>)> {
    let file_len = bytes.len() as u64;
    let Some(len_bytes) = bytes.first_chunk::<8>() else {
        return Err(IoError::Truncated {
            what: "safetensors header length".into(),
            end: 8,
            file_len,
        });
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > MAX_HEADER_LEN {
        return Err(bad_header(format!(
            "header length {header_len} exceeds the {MAX_HEADER_LEN}-byte limit"
        )));
    }
    // header_len <= 1e8, so neither the sum nor the casts below can overflow.
    let data_start = 8 + header_len;
    if data_start > file_len {
        return Err(IoError::Truncated {
            what: format!("safetensors header ({header_len} bytes)"),
            end: data_start,
            file_len,
        });
    }
    let data_len = file_len - data_start;
    let text = std::str::from_utf8(&bytes[8..data_start as usize])
        .map_err(|e| bad_header(format!("header is not UTF-8: {e}")))?;
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad_header(format!("header is not JSON: {e}")))?;
    let serde_json::Value::Object(entries) = json else {
        return Err(bad_header("header is not a JSON object"));
    };
    let mut metadata = HashMap::new();
    for (name, entry) in &entries {
        if name == "__metadata__" {
            metadata = parse_metadata(entry)?;
        } else {
            check_entry(name, entry, data_start, data_len)?;
        }
    }
    Ok((data_start as usize, metadata))
}

fn parse_metadata(entry: &serde_json::Value) -> Result<HashMap<String, String>> {
    let serde_json::Value::Object(map) = entry else {
        return Err(bad_header("__metadata__ is not an object"));
    };
    map.iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(bad_header(format!(
                "__metadata__ value of {k} is not a string"
            ))),
        })
        .collect()
}

fn check_entry(
    name: &str,
    entry: &serde_json::Value,
    data_start: u64,
    data_len: u64,
) -> Result<()> {
    let field = |key: &str| {
        entry
            .get(key)
            .ok_or_else(|| bad_header(format!("tensor {name} has no {key}")))
    };
    let dtype_name = field("dtype")?
        .as_str()
        .ok_or_else(|| bad_header(format!("dtype of tensor {name} is not a string")))?;
    let dtype: Dtype = serde_json::from_value(serde_json::Value::String(dtype_name.to_string()))
        .map_err(|_| IoError::UnknownDtype {
            tensor: name.to_string(),
            dtype: dtype_name.to_string(),
        })?;
    let shape = u64_list(field("shape")?)
        .ok_or_else(|| bad_header(format!("shape of tensor {name} is not a list of integers")))?;
    let offsets = u64_list(field("data_offsets")?);
    let Some(&[begin, end]) = offsets.as_deref() else {
        return Err(bad_header(format!(
            "data_offsets of tensor {name} is not a pair of integers"
        )));
    };
    if begin > end {
        return Err(bad_header(format!(
            "tensor {name} has data_offsets [{begin}, {end}]: begin after end"
        )));
    }
    if end > data_len {
        let what = format!("tensor {name}");
        return Err(match data_start.checked_add(end) {
            Some(end) => IoError::Truncated {
                what,
                end,
                file_len: data_start + data_len,
            },
            None => IoError::Overflow {
                what: format!("end of {what} (data_offsets end {end})"),
            },
        });
    }
    let n_bits = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.bitsize() as u64))
        .ok_or_else(|| IoError::Overflow {
            what: format!("byte size of tensor {name} (shape {shape:?}, {dtype})"),
        })?;
    if n_bits % 8 != 0 || n_bits / 8 != end - begin {
        return Err(IoError::LengthMismatch {
            tensor: name.to_string(),
            what: format!("data (shape {shape:?}, {dtype})"),
            expected: n_bits.div_ceil(8),
            found: end - begin,
        });
    }
    Ok(())
}

fn u64_list(value: &serde_json::Value) -> Option<Vec<u64>> {
    value
        .as_array()?
        .iter()
        .map(serde_json::Value::as_u64)
        .collect()
}
