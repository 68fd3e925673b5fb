//! One training step as one graph, and a small driver for its runtime.

use crate::optim::{clip_grad_norm_factor, Optimizer, OptimizerInputs, StateUpdate};
use crate::schedule::Schedule;
use crate::TrainingError;
use luminal::autograd::gradients;
use luminal::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// How the runtime keeps parameters and optimizer state from one step to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateMode {
    /// Each state input is rewritten in place by the step itself (`write_slice` of the whole
    /// tensor): nothing leaves the runtime. The other readers of a state input see its value
    /// from before the run (the reference and CPU backends, see `tests/cpu_state.rs`).
    InPlace,
    /// The new values are outputs, copied back into the state inputs after each run
    /// (`get_into` + `set`): for backends whose `WriteSlice` only supports appends.
    HostCopy,
}

/// Options of [`TrainStep::build`].
#[derive(Clone, Copy, Debug)]
pub struct TrainOptions {
    pub mode: StateMode,
    /// Clip the global gradient norm to this value first.
    pub clip_grad_norm: Option<f32>,
    /// Gradient accumulation: the optimizer steps once every `accumulate` runs, on the mean
    /// of their gradients (each run's loss should be a mean over its micro-batch). 1 = off.
    pub accumulate: usize,
    /// Dynamic loss scaling for half-precision forward passes (see [`LossScale`]).
    pub loss_scale: Option<LossScale>,
}

/// Dynamic loss scaling (`torch.amp.GradScaler`): the loss is multiplied by a scale before
/// the backward pass and the gradients divided by it, so that small half-precision gradients
/// do not flush to zero. A step whose gradients are not all finite is skipped (parameters and
/// optimizer state unchanged) and the scale multiplied by `backoff_factor`; after
/// `growth_interval` finite steps in a row it is multiplied by `growth_factor` (if that stays
/// finite). The scale and the streak are runtime state like the optimizer's.
#[derive(Clone, Copy, Debug)]
pub struct LossScale {
    pub init_scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: usize,
}

impl Default for LossScale {
    /// PyTorch's defaults: 2¹⁶, ×2 every 2000 finite steps, ×0.5 on overflow.
    fn default() -> Self {
        LossScale {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            mode: StateMode::InPlace,
            clip_grad_norm: None,
            accumulate: 1,
            loss_scale: None,
        }
    }
}

/// Handles of a training step graph (lifetime-free, so a [`Trainer`] can own them).
#[derive(Clone, Debug)]
pub struct TrainStep {
    pub loss: TensorRef,
    pub lr: TensorRef,
    pub step: TensorRef,
    /// The gradient norm before clipping, when clipping.
    pub grad_norm: Option<TensorRef>,
    /// With gradient accumulation: the scalar input that is 1 on the run that applies the
    /// update and 0 on the others, and the number of runs per update.
    pub apply: Option<TensorRef>,
    pub accumulate: usize,
    /// With loss scaling: a scalar output, 1 when this run's gradients were finite (the step
    /// was taken), 0 when it was skipped; and the scale state (shape `[1]`).
    pub grads_finite: Option<TensorRef>,
    pub scale: Option<TensorRef>,
    pub params: Vec<TensorRef>,
    /// `(state input, value after the step, initial value)`; parameters have no initial
    /// value (the user sets them).
    pub states: Vec<(TensorRef, TensorRef, Option<f32>)>,
    /// Name and element count of each state input (for checkpoints).
    pub state_names: Vec<(String, usize)>,
    pub mode: StateMode,
}

impl TrainStep {
    /// Adds the backward pass of `loss` with respect to `params` and `optimizer`'s update to
    /// the graph, and makes the runtime keep the updated state (see [`StateMode`]).
    /// Build everything else (extra outputs) before calling this: the update must be the
    /// last thing a run does.
    pub fn build<'g>(
        params: &[GraphTensor<'g>],
        loss: GraphTensor<'g>,
        optimizer: &dyn Optimizer,
        options: TrainOptions,
    ) -> TrainStep {
        Self::build_with_state(params, loss, optimizer, options, vec![])
    }

