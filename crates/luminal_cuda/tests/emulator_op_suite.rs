//! The core's op suite on the host emulator: the CUDA backend's generated kernels compiled by
//! the system C compiler and run over their grids on the CPU (see `luminal_cuda::host`). On a
//! GPU the same sources go through NVRTC (`tests/op_suite.rs`).

use luminal_cuda::HostEmulatorBackend;

luminal::op_suite!(HostEmulatorBackend);
