//! Elementwise unary ops composed from the primops.

use crate::graph::GraphTensor;
use std::f32::consts::{LN_2, LOG2_E, PI};

/// `p` of the Abramowitz & Stegun 7.1.26 erf: `t = 1 / (1 + p·|z|)`.
const ERF_P: f32 = 0.3275911;

/// The constants of [`GraphTensor::gelu_tanh`]'s exponent `w = x·(k₁ + k₂·x²)`:
/// `k₁ = −2·√(2/π)·log₂e`, `k₂ = 0.044715·k₁` (f32, as the graph holds them).
pub fn gelu_tanh_constants() -> (f32, f32) {
    let k1 = -2.0 * (2.0 / PI).sqrt() * LOG2_E;
    (k1, k1 * 0.044715)
}

/// The constants of [`GraphTensor::gelu_tanh_grad`]'s `q = c₁ + c₂·x²`: `c₁ = −ln 2·k₁`,
/// `c₂ = −3·ln 2·k₂`.
pub fn gelu_tanh_grad_constants() -> (f32, f32) {
    let (k1, k2) = gelu_tanh_constants();
    (-LN_2 * k1, -3.0 * LN_2 * k2)
}

/// The coefficients a₁ … a₅ of the 7.1.26 polynomial.
pub const ERF_A: [f32; 5] = [
    0.254829592,
    -0.284496736,
    1.421413741,
    -1.453152027,
    1.061405429,
];

/// The constants of [`GraphTensor::gelu`]: `p/√2` (the erf's `p` for `x/√2`) and the
/// exponent factor `−log₂e / 2` (f32, as the graph holds them).
pub fn gelu_constants() -> (f32, f32) {
    (ERF_P * std::f32::consts::FRAC_1_SQRT_2, -0.5 * LOG2_E)
}

/// The 7.1.26 polynomial `t·(a₁ + t·(a₂ + …))`: `erf(z) ≈ 1 − poly(t)·e^(−z²)` for z ≥ 0
/// (|error| ≤ 1.5e-7).
fn erf_poly(t: GraphTensor<'_>) -> GraphTensor<'_> {
    let mut poly = t * ERF_A[4];
    for a in ERF_A[..4].iter().rev() {
        poly = (poly + *a) * t;
    }
    poly
}

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
    /// 1 / (1 + e^-x), as `recip(2^(x·(−log2 e)) + 1)`: the negation and the change of
    /// base are one multiply.
    pub fn sigmoid(self) -> GraphTensor<'g> {
        ((self * -LOG2_E).exp2() + 1.0).recip()
    }
    /// tanh(x) = 2·sigmoid(2x) − 1 (saturates correctly at ±inf), with the three constant
    /// factors in front of the exponential folded into one.
    pub fn tanh(self) -> GraphTensor<'g> {
        ((self * (-2.0 * LOG2_E)).exp2() + 1.0).recip() * 2.0 - 1.0
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
        let ax = self.abs();
        let t = (ax * ERF_P + 1.0).recip();
        let y = 1.0 - erf_poly(t) * (-(ax * ax)).exp();
        y * self.sign()
    }
    /// GELU, exact form: x · Φ(x) = 0.5·x·(1 + erf(x/√2)). Like PyTorch's, its backward
    /// pass recomputes it from `x` (a [`Graph::checkpoint`](crate::Graph::checkpoint)
    /// segment) instead of keeping its intermediates: the gradient kernel reads `x` alone.
    ///
    /// Built as `relu(x) − ½·|x|·q(|x|/√2)` with `q(z) = 1 − erf(z)` from the same
    /// Abramowitz & Stegun polynomial as [`erf`](Self::erf) (`½x(1 + sign(x)(1 − q))`
    /// rearranged): 25 primops instead of 30, no sign, and no cancellation in the tail for
    /// negative `x` (the value there is the small `½|x|·q` itself). `|x|` is capped at 12
    /// inside the correction (`½|x|·q < 1e-30` beyond), so no output is subnormal (and
    /// `gelu(inf) = inf`; `gelu(−inf)` is NaN, as PyTorch's).
    pub fn gelu(self) -> GraphTensor<'g> {
        let (p, e) = gelu_constants();
        self.graph.checkpoint(|| {
            // c = −min(|x|, 12), kept negative: its sign goes into the constants below.
            let ax = self.abs();
            let c = (-ax).maximum(-12.0);
            let t = (c * -p + 1.0).recip();
            let poly = erf_poly(t);
            // e^(−x²/2) = 2^(x·x·(−log2(e)/2)), from the capped |x| too: the smallest
            // correction is then ~2e-32, never a subnormal (an FFN product reading
            // subnormal activations ran 8× slower).
            let q = poly * (c * c * e).exp2();
            // relu(x) = (x + |x|)/2: no third `maximum` (each adds tie masks to the
            // backward pass).
            (self + ax) * 0.5 + c * q * 0.5
        })
    }
    /// GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), recomputed by
    /// the backward pass like [`GraphTensor::gelu`].
    ///
    /// Built as `x·sigmoid(2u)` (`½(1 + tanh u) = sigmoid(2u)`, u the inner term) =
    /// `x / (1 + 2^(x·(k₁ + k₂·x²)))` with the constants folded: 8 primops instead of 16,
    /// and a backward pass of about half the ops. No output is subnormal: the reciprocal
    /// reaches 2^-128 just before the exponential overflows (then it is 0), where `|x|` is
    /// about 10, so `x·σ` stays above 2^-126. (No `maximum` floor: its gradient's tie masks
    /// doubled a training step.)
    pub fn gelu_tanh(self) -> GraphTensor<'g> {
        let (k1, k2) = gelu_tanh_constants();
        self.graph.checkpoint(|| {
            let w = self * (self * self * k2 + k1);
            self * (w.exp2() + 1.0).recip()
        })
    }
    /// The derivative of [`GraphTensor::gelu_tanh`] at each element: with
    /// `s = 1 / (1 + 2^w)`, `w = x·(k₁ + k₂·x²)`, it is `s·(1 + x·q·(1 − s))` where
    /// `q = −ln 2·(k₁ + 3k₂·x²)`. Autograd builds a recognised `gelu_tanh`'s gradient as
    /// `dy · x.gelu_tanh_grad()` (one expression a backend can evaluate as one function;
    /// see [`crate::patterns::GeluMatch`]) instead of differentiating its primops one
    /// by one.
    pub fn gelu_tanh_grad(self) -> GraphTensor<'g> {
        let (k1, k2) = gelu_tanh_constants();
        let (c1, c2) = gelu_tanh_grad_constants();
        let xx = self * self;
        let w = self * (xx * k2 + k1);
        let s = (w.exp2() + 1.0).recip();
        let q = xx * c2 + c1;
        s * (self * q * (s * -1.0 + 1.0) + 1.0)
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
