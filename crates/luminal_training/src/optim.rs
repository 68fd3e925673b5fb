//! Optimizers as graph builders.
//!
//! An optimizer adds the update of each parameter to the graph: new values of the parameter
//! and of its state (moments, momentum buffers), each returned as a [`StateUpdate`] pairing
//! a state input with its next value. [`crate::TrainStep`] then makes the runtime keep those
//! values across runs (written in place, see [`crate::StateMode`]), so a training step is
//! one `run()` and no tensor crosses to the host.
//!
//! The learning rate and the 1-based step number are scalar inputs of the graph
//! ([`OptimizerInputs`]), set before each run: a schedule is just a host function of the step.
//! Every update follows the formula and operation order of the PyTorch optimizer of the same
//! name (`torch.optim`), and is tested against it over ten steps.

use luminal::prelude::*;

/// The scalars an update reads each step.
#[derive(Clone, Copy, Debug)]
pub struct OptimizerInputs<'g> {
    /// Learning rate (rank 0).
    pub lr: GraphTensor<'g>,
    /// 1-based step number, as f32 (rank 0): Adam's bias corrections read it.
    pub step: GraphTensor<'g>,
    /// A scalar (rank 0) every gradient is multiplied by before the update (global-norm
    /// clipping's factor, [`clip_grad_norm_factor`]), or none. Optimizers fold it into the
    /// scalar factors of each place a gradient is read, so a scaled gradient read twice
    /// (Adam's two moments) is never materialised as a tensor of its own.
    pub grad_scale: Option<GraphTensor<'g>>,
}

impl<'g> OptimizerInputs<'g> {
    /// The inputs with no gradient scale.
    pub fn new(lr: GraphTensor<'g>, step: GraphTensor<'g>) -> Self {
        OptimizerInputs {
            lr,
            step,
            grad_scale: None,
        }
    }

    /// `g · scale` (`g` itself without a scale): the scaled gradient, where it is read once
    /// or next to other terms (a weight-decay sum).
    fn scale(&self, g: GraphTensor<'g>) -> GraphTensor<'g> {
        match self.grad_scale {
            None => g,
            Some(s) => g * bcast(s, g),
        }
    }

    /// `g · c · scale` (the gradient scale folded into the constant `c`, broadcast).
    fn scaled(&self, g: GraphTensor<'g>, c: f32) -> GraphTensor<'g> {
        match self.grad_scale {
            None => g * c,
            Some(s) => g * bcast(s * c, g),
        }
    }

    /// `g² · c · scale²`, as `g · (g · c·scale²)` when scaled: clipping's norm already reads
    /// `g · g`, and the same node here would be shared between the two, so stored.
    fn scaled_square(&self, g: GraphTensor<'g>, c: f32) -> GraphTensor<'g> {
        match self.grad_scale {
            None => g * g * c,
            Some(s) => g * (g * bcast(s * s * c, g)),
        }
    }
}

/// A state input and its value after this step; `init` is its value before the first step
/// (parameters themselves carry `None`: the user sets them).
#[derive(Clone, Copy, Debug)]
pub struct StateUpdate<'g> {
    pub state: GraphTensor<'g>,
    pub next: GraphTensor<'g>,
    pub init: Option<f32>,
}

impl<'g> From<luminal_nn::RunningStat<'g>> for StateUpdate<'g> {
    fn from(s: luminal_nn::RunningStat<'g>) -> StateUpdate<'g> {
        StateUpdate {
            state: s.state,
            next: s.next,
            init: Some(s.init),
        }
    }
}

/// Builds the update graph of an optimizer.
pub trait Optimizer {
    /// Adds the updates of `params` given their `grads` (same order and shapes). Returns the
    /// new values of the parameters and of every state tensor the optimizer created.
    fn build<'g>(
        &self,
        params: &[GraphTensor<'g>],
        grads: &[GraphTensor<'g>],
        inputs: OptimizerInputs<'g>,
    ) -> Vec<StateUpdate<'g>>;
    /// A short name (used to name state inputs).
    fn name(&self) -> &'static str;
}

/// A zero-initialised state input named after its parameter.
fn state<'g>(param: GraphTensor<'g>, opt: &str, what: &str) -> GraphTensor<'g> {
    let name = format!("{}.{opt}.{what}", param.entry().label);
    param.graph.tensor(&name, param.shape())
}

fn update<'g>(state: GraphTensor<'g>, next: GraphTensor<'g>, init: Option<f32>) -> StateUpdate<'g> {
    StateUpdate { state, next, init }
}

fn check(op: &str, params: &[GraphTensor], grads: &[GraphTensor]) {
    assert_eq!(
        params.len(),
        grads.len(),
        "{op}: {} parameters but {} gradients",
        params.len(),
        grads.len()
    );
    for (p, g) in params.iter().zip(grads) {
        assert_eq!(
            p.shape(),
            g.shape(),
            "{op}: parameter {:?} has a gradient of shape {:?}",
            p,
            g.shape()
        );
    }
}

/// A scalar input broadcast to `like`'s shape.
fn bcast<'g>(s: GraphTensor<'g>, like: GraphTensor<'g>) -> GraphTensor<'g> {
    s.expand_to(like.shape())
}

/// Stochastic gradient descent (`torch.optim.SGD`, dampening 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sgd {
    pub momentum: f32,
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

impl Optimizer for Sgd {
    fn name(&self) -> &'static str {
        "sgd"
    }
    fn build<'g>(
        &self,
        params: &[GraphTensor<'g>],
        grads: &[GraphTensor<'g>],
        inputs: OptimizerInputs<'g>,
    ) -> Vec<StateUpdate<'g>> {
        check("Sgd", params, grads);
        assert!(
            !self.nesterov || self.momentum > 0.0,
            "Sgd: Nesterov momentum needs momentum > 0"
        );
        let mut out = vec![];
        for (&p, &g) in params.iter().zip(grads) {
            let mut d = inputs.scale(g);
            if self.weight_decay != 0.0 {
                d = d + p * self.weight_decay;
            }
            if self.momentum != 0.0 {
                // PyTorch starts the buffer at the first gradient: with zero dampening that
                // is momentum · 0 + g, so a zero initial buffer is the same.
                let buf = state(p, self.name(), "momentum");
                let next_buf = buf * self.momentum + d;
                out.push(update(buf, next_buf, Some(0.0)));
                d = if self.nesterov {
                    d + next_buf * self.momentum
                } else {
                    next_buf
                };
            }
            out.push(update(p, p - bcast(inputs.lr, p) * d, None));
        }
        out
    }
}

