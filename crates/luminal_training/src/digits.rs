//! The scikit-learn `digits` MLP (64-128-10, ReLU, cross-entropy, Adam), shared by the
//! `digits` example, the accuracy test and the PyTorch comparison (`scripts/bench_training.py`).

use crate::data::{Batches, Digits};
use crate::init::Init;
use crate::loss::{cross_entropy, CrossEntropy};
use crate::optim::Adam;
use crate::train::{StateMode, TrainOptions, TrainStep, Trainer};
use crate::TrainingError;
use luminal::prelude::*;
use luminal_nn::{Linear, Module};
use std::time::{Duration, Instant};

/// Hyper-parameters of [`train_mlp`].
#[derive(Clone, Debug)]
pub struct MlpConfig {
    pub hidden: usize,
    pub batch: usize,
    pub steps: usize,
    pub lr: f32,
    pub seed: u64,
    pub mode: StateMode,
}

impl Default for MlpConfig {
    fn default() -> Self {
        MlpConfig {
            hidden: 128,
            batch: 64,
            steps: 600,
            lr: 3e-3,
            seed: 0,
            mode: StateMode::HostCopy,
        }
    }
}

/// What [`train_mlp`] measured.
#[derive(Clone, Debug)]
pub struct MlpReport {
    pub test_accuracy: f32,
    /// Mean training loss over the last 20 steps.
    pub final_loss: f32,
    /// Mean wall time of one step (batch upload, forward, backward, update), after 10
    /// warm-up steps.
    pub step_time: Duration,
    pub steps: usize,
}

fn mlp<'g>(cx: &'g Graph, hidden: usize) -> (Linear<'g>, Linear<'g>) {
    (
        Linear::new(cx, "fc1", Digits::PIXELS, hidden, true),
        Linear::new(cx, "fc2", hidden, Digits::CLASSES, true),
    )
}

fn forward<'g>(layers: &(Linear<'g>, Linear<'g>), x: GraphTensor<'g>) -> GraphTensor<'g> {
    let h = layers.0.forward(x);
    // ReLU as `h · [h > 0]`: the same values as `relu()` (a max-reduce over a stacked pair),
    // but its forward and backward are each one fused elementwise loop on every backend, and
    // its gradient at 0 is PyTorch's (0).
    layers.1.forward(h * h.gt(0.0).cast(DType::F32))
}

/// Trains the MLP on `train` with minibatches of `config.batch`, calling `on_step(step, loss)`
/// after each step, then measures the accuracy on `test`. `backend` is called twice (the
/// training graph and the evaluation graph).
pub fn train_mlp<B: Backend>(
    backend: impl Fn() -> B,
    train: &Digits,
    test: &Digits,
    config: &MlpConfig,
    on_step: &mut dyn FnMut(usize, f32),
) -> Result<MlpReport, TrainingError> {
    let (b, px) = (config.batch, Digits::PIXELS);
    let cx = Graph::new();
    let x = cx.tensor("x", (b, px));
    let labels = cx.input("labels", b, DType::I32);
    let layers = mlp(&cx, config.hidden);
    let params: Vec<GraphTensor> = [layers.0.parameters(), layers.1.parameters()].concat();
    let loss = cross_entropy(forward(&layers, x), labels, CrossEntropy::default());
    let options = TrainOptions {
        mode: config.mode,
        clip_grad_norm: None,
    };
    let step = TrainStep::build(&params, loss, &Adam::default(), options);
    let mut trainer = Trainer::new(cx.compile(backend(), CompileOptions::default())?, step)?;
    let mut init = Init::new(config.seed);
    for p in &params {
        let shape = p.shape();
        let n: usize = shape
            .iter()
            .map(|d| d.as_constant().unwrap() as usize)
            .product();
        // torch.nn.Linear's default: U(±1/√in_features) for weight [out, in] and bias [out].
        let fan_in = if p.entry().label.starts_with("fc1") {
            px
        } else {
            config.hidden
        };
        trainer.runtime.set(*p, &init.linear_default(n, fan_in))?;
    }
    let mut batches = Batches::new(train.len(), b, config.seed);
    let (mut xb, mut yb) = (vec![0f32; b * px], vec![0i32; b]);
    let mut recent = vec![];
    let mut timed = Duration::ZERO;
    for s in 0..config.steps {
        let t0 = Instant::now();
        for (r, &i) in batches.next_batch().iter().enumerate() {
            xb[r * px..(r + 1) * px].copy_from_slice(&train.images[i * px..(i + 1) * px]);
            yb[r] = train.labels[i];
        }
        trainer.runtime.set(x, &xb)?;
        trainer.runtime.set(labels, &yb)?;
        let l = trainer.step(config.lr)?;
        if s >= 10 {
            timed += t0.elapsed();
        }
        recent.push(l);
        if recent.len() > 20 {
            recent.remove(0);
        }
        on_step(s, l);
    }
    // Evaluate the trained parameters on the whole test set in one batch.
    let ecx = Graph::new();
    let ex = ecx.tensor("x", (test.len(), px));
    let elayers = mlp(&ecx, config.hidden);
    let eparams: Vec<GraphTensor> = [elayers.0.parameters(), elayers.1.parameters()].concat();
    let predicted = forward(&elayers, ex).argmax(1).output();
    let mut ert = ecx.compile(backend(), CompileOptions::default())?;
    for (ep, p) in eparams.iter().zip(&params) {
        ert.set(*ep, &trainer.state_value(*p)?)?;
    }
    ert.set(ex, &test.images)?;
    ert.run()?;
    let pred: Vec<i32> = ert.get(predicted)?;
    let correct = pred
        .iter()
        .zip(&test.labels)
        .filter(|(p, l)| p == l)
        .count();
    Ok(MlpReport {
        test_accuracy: correct as f32 / test.len() as f32,
        final_loss: recent.iter().sum::<f32>() / recent.len().max(1) as f32,
        step_time: timed / config.steps.saturating_sub(10).max(1) as u32,
        steps: config.steps,
    })
}
