//! Activations and the SwiGLU feed-forward block.

use crate::{join, Linear, Module};
use luminal::prelude::*;

/// Elementwise activations as values (for configs that name them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Sigmoid,
    Tanh,
}

impl Activation {
    pub fn apply<'g>(self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Silu => x.silu(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Tanh => x.tanh(),
        }
    }
}

/// `down(act(gate(x)) · up(x))` — the Llama feed-forward block (no biases).
pub struct SwiGluMlp<'g> {
    pub gate: Linear<'g>,
    pub up: Linear<'g>,
    pub down: Linear<'g>,
    pub activation: Activation,
}

impl<'g> SwiGluMlp<'g> {
    /// Parameters `{prefix}.gate_proj`, `{prefix}.up_proj`, `{prefix}.down_proj` (HF names).
    pub fn new(cx: &'g Graph, prefix: &str, dim: usize, hidden: usize) -> Self {
        SwiGluMlp {
            gate: Linear::new(cx, &join(prefix, "gate_proj"), dim, hidden, false),
            up: Linear::new(cx, &join(prefix, "up_proj"), dim, hidden, false),
            down: Linear::new(cx, &join(prefix, "down_proj"), hidden, dim, false),
            activation: Activation::Silu,
        }
    }
}

impl<'g> Module<'g> for SwiGluMlp<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let h = self.activation.apply(self.gate.forward(x)) * self.up.forward(x);
        self.down.forward(h)
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        [&self.gate, &self.up, &self.down]
            .iter()
            .flat_map(|l| l.parameters())
            .collect()
    }
}
