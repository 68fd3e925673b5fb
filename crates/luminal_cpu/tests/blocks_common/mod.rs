//! Random data for the weight-format tests: a xorshift stream and random blocks of any
//! format read in place (`quant.rs`, `refine.rs`, `norm_prologue.rs`).
#![allow(dead_code)]

use luminal::prelude::*;

/// A xorshift64 stream.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Random blocks of `dtype` holding `n` values (random quants, finite scales).
pub fn random_blocks(dtype: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let bytes = dtype.bytes_for(n).unwrap();
    let mut b: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    match dtype {
        DType::F16 | DType::BF16 => {
            for v in b.chunks_exact_mut(2) {
                let x = rng.uniform() * 2.0 - 1.0;
                let bits = if dtype == DType::F16 {
                    f16::from_f32(x).to_bits()
                } else {
                    bf16::from_f32(x).to_bits()
                };
                v.copy_from_slice(&bits.to_le_bytes());
            }
        }
        _ => {
            for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                for &at in dtype.half_fields() {
                    let s = f16::from_f32(
                        (rng.uniform() * 0.1 + 0.001)
                            * if rng.next() & 1 == 0 { 1.0 } else { -1.0 },
                    );
                    blk[at..at + 2].copy_from_slice(&s.to_bits().to_le_bytes());
                }
            }
        }
    }
    b
}
