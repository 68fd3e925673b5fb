//! Any byte string must parse to a `SafetensorsFile` or a typed error, and every tensor of a
//! file that parses must read without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use luminal_io::SafetensorsFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = SafetensorsFile::from_bytes(data) else {
        return;
    };
    for info in file.tensors() {
        let _ = file.tensor_bytes(info.name());
        let _ = file.tensor_f32(info.name());
    }
});
