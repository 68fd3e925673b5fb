//! Any byte string must parse to a `GgufFile` or a typed error, and every tensor of a file
//! that parses must read (raw bytes and f32) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use luminal_io::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data) else {
        return;
    };
    for (_, value) in file.metadata().iter() {
        let _ = value.type_description();
    }
    for info in file.tensors() {
        let _ = info.shape();
        let _ = file.tensor_bytes(info.name());
        // Decoding is bounded by the file size (at most 32 f32 per 18-byte Q4_0 block).
        let _ = file.tensor_f32(info.name());
    }
});