    /// [`TrainStep::build`], plus state the model itself updates each step (a batch norm's
    /// running statistics: `BatchNorm::forward_train`'s second result, converted with
    /// `into()`), kept by the runtime like the optimizer's.
    pub fn build_with_state<'g>(
        params: &[GraphTensor<'g>],
        loss: GraphTensor<'g>,
        optimizer: &dyn Optimizer,
        options: TrainOptions,
        model_state: Vec<StateUpdate<'g>>,
    ) -> TrainStep {
        let cx = loss.graph;
        let loss = loss.output();
        assert!(
            options.accumulate >= 1,
            "TrainStep: accumulate must be >= 1, got {}",
            options.accumulate
        );
        // Loss scaling: differentiate `loss · scale`, then unscale.
        let mut scaling = None;
        let mut grads = match options.loss_scale {
            None => gradients(params, loss),
            Some(ls) => {
                assert!(
                    options.accumulate == 1,
                    "TrainStep: loss scaling with gradient accumulation is not supported"
                );
                let scale = cx.tensor("train.loss_scale", 1);
                let streak = cx.tensor("train.loss_scale_streak", 1);
                let s = scale.reshape(());
                let grads = gradients(params, loss * s.cast(loss.dtype()));
                let inv = s.recip();
                let grads: Vec<GraphTensor> = grads
                    .iter()
                    .map(|&g| g * inv.cast(g.dtype()).expand_to(g.shape()))
                    .collect();
                scaling = Some((ls, scale, streak, grads.clone()));
                grads
            }
        };
        // Gradient accumulation: sum this run's gradients into state, and let the optimizer
        // see their mean; its update (and the reset of the sums) only lands when `apply` is 1.
        let mut accumulators = vec![];
        let apply = (options.accumulate > 1).then(|| cx.tensor("train.apply", ()));
        if let Some(apply) = apply {
            let k = options.accumulate as f32;
            grads = params
                .iter()
                .zip(&grads)
                .map(|(&p, &g)| {
                    let acc = cx.tensor(&format!("{}.grad_sum", p.entry().label), p.shape());
                    let sum = acc + g;
                    let keep = 1.0 - apply.expand_to(p.shape());
                    accumulators.push(StateUpdate {
                        state: acc,
                        next: sum * keep,
                        init: Some(0.0),
                    });
                    sum * (1.0 / k)
                })
                .collect();
        }
        let mut grad_norm = None;
        let mut grad_scale = None;
        if let Some(max) = options.clip_grad_norm {
            // The optimizer folds the factor in (no clipped copy of every gradient).
            let (factor, norm) = clip_grad_norm_factor(&grads, max);
            grad_scale = Some(factor);
            grad_norm = Some(norm.output().handle());
        }
        let lr = cx.tensor(&format!("{}.lr", optimizer.name()), ());
        let step = cx.tensor(&format!("{}.step", optimizer.name()), ());
        let inputs = OptimizerInputs {
            lr,
            step,
            grad_scale,
        };
        let mut updates: Vec<StateUpdate> = optimizer.build(params, &grads, inputs);
        if let Some(apply) = apply {
            // Exact either way: 1·next + 0·old = next, 0·next + 1·old = old.
            for u in &mut updates {
                let a = apply.expand_to(u.state.shape());
                u.next = u.next * a + u.state * (1.0 - a);
            }
        }
        updates.extend(accumulators);
        updates.extend(model_state);
        let mut grads_finite = None;
        let mut scale_ref = None;
        if let Some((ls, scale, streak, unscaled)) = scaling {
            // Any inf or NaN makes the sum inf or NaN, and both comparisons are false for
            // those (`· 0` would not do: the generic passes fold `x · 0` to 0).
            let total = unscaled
                .iter()
                .map(|g| {
                    let axes: Vec<i64> = (0..g.rank() as i64).collect();
                    let g = g.cast(DType::F32);
                    if axes.is_empty() {
                        g
                    } else {
                        g.sum(axes)
                    }
                })
                .reduce(|a, b| a + b)
                .expect("at least one parameter");
            let finite = total.lt(f32::INFINITY).and(total.gt(f32::NEG_INFINITY));
            // Skipped step: every state keeps its value (select is exact with inf and NaN).
            for u in &mut updates {
                u.next = finite.expand_to(u.state.shape()).select(u.next, u.state);
            }
            let f = finite.cast(DType::F32).expand_to(vec![1usize]);
            let next_streak = streak + 1.0;
            let grown = scale * ls.growth_factor;
            let grow = next_streak.ge(ls.growth_interval as f32).cast(DType::F32)
                * grown.lt(f32::INFINITY).cast(DType::F32);
            let kept = next_streak.ge(ls.growth_interval as f32).cast(DType::F32);
            let next_scale =
                f * (grow * grown + (1.0 - grow) * scale) + (1.0 - f) * (scale * ls.backoff_factor);
            let next_streak_value = f * (1.0 - kept) * next_streak;
            updates.push(StateUpdate {
                state: scale,
                next: next_scale,
                init: Some(ls.init_scale),
            });
            updates.push(StateUpdate {
                state: streak,
                next: next_streak_value,
                init: Some(0.0),
            });
            grads_finite = Some(finite.cast(DType::F32).output().handle());
            scale_ref = Some(scale.handle());
        }
        let mut states = vec![];
        let mut state_names = vec![];
        // All new values exist before any write, so every read of an old value comes first.
        let nexts: Vec<GraphTensor> = updates
            .iter()
            .map(|u| {
                let shape = u.state.shape();
                assert!(
                    !shape.is_empty(),
                    "TrainStep: state {:?} is a scalar; give parameters at least one dim",
                    u.state
                );
                match options.mode {
                    StateMode::InPlace => u.next,
                    StateMode::HostCopy => u.next.output(),
                }
            })
            .collect();
        for (u, next) in updates.iter().zip(nexts) {
            let next = match options.mode {
                StateMode::InPlace => u.state.write_slice(0, 0usize, next),
                StateMode::HostCopy => next,
            };
            let n =
                u.state.n_elements().as_constant().unwrap_or_else(|| {
                    panic!("TrainStep: state {:?} needs a static shape", u.state)
                }) as usize;
            states.push((u.state.handle(), next.handle(), u.init));
            state_names.push((u.state.entry().label, n));
        }
        TrainStep {
            loss: loss.handle(),
            lr: lr.handle(),
            step: step.handle(),
            grad_norm,
            apply: apply.map(|a| a.handle()),
            accumulate: options.accumulate,
            grads_finite,
            scale: scale_ref,
            params: params.iter().map(|p| p.handle()).collect(),
            states,
            state_names,
            mode: options.mode,
        }
    }
}