/// Adam (`torch.optim.Adam`, L2 weight decay) and AdamW (`torch.optim.AdamW`, decoupled).
#[derive(Clone, Copy, Debug)]
pub struct Adam {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// Decoupled weight decay (AdamW): `p ← p (1 - lr wd)` before the Adam step.
    pub decoupled: bool,
}

impl Default for Adam {
    fn default() -> Self {
        Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
        }
    }
}

impl Adam {
    /// AdamW with PyTorch's defaults (weight decay 0.01).
    pub fn adamw() -> Adam {
        Adam {
            weight_decay: 0.01,
            decoupled: true,
            ..Adam::default()
        }
    }
}

/// `1 - beta^step` for the step input.
fn bias_correction<'g>(beta: f32, step: GraphTensor<'g>) -> GraphTensor<'g> {
    1.0 - (step * (beta as f64).ln() as f32).exp()
}

impl Optimizer for Adam {
    fn name(&self) -> &'static str {
        if self.decoupled {
            "adamw"
        } else {
            "adam"
        }
    }
    fn build<'g>(
        &self,
        params: &[GraphTensor<'g>],
        grads: &[GraphTensor<'g>],
        inputs: OptimizerInputs<'g>,
    ) -> Vec<StateUpdate<'g>> {
        check("Adam", params, grads);
        let bc1 = bias_correction(self.beta1, inputs.step);
        let bc2_sqrt = bias_correction(self.beta2, inputs.step).sqrt();
        let step_size = inputs.lr / bc1;
        let mut out = vec![];
        for (&p, &g) in params.iter().zip(grads) {
            let mut p0 = p;
            let (m, v) = (state(p, self.name(), "m"), state(p, self.name(), "v"));
            let (b1, b2) = (1.0 - self.beta1, 1.0 - self.beta2);
            let (m_next, v_next) = if self.weight_decay != 0.0 && !self.decoupled {
                let g = inputs.scale(g) + p * self.weight_decay;
                (m * self.beta1 + g * b1, v * self.beta2 + g * g * b2)
            } else {
                if self.weight_decay != 0.0 {
                    p0 = p * (1.0 - bcast(inputs.lr, p) * self.weight_decay);
                }
                (
                    m * self.beta1 + inputs.scaled(g, b1),
                    v * self.beta2 + inputs.scaled_square(g, b2),
                )
            };
            let denom = v_next.sqrt() / bcast(bc2_sqrt, p) + self.eps;
            let p_next = p0 - bcast(step_size, p) * (m_next / denom);
            out.push(update(m, m_next, Some(0.0)));
            out.push(update(v, v_next, Some(0.0)));
            out.push(update(p, p_next, None));
        }
        out
    }
}

/// RMSprop (`torch.optim.RMSprop`, not centered).
#[derive(Clone, Copy, Debug)]
pub struct RmsProp {
    pub alpha: f32,
    pub eps: f32,
    pub momentum: f32,
    pub weight_decay: f32,
}

