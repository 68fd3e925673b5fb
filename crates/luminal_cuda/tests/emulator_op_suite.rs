//! The core's op suite on the host emulator: the CUDA backend's generated kernels compiled by
//! the system C compiler and run over their grids on the CPU (see `luminal_cuda::host`). On a
//! GPU the same sources go through NVRTC (`tests/op_suite.rs`).

use luminal_cuda::HostEmulatorBackend;

luminal::op_suite!(HostEmulatorBackend);

/// Storing into a block-quantized type (a q8_0 KV cache) is a typed compile error here, not
/// elementwise code writing a block buffer.
#[test]
fn quantized_state_is_refused_with_a_typed_error() {
    use luminal::prelude::*;
    let cx = Graph::new();
    let cache = cx.input("cache", (2, 4, 64), DType::Q8_0);
    let new = cx.tensor("new", (2, 1, 64));
    cache
        .write_slice(1, 0, new.cast(DType::Q8_0))
        .dequantize()
        .output();
    match cx.compile(HostEmulatorBackend, CompileOptions::default()) {
        Err(LuminalError::Backend(msg)) => assert!(msg.contains("q8_0"), "{msg}"),
        Err(e) => panic!("expected a backend error, got {e}"),
        Ok(_) => panic!("compiled a store into q8_0"),
    }
}
