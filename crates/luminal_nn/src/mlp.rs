//! Activations, the SwiGLU feed-forward block and the plain two-layer one (BERT, Whisper).

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
    /// The activation a Hugging Face config names (`hidden_act`, `activation_function`):
    /// `gelu` is the exact (erf) GELU; `gelu_new`, `gelu_pytorch_tanh` and `gelu_fast` the
    /// tanh approximation; `relu`, `silu`/`swish`, `sigmoid`, `tanh`. `None` otherwise.
    pub fn from_hf_name(name: &str) -> Option<Activation> {
        Some(match name {
            "gelu" | "gelu_python" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            "silu" | "swish" => Activation::Silu,
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            _ => return None,
        })
    }

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

/// `fc2(act(fc1(x)))` with biases: the feed-forward block of BERT (`intermediate.dense`,
/// `output.dense`) and Whisper (`fc1`, `fc2`).
pub struct FeedForward<'g> {
    pub fc1: Linear<'g>,
    pub fc2: Linear<'g>,
    pub activation: Activation,
}

impl<'g> FeedForward<'g> {
    /// Parameters `{prefix}.fc1` (`dim → hidden`) and `{prefix}.fc2` (`hidden → dim`), with
    /// biases. Other names: build the two [`Linear`]s and the struct directly.
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        dim: usize,
        hidden: usize,
        activation: Activation,
    ) -> Self {
        FeedForward {
            fc1: Linear::new(cx, &join(prefix, "fc1"), dim, hidden, true),
            fc2: Linear::new(cx, &join(prefix, "fc2"), hidden, dim, true),
            activation,
        }
    }
}

impl<'g> Module<'g> for FeedForward<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        self.fc2.forward(self.activation.apply(self.fc1.forward(x)))
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        let mut p = self.fc1.parameters();
        p.extend(self.fc2.parameters());
        p
    }
}