impl Default for RmsProp {
    fn default() -> Self {
        RmsProp {
            alpha: 0.99,
            eps: 1e-8,
            momentum: 0.0,
            weight_decay: 0.0,
        }
    }
}

impl Optimizer for RmsProp {
    fn name(&self) -> &'static str {
        "rmsprop"
    }
    fn build<'g>(
        &self,
        params: &[GraphTensor<'g>],
        grads: &[GraphTensor<'g>],
        inputs: OptimizerInputs<'g>,
    ) -> Vec<StateUpdate<'g>> {
        check("RmsProp", params, grads);
        let mut out = vec![];
        for (&p, &g) in params.iter().zip(grads) {
            let sq = state(p, self.name(), "square_avg");
            let (g, sq_next) = if self.weight_decay != 0.0 || inputs.grad_scale.is_none() {
                let mut g = inputs.scale(g);
                if self.weight_decay != 0.0 {
                    g = g + p * self.weight_decay;
                }
                (g, sq * self.alpha + g * g * (1.0 - self.alpha))
            } else {
                (
                    inputs.scaled(g, 1.0),
                    sq * self.alpha + inputs.scaled_square(g, 1.0 - self.alpha),
                )
            };
            out.push(update(sq, sq_next, Some(0.0)));
            let avg = sq_next.sqrt() + self.eps;
            let lr = bcast(inputs.lr, p);
            let p_next = if self.momentum > 0.0 {
                let buf = state(p, self.name(), "momentum");
                let buf_next = buf * self.momentum + g / avg;
                out.push(update(buf, buf_next, Some(0.0)));
                p - lr * buf_next
            } else {
                p - lr * (g / avg)
            };
            out.push(update(p, p_next, None));
        }
        out
    }
}

/// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
/// `p ← p (1 - lr wd) - lr sign(β1 m + (1 - β1) g)`, then `m ← β2 m + (1 - β2) g`.
#[derive(Clone, Copy, Debug)]
pub struct Lion {
    pub beta1: f32,
    pub beta2: f32,
    pub weight_decay: f32,
}

impl Default for Lion {
    fn default() -> Self {
        Lion {
            beta1: 0.9,
            beta2: 0.99,
            weight_decay: 0.0,
        }
    }
}

impl Optimizer for Lion {
    fn name(&self) -> &'static str {
        "lion"
    }
    fn build<'g>(
        &self,
        params: &[GraphTensor<'g>],
        grads: &[GraphTensor<'g>],
        inputs: OptimizerInputs<'g>,
    ) -> Vec<StateUpdate<'g>> {
        check("Lion", params, grads);
        let mut out = vec![];
        for (&p, &g) in params.iter().zip(grads) {
            let m = state(p, self.name(), "m");
            let lr = bcast(inputs.lr, p);
            let direction = (m * self.beta1 + inputs.scaled(g, 1.0 - self.beta1)).sign();
            let p_next = p * (1.0 - lr * self.weight_decay) - lr * direction;
            out.push(update(
                m,
                m * self.beta2 + inputs.scaled(g, 1.0 - self.beta2),
                Some(0.0),
            ));
            out.push(update(p, p_next, None));
        }
        out
    }
}

/// Scales `grads` so that their global L2 norm is at most `max_norm`
/// (`torch.nn.utils.clip_grad_norm_`: factor `min(1, max_norm / (norm + 1e-6))`).
/// Returns the clipped gradients and the norm before clipping.
pub fn clip_grad_norm<'g>(
    grads: &[GraphTensor<'g>],
    max_norm: f32,
) -> (Vec<GraphTensor<'g>>, GraphTensor<'g>) {
    let (factor, total) = clip_grad_norm_factor(grads, max_norm);
    let clipped = grads.iter().map(|&g| g * bcast(factor, g)).collect();
    (clipped, total)
}

/// [`clip_grad_norm`]'s factor (rank 0) and the norm before clipping, for an optimizer to
/// fold in ([`OptimizerInputs::grad_scale`]) instead of scaling every gradient first.
pub fn clip_grad_norm_factor<'g>(
    grads: &[GraphTensor<'g>],
    max_norm: f32,
) -> (GraphTensor<'g>, GraphTensor<'g>) {
    assert!(!grads.is_empty(), "clip_grad_norm: no gradients");
    assert!(
        max_norm > 0.0,
        "clip_grad_norm: max_norm must be > 0, got {max_norm}"
    );
    let sq: Vec<GraphTensor<'g>> = grads
        .iter()
        .map(|g| {
            let axes: Vec<i64> = (0..g.rank() as i64).collect();
            if axes.is_empty() {
                *g * *g
            } else {
                (*g * *g).sum(axes)
            }
        })
        .collect();
    let total = sq[1..].iter().fold(sq[0], |a, &b| a + b).sqrt();
    let factor = (max_norm / (total + 1e-6)).minimum(1.0);
    (factor, total)
}
