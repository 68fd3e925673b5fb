//! Batch normalisation and dropout: the two layers whose training behaviour differs from
//! inference.

use crate::{join, Module};
use luminal::prelude::*;

/// `nn.BatchNorm1d` / `nn.BatchNorm2d` over the channel dim 1 of `[N, C]` or `[N, C, ...]`:
/// affine `weight` and `bias` `[C]`, and running statistics `running_mean` / `running_var`
/// (inputs holding state across steps).
pub struct BatchNorm<'g> {
    pub weight: Option<GraphTensor<'g>>,
    pub bias: Option<GraphTensor<'g>>,
    pub running_mean: GraphTensor<'g>,
    pub running_var: GraphTensor<'g>,
    pub eps: f32,
    pub momentum: f32,
}

/// A running statistic and its value after this step (to be kept by the runtime, e.g. by
/// `luminal_training::TrainStep`), with its initial value.
pub struct RunningStat<'g> {
    pub state: GraphTensor<'g>,
    pub next: GraphTensor<'g>,
    pub init: f32,
}

impl<'g> BatchNorm<'g> {
    /// PyTorch's defaults: `eps 1e-5`, `momentum 0.1`, affine.
    pub fn new(cx: &'g Graph, prefix: &str, channels: usize) -> Self {
        BatchNorm {
            weight: Some(cx.tensor(&join(prefix, "weight"), channels)),
            bias: Some(cx.tensor(&join(prefix, "bias"), channels)),
            running_mean: cx.tensor(&join(prefix, "running_mean"), channels),
            running_var: cx.tensor(&join(prefix, "running_var"), channels),
            eps: 1e-5,
            momentum: 0.1,
        }
    }

    fn check(&self, x: GraphTensor<'g>) -> Vec<i64> {
        assert!(
            x.rank() >= 2 && x.shape()[1] == self.running_mean.shape()[0],
            "BatchNorm: input must be [N, C, ...] with C = {:?}, got shape {:?}",
            self.running_mean.shape(),
            x.shape()
        );
        (0..x.rank() as i64).filter(|&a| a != 1).collect()
    }

    /// A `[C]` tensor shaped to broadcast against `x` along dim 1.
    fn per_channel(t: GraphTensor<'g>, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let mut shape = vec![Expression::from(1); x.rank()];
        shape[1] = t.shape()[0].clone();
        t.reshape(shape).expand_to(x.shape())
    }

    fn affine(&self, y: GraphTensor<'g>) -> GraphTensor<'g> {
        let mut y = y;
        if let Some(w) = self.weight {
            y = y * Self::per_channel(w, y);
        }
        if let Some(b) = self.bias {
            y = y + Self::per_channel(b, y);
        }
        y
    }

    /// Training mode: normalises with the batch statistics (biased variance) and returns
    /// the running statistics' updates (`(1 - momentum) · running + momentum · batch`, the
    /// variance unbiased), as PyTorch's `train()` mode does.
    pub fn forward_train(&self, x: GraphTensor<'g>) -> (GraphTensor<'g>, Vec<RunningStat<'g>>) {
        let axes = self.check(x);
        let count: i64 = axes
            .iter()
            .map(|&a| {
                x.shape()[a as usize].as_constant().unwrap_or_else(|| {
                    panic!("BatchNorm: needs static dims, got shape {:?}", x.shape())
                })
            })
            .product();
        assert!(
            count > 1,
            "BatchNorm: needs more than one value per channel, got shape {:?}",
            x.shape()
        );
        let mean = x.mean(axes.clone());
        let centered = x - Self::per_channel(mean, x);
        let var = centered.square().mean(axes);
        let y = centered * Self::per_channel((var + self.eps).sqrt().recip(), x);
        let m = self.momentum;
        let unbiased = var * (count as f32 / (count - 1) as f32);
        let stats = vec![
            RunningStat {
                state: self.running_mean,
                next: self.running_mean * (1.0 - m) + mean * m,
                init: 0.0,
            },
            RunningStat {
                state: self.running_var,
                next: self.running_var * (1.0 - m) + unbiased * m,
                init: 1.0,
            },
        ];
        (self.affine(y), stats)
    }
}

impl<'g> Module<'g> for BatchNorm<'g> {
    /// Inference mode: normalises with the running statistics.
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        self.check(x);
        let inv = (self.running_var + self.eps).sqrt().recip();
        let y = (x - Self::per_channel(self.running_mean, x)) * Self::per_channel(inv, x);
        self.affine(y)
    }
    /// The learned parameters (weight, bias); the running statistics are state, not
    /// parameters (PyTorch's buffers).
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        self.weight.into_iter().chain(self.bias).collect()
    }
}

/// Inverted dropout with a mask fed each step: `x · mask / (1 - p)`. The mask is an input
/// (named `prefix.mask`, of `x`'s shape) the caller fills with 0/1 values, e.g. from a seeded
/// generator with [`dropout_mask`]; ones (or a graph built without the layer) for inference.
/// Feeding it keeps runs reproducible and identical on every backend.
pub struct Dropout<'g> {
    pub mask: GraphTensor<'g>,
    pub p: f32,
}

impl<'g> Dropout<'g> {
    pub fn new(cx: &'g Graph, prefix: &str, shape: impl ToShape, p: f32) -> Self {
        assert!(
            (0.0..1.0).contains(&p),
            "Dropout: p must be in [0, 1), got {p}"
        );
        Dropout {
            mask: cx.tensor(&join(prefix, "mask"), shape),
            p,
        }
    }
}

impl<'g> Module<'g> for Dropout<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        x * self.mask * (1.0 / (1.0 - self.p))
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        vec![]
    }
}

/// Fills `mask` with 0 (probability `p`) and 1, from `uniform`, a source of values in
/// `[0, 1)` (a seeded generator's `random()`).
pub fn dropout_mask(mask: &mut [f32], p: f32, mut uniform: impl FnMut() -> f32) {
    for m in mask {
        *m = if uniform() < p { 0.0 } else { 1.0 };
    }
}
