//! Learning-rate schedules: host functions of the step, whose value is fed to the graph's
//! `lr` input before each run (the compiled graph never changes). Each matches the
//! `torch.optim.lr_scheduler` class named in its docs, step `0` being the first step.

use std::f64::consts::PI;

/// A learning rate per step (0-based).
pub trait Schedule {
    fn lr(&self, step: usize) -> f32;
}

/// A fixed learning rate.
#[derive(Clone, Copy, Debug)]
pub struct Constant(pub f32);

impl Schedule for Constant {
    fn lr(&self, _: usize) -> f32 {
        self.0
    }
}

/// `lr · gamma^(step / step_size)` (`StepLR`).
#[derive(Clone, Copy, Debug)]
pub struct StepDecay {
    pub lr: f32,
    pub step_size: usize,
    pub gamma: f32,
}

impl Schedule for StepDecay {
    fn lr(&self, step: usize) -> f32 {
        assert!(self.step_size > 0, "StepDecay: step_size must be > 0");
        (self.lr as f64 * (self.gamma as f64).powi((step / self.step_size) as i32)) as f32
    }
}

fn cosine(from: f64, to: f64, t: f64, period: f64) -> f64 {
    to + (from - to) * (1.0 + (PI * t / period).cos()) / 2.0
}

/// Cosine annealing from `lr` to `min_lr` over `t_max` steps (`CosineAnnealingLR`; like it,
/// the cosine continues past `t_max`, rising again over the next `t_max` steps).
#[derive(Clone, Copy, Debug)]
pub struct Cosine {
    pub lr: f32,
    pub min_lr: f32,
    pub t_max: usize,
}

impl Schedule for Cosine {
    fn lr(&self, step: usize) -> f32 {
        assert!(self.t_max > 0, "Cosine: t_max must be > 0");
        cosine(
            self.lr as f64,
            self.min_lr as f64,
            step as f64,
            self.t_max as f64,
        ) as f32
    }
}

/// Linear warm-up from `lr · start_factor` to `lr` over `warmup` steps, then cosine
/// annealing to `min_lr` over the remaining `total - warmup` steps (then rising again, as
/// in PyTorch) (`SequentialLR` of
/// `LinearLR(start_factor, 1.0, warmup)` and `CosineAnnealingLR(total - warmup, min_lr)`).
#[derive(Clone, Copy, Debug)]
pub struct WarmupCosine {
    pub lr: f32,
    pub min_lr: f32,
    pub start_factor: f32,
    pub warmup: usize,
    pub total: usize,
}

impl Schedule for WarmupCosine {
    fn lr(&self, step: usize) -> f32 {
        assert!(
            self.warmup < self.total,
            "WarmupCosine: warmup ({}) must be shorter than total ({})",
            self.warmup,
            self.total
        );
        let lr = self.lr as f64;
        if step < self.warmup {
            let s = self.start_factor as f64;
            return (lr * (s + (1.0 - s) * step as f64 / self.warmup as f64)) as f32;
        }
        let period = (self.total - self.warmup) as f64;
        let t = (step - self.warmup) as f64;
        cosine(lr, self.min_lr as f64, t, period) as f32
    }
}

/// The one-cycle policy (`OneCycleLR`, cosine annealing, two phases): from
/// `max_lr / div_factor` up to `max_lr` over the first `pct_start` of `total` steps, then
/// down to `max_lr / (div_factor · final_div_factor)` at the last step.
#[derive(Clone, Copy, Debug)]
pub struct OneCycle {
    pub max_lr: f32,
    pub total: usize,
    pub pct_start: f32,
    pub div_factor: f32,
    pub final_div_factor: f32,
}

impl OneCycle {
    /// PyTorch's defaults: `pct_start 0.3, div_factor 25, final_div_factor 1e4`.
    pub fn new(max_lr: f32, total: usize) -> OneCycle {
        OneCycle {
            max_lr,
            total,
            pct_start: 0.3,
            div_factor: 25.0,
            final_div_factor: 1e4,
        }
    }
}

impl Schedule for OneCycle {
    fn lr(&self, step: usize) -> f32 {
        assert!(self.total > 1, "OneCycle: total must be > 1");
        let max = self.max_lr as f64;
        let initial = max / self.div_factor as f64;
        let min = initial / self.final_div_factor as f64;
        let up_end = (self.pct_start as f64 * self.total as f64) - 1.0;
        let down_end = (self.total - 1) as f64;
        let s = step.min(self.total - 1) as f64;
        let lr = if s <= up_end {
            cosine(initial, max, s, up_end)
        } else {
            cosine(max, min, s - up_end, down_end - up_end)
        };
        lr as f32
    }
}
