//! Decoder throughput, in million values per second, for every decodable ggml type, serial
//! and on rayon's pool; `ratio` is relative to plain F32 conversion (a memory-bound copy)
//! measured in the same run.
//!
//!     cargo bench -p luminal_io --bench dequantize

use std::time::{Duration, Instant};

use luminal_io::quant::{dequantize, dequantize_parallel};
use luminal_io::GgmlType;

const VALUES: usize = 1 << 22;

/// Random blocks whose f16 scale fields (and Q8_K's f32 one) are finite.
fn blocks(ty: GgmlType) -> Vec<u8> {
    let n_blocks = VALUES / ty.block_size() as usize;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut data: Vec<u8> = (0..n_blocks * ty.type_size() as usize)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    // Clearing bit 6 of every odd byte keeps any little-endian f16 there finite; harmless
    // elsewhere for a throughput measurement.
    for (i, b) in data.iter_mut().enumerate() {
        if i % 2 == 1 {
            *b &= 0xBF;
        }
    }
    data
}

fn time(mut f: impl FnMut()) -> Duration {
    f();
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        f();
        best = best.min(start.elapsed());
    }
    best
}

fn main() {
    use GgmlType::*;
    let types = [
        F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    ];
    let mut out = vec![0f32; VALUES];
    let mut baseline = None;
    println!(
        "{:<6} {:>12} {:>8} {:>14} {:>8}",
        "type", "serial Mv/s", "ratio", "parallel Mv/s", "ratio"
    );
    for ty in types {
        let data = blocks(ty);
        let serial = time(|| dequantize(ty, &data, &mut out).expect("lengths match"));
        let parallel = time(|| dequantize_parallel(ty, &data, &mut out).expect("lengths match"));
        let rate = |d: Duration| VALUES as f64 / d.as_secs_f64() / 1e6;
        let base = *baseline.get_or_insert(rate(serial));
        println!(
            "{:<6} {:>12.0} {:>8.2} {:>14.0} {:>8.2}",
            ty.name(),
            rate(serial),
            rate(serial) / base,
            rate(parallel),
            rate(parallel) / base
        );
    }
}