/// Drives a compiled training step: initialises optimizer state, feeds the schedule's
/// learning rate and the step number, runs, and (in [`StateMode::HostCopy`]) copies the new
/// state back.
pub struct Trainer<R: Runtime> {
    pub runtime: R,
    pub handles: TrainStep,
    /// Optimizer steps taken so far (updates applied).
    pub steps: usize,
    /// Runs since the last applied update (gradient accumulation).
    pub micro_steps: usize,
    /// Runs so far (every `step` call).
    pub runs: usize,
    scratch: Vec<f32>,
    /// State restored by `load`, until the next step recomputes it in the runtime.
    loaded: Option<HashMap<String, Vec<f32>>>,
}

impl<R: Runtime> Trainer<R> {
    /// Takes a runtime compiled from the graph `handles` was built in, and sets every
    /// optimizer state to its initial value. Parameters and data inputs are set by the user
    /// (`trainer.runtime.set(..)`) before the first step.
    pub fn new(mut runtime: R, handles: TrainStep) -> Result<Trainer<R>, TrainingError> {
        for ((state, _, init), (_, n)) in handles.states.iter().zip(&handles.state_names) {
            if let Some(v) = init {
                runtime.set(*state, &vec![*v; *n])?;
            }
        }
        Ok(Trainer {
            runtime,
            handles,
            steps: 0,
            micro_steps: 0,
            runs: 0,
            scratch: vec![],
            loaded: None,
        })
    }

