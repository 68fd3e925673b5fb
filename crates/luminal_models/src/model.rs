//! What generation and scoring need from a language model, whatever its family and backend.

use crate::error::Result;

/// A causal language model with a KV cache: [`crate::generate()`] and
/// [`crate::perplexity()`] work on any implementation (any family, any backend).
pub trait Model {
    /// Tokens currently in the KV cache.
    fn pos(&self) -> usize;
    /// KV-cache capacity in tokens.
    fn max_ctx(&self) -> usize;
    /// Logits per position.
    fn vocab_size(&self) -> usize;
    /// Forgets the cached tokens: the next call starts at position 0.
    fn reset(&mut self);
    /// Keeps only the first `pos` cached tokens (`pos <= self.pos()`), so that the next
    /// call continues at position `pos`. Returns `false` when the model cannot (the default
    /// handles only `pos == 0`); callers then [`Model::reset`] and re-feed the tokens.
    fn truncate(&mut self, pos: usize) -> bool {
        if pos == 0 {
            self.reset();
            true
        } else {
            false
        }
    }
    /// Runs `tokens` at positions `pos..pos + len` (appending them to the cache) and returns
    /// the logits of the last `n_out` of them, row-major `[n_out, vocab]`.
    fn forward(&mut self, tokens: &[u32], n_out: usize) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.forward_into(tokens, n_out, &mut logits)?;
        Ok(logits)
    }
    /// [`Model::forward`] into `logits` (its contents replaced). On the CPU backend a decode
    /// step through this makes no heap allocation once `logits` has grown.
    fn forward_into(&mut self, tokens: &[u32], n_out: usize, logits: &mut Vec<f32>) -> Result<()>;
    /// Logits for every position of `tokens` from an empty cache (teacher forcing).
    fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.reset();
        self.forward(tokens, tokens.len())
    }
}
