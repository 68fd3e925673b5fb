//! GGUF v2/v3 reader (the llama.cpp / ggml model format).
//!
//! Layout of a file (all little-endian), per the ggml `docs/gguf.md` specification:
//!
//! ```text
//! magic "GGUF" | version: u32 | n_tensors: u64 | n_kv: u64
//! n_kv × (key: string, value_type: u32, value)          string = u64 length + UTF-8 bytes
//! n_tensors × (name: string, n_dims: u32, dims: [u64; n_dims], ggml_type: u32, offset: u64)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset, offset a multiple of the alignment
//! ```
//!
//! `dims` are in ggml order: `dims[0]` is the innermost (contiguous) dimension, so a PyTorch
//! weight of shape `[out, in]` is stored with `dims = [in, out]`. [`TensorInfo::shape`] gives
//! the row-major (PyTorch) order.
//!
//! ```no_run
//! # fn main() -> Result<(), luminal_io::IoError> {
//! let file = luminal_io::GgufFile::open("models/smollm2-135m-q4_1.gguf")?;
//! let n_layers = file.metadata().get_u32("llama.block_count")?;
//! let embedding = file.tensor_f32("token_embd.weight")?;
//! # Ok(()) }
//! ```

mod metadata;
mod parse;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use luminal::{HostData, SharedBytes};

pub use metadata::{Metadata, MetadataArray, MetadataType, MetadataValue};
pub use parse::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};

use crate::error::{IoError, Result};
use crate::ggml_type::GgmlType;
use crate::quant;
use crate::storage::Storage;

/// One tensor's header entry, validated against the file when it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
    n_elements: u64,
    n_bytes: u64,
}

impl TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions in ggml order (`dims[0]` varies fastest), as stored in the file.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Dimensions in row-major order (the last one varies fastest), like PyTorch's `shape`.
    pub fn shape(&self) -> Vec<usize> {
        // Every dimension is at most the element count, which fits in memory, so the casts
        // are lossless on 64-bit targets.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// The stored element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Offset of the data from the start of the data section.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// Number of bytes of (possibly quantized) data.
    pub fn n_bytes(&self) -> u64 {
        self.n_bytes
    }
}

