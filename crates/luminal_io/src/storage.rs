//! The bytes behind a reader: a read-only memory map of a file, or an owned buffer.
//!
//! Both readers parse a plain `&[u8]`, so a file opened from disk and a buffer handed to
//! `from_bytes` (tests, fuzzing, network downloads) go through exactly the same code.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use crate::error::{IoError, Result};

/// Bytes of a model file.
pub(crate) enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    /// Memory-maps `path` read-only.
    pub(crate) fn map(path: &Path) -> Result<Storage> {
        let file = File::open(path).map_err(|source| os_error(path, source))?;
        let len = file
            .metadata()
            .map_err(|source| os_error(path, source))?
            .len();
        if len == 0 {
            // mmap(2) rejects empty mappings; an empty buffer parses to a `Truncated` error.
            return Ok(Storage::Owned(Vec::new()));
        }
        // SAFETY: the mapping is read-only and private to this process. The one hazard is
        // another process truncating or rewriting the file while it is mapped (which would make
        // reads fault or change under us); every mmap-based model loader (llama.cpp, candle,
        // safetensors) accepts this, and model files are not edited while a model runs.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }
            .map_err(|source| os_error(path, source))?;
        Ok(Storage::Mapped(map))
    }
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}

impl AsRef<[u8]> for Storage {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Storage::Mapped(_) => "mapped",
            Storage::Owned(_) => "owned",
        };
        write!(f, "Storage({kind}, {} bytes)", self.len())
    }
}

/// Maps an OS error to `NotFound` or `Os`, keeping the path.
pub(crate) fn os_error(path: &Path, source: std::io::Error) -> IoError {
    if source.kind() == std::io::ErrorKind::NotFound {
        IoError::NotFound {
            path: path.to_path_buf(),
        }
    } else {
        IoError::Os {
            path: path.to_path_buf(),
            source,
        }
    }
}
