//! Typed errors of the CUDA backend. Each maps into `LuminalError::Backend` (the core's error
//! for device failures), keeping its message.

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;
use luminal::LuminalError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CudaError {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver: libcuda could not be loaded (no NVIDIA driver on this machine)")]
    DriverNotFound,
    /// `libnvrtc` could not be loaded: the CUDA toolkit's runtime compiler is missing.
    #[error("no NVRTC: libnvrtc could not be loaded (install the CUDA toolkit or put its lib64 on LD_LIBRARY_PATH)")]
    NvrtcNotFound,
    /// The driver loaded but device `ordinal` could not be opened.
    #[error("CUDA device {ordinal}: {source:?}")]
    Device { ordinal: usize, source: DriverError },
    /// A driver call failed (allocation, copy, module load, launch, synchronisation).
    #[error("CUDA driver error in {what}: {source:?}")]
    Driver {
        what: &'static str,
        source: DriverError,
    },
    /// NVRTC rejected a generated kernel; `log` is its compile log.
    #[error("NVRTC failed to compile {kernel} for {arch}: {log}")]
    Nvrtc {
        kernel: String,
        arch: String,
        log: String,
    },
    /// A cuBLAS call failed (matmul; not used by the generated kernels yet).
    #[error("cuBLAS error in {what}: {source:?}")]
    Cublas {
        what: &'static str,
        source: CublasError,
    },
}

impl From<CudaError> for LuminalError {
    fn from(e: CudaError) -> LuminalError {
        LuminalError::Backend(e.to_string())
    }
}

/// `map_err` helper for driver calls.
pub(crate) fn driver(what: &'static str) -> impl Fn(DriverError) -> LuminalError {
    move |source| CudaError::Driver { what, source }.into()
}
