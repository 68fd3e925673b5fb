//! The backend-generic op suite, run on the CPU backend.
luminal::op_suite!(luminal_cpu::CpuBackend::default());
