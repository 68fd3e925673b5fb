//! Deterministic "mini-fuzz": thousands of seeded random mutations of the valid fixtures; the
//! readers must return (Ok or a typed error) without panicking, and whatever parses must read.
//! The real fuzz targets (cargo fuzz, nightly) live in fuzz/.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::{fixture_bytes, Rng};
use luminal_io::{GgufFile, SafetensorsFile};

/// Values that tend to break length and offset arithmetic.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    3,
    31,
    32,
    255,
    0x7FFF_FFFF,
    0xFFFF_FFFF,
    1 << 32,
    i64::MAX as u64,
    u64::MAX,
];

/// Applies one random mutation, biased towards the first `hot` bytes (the header).
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, hot: usize) -> String {
    let len = bytes.len().max(1);
    let pos = if rng.below(4) == 0 {
        rng.below(len)
    } else {
        rng.below(hot.min(len))
    };
    match rng.below(7) {
        0 => {
            let bit = rng.below(8);
            if let Some(b) = bytes.get_mut(pos) {
                *b ^= 1 << bit;
            }
            format!("flip bit {bit} at {pos}")
        }
        1 => {
            let v = rng.next_u64() as u8;
            if let Some(b) = bytes.get_mut(pos) {
                *b = v;
            }
            format!("set byte {pos} = {v}")
        }
        2 | 3 => {
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            let le = v.to_le_bytes();
            for (i, b) in le[..width].iter().enumerate() {
                if let Some(slot) = bytes.get_mut(pos + i) {
                    *slot = *b;
                }
            }
            format!("write u{} {v} at {pos}", width * 8)
        }
        4 => {
            bytes.truncate(pos);
            format!("truncate at {pos}")
        }
        5 => {
            let n = 1 + rng.below(8);
            let at = pos.min(bytes.len());
            for _ in 0..n {
                bytes.insert(at, rng.next_u64() as u8);
            }
            format!("insert {n} bytes at {at}")
        }
        _ => {
            let n = (1 + rng.below(8)).min(bytes.len().saturating_sub(pos));
            bytes.drain(pos..pos + n);
            format!("delete {n} bytes at {pos}")
        }
    }
}

/// Runs `iterations` mutated inputs (1–3 mutations each) through `check`, reporting the
/// mutations of any input that panicked.
/// `check` returns whether the input parsed; returns how many did.
fn run(
    seed: u64,
    original: &[u8],
    hot: usize,
    iterations: usize,
    check: impl Fn(Vec<u8>) -> bool,
) -> usize {
    let mut rng = Rng::new(seed);
    let mut failures = Vec::new();
    let mut parsed = 0;
    for i in 0..iterations {
        let mut bytes = original.to_vec();
        let steps: Vec<String> = (0..1 + rng.below(3))
            .map(|_| mutate(&mut rng, &mut bytes, hot))
            .collect();
        match catch_unwind(AssertUnwindSafe(|| check(bytes))) {
            Ok(ok) => parsed += ok as usize,
            Err(_) => failures.push(format!("iteration {i}: {}", steps.join(", "))),
        }
    }
    assert!(failures.is_empty(), "panics:\n{}", failures.join("\n"));
    parsed
}

#[test]
fn gguf_reader_survives_random_mutations() {
    let original = fixture_bytes("tiny.gguf");
    let hot = GgufFile::from_bytes(original.clone())
        .unwrap()
        .data_offset() as usize;
    let parsed = run(0x6767_5546, &original, hot, 20_000, |bytes| {
        let Ok(file) = GgufFile::from_bytes(bytes) else {
            return false;
        };
        {
            for (key, value) in file.metadata().iter() {
                let _ = (key.len(), value.type_description());
            }
            for info in file.tensors() {
                let _ = file.tensor_bytes(info.name());
                let _ = file.tensor_f32(info.name());
                let _ = info.shape();
            }
        }
        true
    });
    // Enough mutants survive parsing to exercise the tensor paths too.
    eprintln!("{parsed} of 20000 GGUF mutants parsed");
    assert!(parsed > 1000, "{parsed}");
}

#[test]
fn safetensors_reader_survives_random_mutations() {
    let original = fixture_bytes("tiny.safetensors");
    let header_len = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let parsed = run(0x5afe_7e45, &original, 8 + header_len, 20_000, |bytes| {
        let Ok(file) = SafetensorsFile::from_bytes(bytes) else {
            return false;
        };
        for info in file.tensors() {
            let _ = file.tensor_bytes(info.name());
            let _ = file.tensor_f32(info.name());
        }
        true
    });
    eprintln!("{parsed} of 20000 safetensors mutants parsed");
    assert!(parsed > 100, "{parsed}");
}
