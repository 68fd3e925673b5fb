//! Seeded parameter initialisers (the distributions of `torch.nn.init`).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A seeded source of initial values.
pub struct Init {
    rng: StdRng,
}

impl Init {
    pub fn new(seed: u64) -> Init {
        Init {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// `n` values from `U(-bound, bound)`.
    pub fn uniform(&mut self, n: usize, bound: f32) -> Vec<f32> {
        (0..n)
            .map(|_| self.rng.random_range(-bound..=bound))
            .collect()
    }

    /// `kaiming_uniform_(a=√5)`, the default of `torch.nn.Linear` weights and biases:
    /// `U(-1/√fan_in, 1/√fan_in)`.
    pub fn linear_default(&mut self, n: usize, fan_in: usize) -> Vec<f32> {
        self.uniform(n, 1.0 / (fan_in as f32).sqrt())
    }

    /// `kaiming_uniform_` for ReLU (gain √2): `U(-√(6/fan_in), √(6/fan_in))`.
    pub fn kaiming_uniform(&mut self, n: usize, fan_in: usize) -> Vec<f32> {
        self.uniform(n, (6.0 / fan_in as f32).sqrt())
    }

    /// `xavier_uniform_`: `U(-√(6/(fan_in+fan_out)), √(6/(fan_in+fan_out)))`.
    pub fn xavier_uniform(&mut self, n: usize, fan_in: usize, fan_out: usize) -> Vec<f32> {
        self.uniform(n, (6.0 / (fan_in + fan_out) as f32).sqrt())
    }
}
