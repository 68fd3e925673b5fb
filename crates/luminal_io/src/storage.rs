//! The bytes behind a reader: a read-only memory map of a file, a copy of it in memory
//! backed by 2 MiB pages, or an owned buffer.
//!
//! Both readers parse a plain `&[u8]`, so a file opened from disk and a buffer handed to
//! `from_bytes` (tests, fuzzing, network downloads) go through exactly the same code.
//!
//! **Huge pages.** Decoding streams every weight once per token; through a file mapping
//! (4 KiB pages) that walks a page table every 4 KiB, which costs a third of a quantized
//! 1B model's decode speed on the KVM host of `benches/README.md` (Llama-3.2-1B-shaped
//! Q4_K_M, one thread: 10.8 tok/s mapped, 14.8 in 2 MiB pages). So on Linux, where
//! transparent huge pages can be asked for (`/sys/kernel/mm/transparent_hugepage/enabled`
//! is `always` or `madvise`), a file of at least [`HUGE_MIN`] bytes that a model loads
//! (`GgufFile::load`, `GgufFile::into_loaded` after an `open`, `SafetensorsModel::load`;
//! `open` keeps mapping) is read into anonymous
//! memory advised `MADV_HUGEPAGE` instead of being mapped: the same resident size (the
//! whole file), one copy from the page cache at load. `LUMINAL_MMAP=1` keeps the plain
//! file mapping (as llama.cpp's default `--mmap`).

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

use crate::error::{IoError, Result};

/// Bytes of a model file.
pub(crate) enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    /// The file read into anonymous memory advised to use huge pages.
    Huge(memmap2::Mmap),
}

/// Files at least this large are read into huge pages (see the module docs).
pub(crate) const HUGE_MIN: u64 = 32 << 20;

/// Whether large files go to huge pages here: Linux with transparent huge pages on
/// (`always` or `madvise`), and `LUMINAL_MMAP` is not `1`.
fn huge_pages_wanted() -> bool {
    if !cfg!(target_os = "linux") || std::env::var("LUMINAL_MMAP").is_ok_and(|v| v == "1") {
        return false;
    }
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}

impl Storage {
    /// Memory-maps `path` read-only.
    pub(crate) fn map(path: &Path) -> Result<Storage> {
        Storage::open(path, false)
    }

    /// The bytes of `path` for running a model: read into huge pages where that is wanted
    /// (see the module docs), else memory-mapped.
    pub(crate) fn load(path: &Path) -> Result<Storage> {
        Storage::open(path, true)
    }

    /// The bytes of `path` copied into anonymous memory advised to use huge pages (what
    /// [`Storage::load`] makes of a file it [`Storage::wants_copy`]).
    ///
    /// First hands the allocator's free heap back ([`luminal::release_free_heap`]): the
    /// copy is a load's largest allocation, and the freed heap of a model compiled just
    /// before would otherwise stay resident beside it.
    pub(crate) fn copy(path: &Path) -> Result<Storage> {
        luminal::release_free_heap();
        let (file, len) = open_sized(path)?;
        if len == 0 {
            return Ok(Storage::Owned(Vec::new()));
        }
        Storage::read_huge(path, file, len)
    }

    /// Whether [`Storage::load`] copies a file of `len` bytes (rather than mapping it).
    pub(crate) fn wants_copy(len: u64) -> bool {
        len >= HUGE_MIN && huge_pages_wanted()
    }

    fn open(path: &Path, huge: bool) -> Result<Storage> {
        let (file, len) = open_sized(path)?;
        if len == 0 {
            // mmap(2) rejects empty mappings; an empty buffer parses to a `Truncated` error.
            return Ok(Storage::Owned(Vec::new()));
        }
        // SAFETY: the mapping is read-only and private to this process. The one hazard is
        // another process truncating or rewriting the file while it is mapped (which would make
        // reads fault or change under us); every mmap-based model loader (llama.cpp, candle,
        // safetensors) accepts this, and model files are not edited while a model runs.
        if huge && Storage::wants_copy(len) {
            return Storage::read_huge(path, file, len);
        }
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }
            .map_err(|source| os_error(path, source))?;
        Ok(Storage::Mapped(map))
    }

    /// Reads the `len` bytes of `file` into anonymous memory advised `MADV_HUGEPAGE` (then
    /// made read-only).
    fn read_huge(path: &Path, #[allow(unused_mut)] mut file: File, len: u64) -> Result<Storage> {
        #[cfg(not(unix))]
        use std::io::Read;
        let len = usize::try_from(len).map_err(|_| IoError::Os {
            path: path.to_path_buf(),
            source: std::io::Error::other("file larger than the address space"),
        })?;
        let mut anon = memmap2::MmapMut::map_anon(len).map_err(|source| os_error(path, source))?;
        #[cfg(target_os = "linux")]
        // A hint: without it (or if refused) the copy is in ordinary pages.
        let _ = anon.advise(memmap2::Advice::HugePage);
        // Read in parallel (16 MiB pieces, whole huge pages, enough of them to balance the
        // threads): faulting in and zeroing the huge pages and the copy from the page cache
        // are shared by the threads.
        const PIECE: usize = 16 << 20;
        #[cfg(unix)]
        {
            use rayon::prelude::*;
            use std::os::unix::fs::FileExt;
            anon.par_chunks_mut(PIECE)
                .enumerate()
                .try_for_each(|(i, piece)| file.read_exact_at(piece, (i * PIECE) as u64))
                .map_err(|source| os_error(path, source))?;
        }
        #[cfg(not(unix))]
        file.read_exact(&mut anon[..])
            .map_err(|source| os_error(path, source))?;
        let map = anon
            .make_read_only()
            .map_err(|source| os_error(path, source))?;
        Ok(Storage::Huge(map))
    }
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
            Storage::Huge(map) => map,
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
            Storage::Huge(_) => "huge pages",
        };
        write!(f, "Storage({kind}, {} bytes)", self.len())
    }
}

/// `path` opened for reading, and its length.
fn open_sized(path: &Path) -> Result<(File, u64)> {
    let file = File::open(path).map_err(|source| os_error(path, source))?;
    let len = file
        .metadata()
        .map_err(|source| os_error(path, source))?
        .len();
    Ok((file, len))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_copy_holds_the_file() {
        let dir = std::env::temp_dir().join(format!("luminal-io-huge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.bin");
        let bytes: Vec<u8> = (0..3_000_017u32).map(|i| (i * 7919 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let s = Storage::read_huge(&path, file, bytes.len() as u64).unwrap();
        assert!(matches!(s, Storage::Huge(_)));
        assert_eq!(&s[..], &bytes[..]);
        // A file shorter than its stated length is an error, not a short buffer.
        let file = File::open(&path).unwrap();
        assert!(Storage::read_huge(&path, file, bytes.len() as u64 + 1).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