/// A GGUF file, memory-mapped (or held in memory), with its header parsed and validated.
#[derive(Debug)]
pub struct GgufFile {
    storage: Arc<Storage>,
    path: Option<PathBuf>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Memory-maps and parses the GGUF file at `path`.
    ///
    /// All tensor ranges are checked against the file size here, so a truncated download fails
    /// now, naming the first tensor that does not fit.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_with(path.as_ref(), Storage::map)
    }

    /// Opens the GGUF file at `path` to run its model: as [`GgufFile::open`], but a large
    /// file is read into memory backed by 2 MiB pages where the OS offers them (decode
    /// streams every weight each token; see `storage.rs`; `LUMINAL_MMAP=1` maps instead).
    pub fn load(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_with(path.as_ref(), Storage::load)
    }

    /// [`GgufFile::load`] in two halves: [`GgufFile::open`] maps the file and parses its
    /// header (enough to build and compile a model's graph), then this copies the data into
    /// huge pages where `load` would, keeping the parsed header. Run after the compile, the
    /// copy does not sit in memory beside the compiler's working set (see
    /// `Storage::copy`). Fails if the file changed since it was opened (its length or
    /// header bytes differ). Data taken from the file before this call reads the mapping.
    pub fn into_loaded(self) -> Result<GgufFile> {
        let copy =
            matches!(*self.storage, Storage::Mapped(_)) && Storage::wants_copy(self.file_len());
        self.into_copied(copy)
    }

    /// This file reading from a copy of itself when `copy` (and it was opened from a path).
    fn into_copied(self, copy: bool) -> Result<GgufFile> {
        match (copy, &self.path) {
            (true, Some(path)) => {
                let storage = Storage::copy(path)?;
                self.with_storage(storage)
            }
            _ => Ok(self),
        }
    }

    /// This file reading from `storage`, a later read of the same file: refused (the file
    /// changed in between) unless the length and the header bytes are the same.
    fn with_storage(mut self, storage: Storage) -> Result<GgufFile> {
        let header = self.data_offset as usize;
        if storage.len() != self.storage.len() || storage[..header] != self.storage[..header] {
            return Err(IoError::Os {
                path: self.path.clone().unwrap_or_default(),
                source: std::io::Error::other("the file changed while it was being read"),
            });
        }
        self.storage = Arc::new(storage);
        Ok(self)
    }

    fn open_with(path: &Path, read: fn(&Path) -> Result<Storage>) -> Result<GgufFile> {
        let storage = read(path)?;
        let mut file = Self::from_storage(storage).map_err(|e| e.in_file(path))?;
        file.path = Some(path.to_path_buf());
        Ok(file)
    }

    /// Parses a GGUF file held in memory (same checks as [`GgufFile::open`]).
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<GgufFile> {
        Self::from_storage(Storage::Owned(bytes.into()))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile> {
        if usize::try_from(storage.len() as u64).is_err() {
            return Err(IoError::TooLargeForPlatform {
                what: "file size".into(),
                value: storage.len() as u64,
            });
        }
        let header = parse::parse_header(&storage)?;
        Ok(GgufFile {
            storage: Arc::new(storage),
            path: None,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            by_name: header.by_name,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// The path the file was opened from (`None` for [`GgufFile::from_bytes`]).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata, in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| IoError::TensorNotFound {
                name: name.to_string(),
            })
    }

    /// Alignment of the data section and of tensor offsets.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.storage.len() as u64
    }

    /// The raw (possibly quantized) bytes of tensor `name`, borrowed from the mapping.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor_info(name)?;
        Ok(self.bytes_of(info))
    }

    fn bytes_of(&self, info: &TensorInfo) -> &[u8] {
        // `parse_header` checked data_offset + offset + n_bytes <= file length without
        // overflow, and the file length fits in usize (checked in `from_storage`).
        let start = (self.data_offset + info.offset) as usize;
        &self.storage[start..start + info.n_bytes as usize]
    }

    /// Tensor `name` as graph input data, without a copy where the type has a Luminal dtype
    /// ([`GgmlType::dtype`]: the float and block-quantized types): a window onto the file's
    /// mapping that keeps it alive. Other decodable types (ints, f64) are decoded to f32.
    pub fn tensor_data(&self, name: &str) -> Result<HostData> {
        let info = self.tensor_info(name)?;
        if let Some(dtype) = info.ggml_type.dtype() {
            let start = (self.data_offset + info.offset) as usize;
            let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.storage.clone();
            let bytes = SharedBytes::new(owner, start..start + info.n_bytes as usize)
                .expect("tensor ranges were checked against the file when it was parsed");
            return HostData::from_bytes(dtype, bytes).map_err(|e| IoError::LengthMismatch {
                tensor: name.to_string(),
                what: format!("{} data ({e})", info.ggml_type),
                expected: info.n_bytes,
                found: info.n_bytes,
            });
        }
        Ok(HostData::F32(self.tensor_f32(name)?))
    }

    /// Tensor `name` decoded to f32, row-major in [`TensorInfo::shape`] order.
    ///
    /// Large tensors are decoded on rayon's thread pool. Errors with
    /// [`IoError::UnsupportedDtype`] for types without a decoder (the IQ/TQ families).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.tensor_info(name)?;
        let n = usize::try_from(info.n_elements).map_err(|_| IoError::TooLargeForPlatform {
            what: format!("element count of tensor {name}"),
            value: info.n_elements,
        })?;
        // Refuse before allocating: the decoder could not fill the buffer anyway.
        if !info.ggml_type.can_dequantize() {
            return Err(IoError::UnsupportedDtype {
                tensor: name.to_string(),
                dtype: info.ggml_type.name().to_string(),
            });
        }
        let mut out = vec![0f32; n];
        quant::dequantize_tensor(name, info.ggml_type, self.bytes_of(info), &mut out, true)?;
        Ok(out)
    }

    /// Decodes tensor `name` into `out`, which must hold exactly its element count.
    pub fn tensor_f32_into(&self, name: &str, out: &mut [f32]) -> Result<()> {
        let info = self.tensor_info(name)?;
        if out.len() as u64 != info.n_elements {
            return Err(IoError::LengthMismatch {
                tensor: name.to_string(),
                what: "output buffer".into(),
                expected: info.n_elements,
                found: out.len() as u64,
            });
        }
        quant::dequantize_tensor(name, info.ggml_type, self.bytes_of(info), out, true)
    }

    /// Like [`GgufFile::tensor_f32`], but first checks that the row-major shape is `expected`.
    pub fn tensor_f32_with_shape(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        let found = self.tensor_info(name)?.shape();
        if found != expected {
            return Err(IoError::ShapeMismatch {
                tensor: name.to_string(),
                expected: expected.to_vec(),
                found,
            });
        }
        self.tensor_f32(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_copy(tag: &str) -> (PathBuf, Vec<u8>) {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny.gguf");
        let bytes = std::fs::read(fixture).unwrap();
        let dir = std::env::temp_dir().join(format!("luminal-gguf-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    }

    /// The header is read from the mapping, the data from the copy swapped in later: every
    /// tensor's bytes are the file's.
    #[test]
    fn a_copied_file_reads_the_same_tensors() {
        let (path, bytes) = tiny_copy("copied");
        let opened = GgufFile::open(&path).unwrap();
        let loaded = GgufFile::open(&path).unwrap().into_copied(true).unwrap();
        assert_eq!(loaded.tensors(), opened.tensors());
        assert!(
            matches!(*loaded.storage, Storage::Huge(_)),
            "{:?}",
            loaded.storage
        );
        assert_eq!(&loaded.storage[..], &bytes[..]);
        assert!(!opened.tensors().is_empty());
        for t in opened.tensors() {
            let want =
                &bytes[(opened.data_offset() + t.offset()) as usize..][..t.n_bytes() as usize];
            assert_eq!(loaded.tensor_bytes(t.name()).unwrap(), want, "{}", t.name());
        }
        // Without a copy, the mapped file.
        let mapped = GgufFile::open(&path).unwrap().into_copied(false).unwrap();
        assert!(matches!(*mapped.storage, Storage::Mapped(_)));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    /// A copy that does not match the parsed header (the file was rewritten in between) is
    /// refused with the path named.
    #[test]
    fn a_file_changed_before_its_copy_is_refused() {
        let (path, mut bytes) = tiny_copy("changed");
        let file = GgufFile::open(&path).unwrap();
        // A metadata byte changes (same length).
        bytes[30] ^= 1;
        let err = file
            .with_storage(Storage::Owned(bytes.clone()))
            .unwrap_err();
        assert!(err.to_string().contains("changed"), "{err}");
        assert!(err.to_string().contains("tiny.gguf"), "{err}");
        // The length changes.
        let file = GgufFile::open(&path).unwrap();
        bytes[30] ^= 1;
        bytes.push(0);
        assert!(file.with_storage(Storage::Owned(bytes)).is_err());
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
