//! Casts into the block-quantized types and a quantized KV-cache state on the CPU backend,
//! against gguf-py's quantizers (the core's `testing::quantize` checks), with and without
//! the generic passes.

use luminal_cpu::CpuBackend;

#[test]
fn casts_to_quantized_types_match_gguf_py() {
    luminal::testing::check_quantized_cast(CpuBackend::default());
}

#[test]
fn quantized_state_is_written_in_place_and_read_back() {
    luminal::testing::check_quantized_state(CpuBackend::default());
}
