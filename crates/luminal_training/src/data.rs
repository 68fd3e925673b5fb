//! Small data sets for examples and tests, and a seeded minibatch sampler.

use crate::TrainingError;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::path::Path;

/// scikit-learn's `digits`: 8x8 grey images (pixel values 0..16 scaled to [0, 1]) of the
/// digits 0-9. `scripts/fetch-digits.sh` extracts the CSV from the scikit-learn wheel.
#[derive(Clone, Debug, Default)]
pub struct Digits {
    /// `len() x 64` pixels, row-major.
    pub images: Vec<f32>,
    pub labels: Vec<i32>,
}

impl Digits {
    pub const PIXELS: usize = 64;
    pub const CLASSES: usize = 10;

    /// Reads the CSV (64 pixel values then the label per line).
    pub fn load(path: impl AsRef<Path>) -> Result<Digits, TrainingError> {
        let text = std::fs::read_to_string(path.as_ref())?;
        let mut d = Digits::default();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bad = |why: String| TrainingError::Data(format!("line {}: {why}", i + 1));
            let fields: Vec<&str> = line.split(',').collect();
            if fields.len() != Self::PIXELS + 1 {
                return Err(bad(format!("expected 65 fields, got {}", fields.len())));
            }
            for f in &fields[..Self::PIXELS] {
                let v: f32 = f
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("bad pixel {f:?}")))?;
                if !(0.0..=16.0).contains(&v) {
                    return Err(bad(format!("pixel {v} outside 0..16")));
                }
                d.images.push(v / 16.0);
            }
            let label: i32 = fields[Self::PIXELS]
                .trim()
                .parse()
                .map_err(|_| bad(format!("bad label {:?}", fields[Self::PIXELS])))?;
            if !(0..Self::CLASSES as i32).contains(&label) {
                return Err(bad(format!("label {label} outside 0..10")));
            }
            d.labels.push(label);
        }
        if d.labels.is_empty() {
            return Err(TrainingError::Data("no images".into()));
        }
        Ok(d)
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The images at `indices`.
    pub fn subset(&self, indices: &[usize]) -> Digits {
        let mut d = Digits::default();
        for &i in indices {
            d.images
                .extend_from_slice(&self.images[i * Self::PIXELS..(i + 1) * Self::PIXELS]);
            d.labels.push(self.labels[i]);
        }
        d
    }

    /// A seeded shuffle split into `(train, test)` with `test_fraction` of the images in test.
    pub fn split(&self, test_fraction: f32, seed: u64) -> (Digits, Digits) {
        let mut idx: Vec<usize> = (0..self.len()).collect();
        idx.shuffle(&mut StdRng::seed_from_u64(seed));
        let n_test = (self.len() as f32 * test_fraction).round() as usize;
        (self.subset(&idx[n_test..]), self.subset(&idx[..n_test]))
    }
}

/// Draws minibatches of a fixed size: each epoch is a fresh seeded permutation, cut into
/// full batches (the remainder of an epoch is dropped, so every batch has the static size the
/// graph was compiled for).
pub struct Batches {
    order: Vec<usize>,
    at: usize,
    batch: usize,
    rng: StdRng,
}

impl Batches {
    pub fn new(len: usize, batch: usize, seed: u64) -> Batches {
        assert!(
            batch > 0 && batch <= len,
            "Batches: batch size {batch} must be in 1..={len}"
        );
        Batches {
            order: (0..len).collect(),
            at: len,
            batch,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The indices of the next batch.
    pub fn next_batch(&mut self) -> &[usize] {
        if self.at + self.batch > self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.at = 0;
        }
        self.at += self.batch;
        &self.order[self.at - self.batch..self.at]
    }
}
