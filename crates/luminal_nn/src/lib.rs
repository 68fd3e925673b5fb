//! # luminal_nn — layers built on the Luminal graph
//!
//! Every layer owns its parameters as graph inputs named by their full path (e.g.
//! `model.layers.0.mlp.up_proj.weight`), in the layouts PyTorch / Hugging Face use, so a
//! loader maps file tensors to graph inputs in one place: [`Module::parameters`].

mod attention;
mod batchnorm;
mod conv;
mod encoder;
mod linear;
mod mlp;
mod norm;
mod position;
mod rope;

pub use attention::{
    causal_attention, causal_attention_windowed, hadamard, scores_product, values_product,
    Attention, CacheType, KvCache, TransformerBlock, KV_ROTATION,
};
pub use batchnorm::{dropout_mask, BatchNorm, Dropout, RunningStat};
pub use conv::{Conv1d, Conv1dOptions, Conv2d, Conv2dOptions};
pub use encoder::{attention, key_padding_bias, MultiHeadAttention};
pub use linear::{Embedding, Linear};
pub use mlp::{Activation, FeedForward, SwiGluMlp};
pub use norm::{LayerNorm, RmsNorm};
pub use position::{sinusoidal_positions, PositionEmbedding};
pub use rope::{Llama3Scaling, Rope, RopeLayout, RopeScaling, YarnScaling};

use luminal::prelude::*;

/// A layer: a function of graph tensors with named parameters.
pub trait Module<'g> {
    /// `x` in, result out (shapes per layer).
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g>;
    /// The layer's parameters (graph inputs); each one's name is its input name.
    fn parameters(&self) -> Vec<GraphTensor<'g>>;
}

/// The input name of a parameter (the key a loader looks up in the model file).
pub fn parameter_name(t: GraphTensor) -> String {
    t.entry().label
}

/// `prefix.name`, or `name` alone for an empty prefix.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}
