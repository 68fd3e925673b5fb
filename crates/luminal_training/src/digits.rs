//! Classifiers of scikit-learn's `digits` (an MLP 64-128-10 and a small CNN, ReLU,
//! cross-entropy, Adam), shared by the `digits` example, the accuracy tests and the PyTorch
//! comparison (`scripts/bench_training.py`).

use crate::data::{Batches, Digits};
use crate::init::Init;
use crate::loss::{cross_entropy, CrossEntropy};
use crate::optim::Adam;
use crate::train::{LossScale, StateMode, TrainOptions, TrainStep, Trainer};
use crate::TrainingError;
use luminal::prelude::*;
use luminal_nn::{Conv2d, Conv2dOptions, Linear, Module};
use std::time::{Duration, Instant};

/// The network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// 64 → `hidden` → 10.
    Mlp,
    /// conv 3x3 1→16 (pad 1), conv 3x3 16→32 (stride 2, pad 1), linear 512→10.
    Cnn,
}

/// Hyper-parameters of [`train_mlp`].
#[derive(Clone, Debug)]
pub struct MlpConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub batch: usize,
    pub steps: usize,
    pub lr: f32,
    pub seed: u64,
    pub mode: StateMode,
    /// Mixed precision (MLP only): the forward and backward in this half type (`BF16` or
    /// `F16`) from f32 master weights, the loss in f32, with dynamic loss scaling.
    pub half: Option<DType>,
}

impl Default for MlpConfig {
    fn default() -> Self {
        MlpConfig {
            arch: Arch::Mlp,
            hidden: 128,
            batch: 64,
            steps: 600,
            lr: 3e-3,
            seed: 0,
            mode: StateMode::InPlace,
            half: None,
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

/// The layers of either network, with each parameter's fan-in (for PyTorch's default
/// initialisation, `U(±1/√fan_in)` for weights and biases).
enum Net<'g> {
    Mlp(Linear<'g>, Linear<'g>),
    Cnn(Conv2d<'g>, Conv2d<'g>, Linear<'g>),
}

/// PyTorch's `nn.Conv2d(..., stride, padding)` (with bias).
fn conv(stride: usize, padding: usize) -> Conv2dOptions {
    Conv2dOptions {
        stride,
        padding,
        ..Conv2dOptions::default()
    }
}

impl<'g> Net<'g> {
    fn new(cx: &'g Graph, config: &MlpConfig) -> Net<'g> {
        match config.arch {
            Arch::Mlp => Net::Mlp(
                Linear::new(cx, "fc1", Digits::PIXELS, config.hidden, true),
                Linear::new(cx, "fc2", config.hidden, Digits::CLASSES, true),
            ),
            Arch::Cnn => Net::Cnn(
                Conv2d::new(cx, "conv1", 1, 16, 3, conv(1, 1)),
                Conv2d::new(cx, "conv2", 16, 32, 3, conv(2, 1)),
                Linear::new(cx, "fc", 32 * 4 * 4, Digits::CLASSES, true),
            ),
        }
    }

    /// `(parameter, fan_in)` pairs.
    fn parameters(&self) -> Vec<(GraphTensor<'g>, usize)> {
        let with = |m: &dyn Module<'g>, fan_in: usize| {
            m.parameters().into_iter().map(move |p| (p, fan_in))
        };
        match self {
            Net::Mlp(a, b) => {
                let hidden = b.weight.shape()[1].as_constant().unwrap() as usize;
                with(a, Digits::PIXELS).chain(with(b, hidden)).collect()
            }
            Net::Cnn(c1, c2, fc) => with(c1, 9)
                .chain(with(c2, 16 * 9))
                .chain(with(fc, 32 * 16))
                .collect(),
        }
    }

    /// `x [B, 64]` → f32 logits `[B, 10]`, computed in `half` when given (MLP only).
    fn forward(&self, x: GraphTensor<'g>, half: Option<DType>) -> GraphTensor<'g> {
        if let Some(h) = half {
            let Net::Mlp(a, b) = self else {
                panic!("digits: half precision is implemented for the MLP only")
            };
            // The layers' weights are cast to `h` on the way in: their gradients flow back
            // through the casts into the f32 master weights.
            let linear = |l: &Linear<'g>, x: GraphTensor<'g>| {
                let y = x.matmul(l.weight.cast(h).transpose(0, 1));
                match l.bias {
                    Some(bias) => y + bias.cast(h),
                    None => y,
                }
            };
            let hidden = linear(a, x.cast(h));
            let hidden = hidden * hidden.gt(0.0).cast(h);
            return linear(b, hidden).cast(DType::F32);
        }
        match self {
            Net::Mlp(a, b) => b.forward(relu(a.forward(x))),
            Net::Cnn(c1, c2, fc) => {
                let n = x.shape()[0].clone();
                let img = x.reshape(vec![n.clone(), 1.into(), 8.into(), 8.into()]);
                let h = relu(c2.forward(relu(c1.forward(img))));
                fc.forward(h.reshape(vec![n, (32 * 16).into()]))
            }
        }
    }
}

/// ReLU as `h · [h > 0]`: the same values as `relu()` (a max-reduce over a stacked pair),
/// but its forward and backward are each one fused elementwise loop on every backend, and
/// its gradient at 0 is PyTorch's (0).
fn relu(h: GraphTensor) -> GraphTensor {
    h * h.gt(0.0).cast(DType::F32)
}

/// Trains the network on `train` with minibatches of `config.batch`, calling `on_step(step, loss)`
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
    let net = Net::new(&cx, config);
    let params: Vec<(GraphTensor, usize)> = net.parameters();
    let loss = cross_entropy(net.forward(x, config.half), labels, CrossEntropy::default());
    let options = TrainOptions {
        mode: config.mode,
        loss_scale: config.half.map(|_| LossScale::default()),
        ..TrainOptions::default()
    };
    let tensors: Vec<GraphTensor> = params.iter().map(|(p, _)| *p).collect();
    let step = TrainStep::build(&tensors, loss, &Adam::default(), options);
    let mut trainer = Trainer::new(cx.compile(backend(), CompileOptions::default())?, step)?;
    let mut init = Init::new(config.seed);
    for (p, fan_in) in &params {
        let n = p.n_elements().as_constant().unwrap() as usize;
        trainer.runtime.set(*p, &init.linear_default(n, *fan_in))?;
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
    let enet = Net::new(&ecx, config);
    let predicted = enet.forward(ex, config.half).argmax(1).output();
    let mut ert = ecx.compile(backend(), CompileOptions::default())?;
    for ((ep, _), (p, _)) in enet.parameters().iter().zip(&params) {
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
