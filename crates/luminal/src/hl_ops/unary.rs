//! Elementwise unary ops composed from the primops.

use crate::graph::GraphTensor;
use std::f32::consts::{LN_2, LOG2_E, PI};

impl<'g> GraphTensor<'g> {
    /// e^x.
    pub fn exp(self) -> GraphTensor<'g> {
        (self * LOG2_E).exp2()
    }
    /// Natural logarithm.
    pub fn log(self) -> GraphTensor<'g> {
        self.log2() * LN_2
    }
    /// Natural logarithm (alias of [`log`](Self::log)).
    pub fn ln(self) -> GraphTensor<'g> {
        self.log()
    }
    pub fn cos(self) -> GraphTensor<'g> {
        (self + PI / 2.0).sin()
    }
    pub fn tan(self) -> GraphTensor<'g> {
        self.sin() / self.cos()
    }
    /// 1 / (1 + e^-x).
    pub fn sigmoid(self) -> GraphTensor<'g> {
        ((-self).exp() + 1.0).recip()
    }
    /// tanh(x) = 2·sigmoid(2x) − 1 (saturates correctly at ±inf).
    pub fn tanh(self) -> GraphTensor<'g> {
        (self * 2.0).sigmoid() * 2.0 - 1.0
    }
    /// -1, 0 or 1 (0 for NaN).
    pub fn sign(self) -> GraphTensor<'g> {
        let zero = self.graph.constant_of(0.0, self.dtype());
        let d = self.dtype();
        zero.lt(self).cast(d) - self.lt(zero).cast(d)
    }
    /// |x| (exact; NaN stays NaN).
    pub fn abs(self) -> GraphTensor<'g> {
        self.maximum(-self)
    }
    pub fn square(self) -> GraphTensor<'g> {
        self * self
    }
    /// max(x, 0).
    pub fn relu(self) -> GraphTensor<'g> {
        self.maximum(0.0)
    }
    /// x for x ≥ 0, slope·x otherwise.
    pub fn leaky_relu(self, slope: f32) -> GraphTensor<'g> {
        self.relu() + self.minimum(0.0) * slope
    }
    /// x · sigmoid(x).
    pub fn silu(self) -> GraphTensor<'g> {
        self * self.sigmoid()
    }
    /// Alias of [`silu`](Self::silu).
    pub fn swish(self) -> GraphTensor<'g> {
        self.silu()
    }
    /// log(1 + e^x), computed stably as relu(x) + log(1 + e^-|x|).
    pub fn softplus(self) -> GraphTensor<'g> {
        self.relu() + ((-self.abs()).exp() + 1.0).log()
    }
    /// Error function (Abramowitz & Stegun 7.1.26; |error| ≤ 1.5e-7).
    pub fn erf(self) -> GraphTensor<'g> {
        const P: f32 = 0.3275911;
        const A: [f32; 5] = [
            0.254829592,
            -0.284496736,
            1.421413741,
            -1.453152027,
            1.061405429,
        ];
        let ax = self.abs();
        let t = (ax * P + 1.0).recip();
        let mut poly = t * A[4];
        for a in A[..4].iter().rev() {
            poly = (poly + *a) * t;
        }
        let y = 1.0 - poly * (-(ax * ax)).exp();
        y * self.sign()
    }
    /// GELU, exact form: x · Φ(x) = 0.5·x·(1 + erf(x/√2)). Like PyTorch's, its backward
    /// pass recomputes it from `x` (a [`Graph::checkpoint`](crate::Graph::checkpoint)
    /// segment) instead of keeping its intermediates: the gradient kernel reads `x` alone.
    pub fn gelu(self) -> GraphTensor<'g> {
        self.graph
            .checkpoint(|| self * 0.5 * ((self * std::f32::consts::FRAC_1_SQRT_2).erf() + 1.0))
    }
    /// GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), recomputed by
    /// the backward pass like [`GraphTensor::gelu`].
    pub fn gelu_tanh(self) -> GraphTensor<'g> {
        self.graph.checkpoint(|| {
            let inner = (self + self * self * self * 0.044715) * (2.0 / PI).sqrt();
            self * 0.5 * (inner.tanh() + 1.0)
        })
    }
    /// Rounds toward −inf (floats only).
    pub fn floor(self) -> GraphTensor<'g> {
        assert!(
            self.dtype().is_float(),
            "floor: needs a float tensor, got {}",
            self.dtype()
        );
        let r = self % 1.0;
        // fmod keeps the dividend's sign: negative non-integers need one more step down.
        self - r - r.lt(0.0).cast(self.dtype())
    }
}