    /// One run at learning rate `lr`: forward, backward and (on the last run of each group
    /// of `accumulate`) the update. Returns the loss (computed with the parameters before the
    /// update).
    pub fn step(&mut self, lr: f32) -> Result<f32, TrainingError> {
        self.loaded = None;
        let applies = self.micro_steps + 1 == self.handles.accumulate;
        self.runtime.set(self.handles.lr, &[lr])?;
        self.runtime
            .set(self.handles.step, &[(self.steps + 1) as f32])?;
        if let Some(apply) = self.handles.apply {
            self.runtime
                .set(apply, &[if applies { 1f32 } else { 0. }])?;
        }
        self.runtime.run()?;
        self.runs += 1;
        let mut taken = applies;
        if let Some(finite) = self.handles.grads_finite {
            self.runtime.get_into(finite, &mut self.scratch)?;
            // A skipped step (overflow under loss scaling) does not count, like an optimizer
            // step PyTorch's GradScaler does not take.
            taken &= self.scratch[0] == 1.0;
        }
        if applies {
            self.micro_steps = 0;
            if taken {
                self.steps += 1;
            }
        } else {
            self.micro_steps += 1;
        }
        if self.handles.mode == StateMode::HostCopy {
            for (state, next, _) in &self.handles.states {
                self.runtime.get_into(*next, &mut self.scratch)?;
                self.runtime.set(*state, &self.scratch)?;
            }
        }
        self.runtime
            .get_into(self.handles.loss, &mut self.scratch)?;
        Ok(self.scratch[0])
    }

    /// One step at the schedule's learning rate for the current step.
    pub fn step_with(&mut self, schedule: &dyn Schedule) -> Result<f32, TrainingError> {
        let lr = schedule.lr(self.steps);
        self.step(lr)
    }

    /// The current value of a state tensor (a parameter or an optimizer state), after the
    /// last step (or as set, before the first one).
    pub fn state_value(&self, state: impl Into<TensorRef>) -> Result<Vec<f32>, TrainingError> {
        let state = state.into();
        let i = self
            .handles
            .states
            .iter()
            .position(|(s, _, _)| *s == state)
            .ok_or(TrainingError::NotState)?;
        if let Some(values) = &self.loaded {
            return Ok(values[&self.handles.state_names[i].0].clone());
        }
        let next = &self.handles.states[i].1;
        if self.runs == 0 {
            return Err(TrainingError::NoStepYet);
        }
        Ok(self.runtime.get(*next)?)
    }

    /// Writes every parameter and optimizer state, and the step count, to a safetensors file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TrainingError> {
        let mut tensors: Vec<(String, Vec<u8>, Vec<usize>)> = vec![];
        for ((state, _, _), (name, n)) in self.handles.states.iter().zip(&self.handles.state_names)
        {
            if self.micro_steps != 0 {
                return Err(TrainingError::Checkpoint(
                    "save between accumulation groups (gradient sums are not saved)".into(),
                ));
            }
            let values = self.state_value(*state)?;
            debug_assert_eq!(values.len(), *n);
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.push((name.clone(), bytes, vec![*n]));
        }
        let step = (self.steps as f32).to_le_bytes().to_vec();
        tensors.push(("trainer.steps".into(), step, vec![1]));
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(name, bytes, shape)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
            })
            .collect::<Result<_, _>>()?;
        safetensors::serialize_to_file(views, None, path.as_ref())?;
        Ok(())
    }

    /// Restores what [`Trainer::save`] wrote: the state inputs and the step count, so the
    /// following steps continue the same trajectory.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<(), TrainingError> {
        let bytes = std::fs::read(path.as_ref())?;
        let file = safetensors::SafeTensors::deserialize(&bytes)?;
        let read = |name: &str, n: usize| -> Result<Vec<f32>, TrainingError> {
            let t = file
                .tensor(name)
                .map_err(|_| TrainingError::Checkpoint(format!("missing tensor {name}")))?;
            if t.dtype() != safetensors::Dtype::F32 || t.data().len() != n * 4 {
                return Err(TrainingError::Checkpoint(format!(
                    "tensor {name}: expected {n} f32 values, got {:?} with {} bytes",
                    t.dtype(),
                    t.data().len()
                )));
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        let mut values = HashMap::new();
        for (name, n) in &self.handles.state_names {
            values.insert(name.clone(), read(name, *n)?);
        }
        let steps = read("trainer.steps", 1)?[0];
        for ((state, _, _), (name, _)) in self.handles.states.iter().zip(&self.handles.state_names)
        {
            self.runtime.set(*state, &values[name])?;
        }
        self.steps = steps as usize;
        self.loaded = Some(values);
        Ok(())
    }
}
