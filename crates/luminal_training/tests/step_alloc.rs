//! A training step makes no heap allocation on the CPU backend: once the first steps have
//! run, `Trainer::step` (batch upload, forward, backward, AdamW update with clipping, state
//! in place, loss read back) allocates nothing on any thread — a counting global allocator
//! sees every allocation. Checked on an MLP and a small CNN, on 1 and 2 threads, with the
//! state in place and copied through the host.

use luminal::prelude::*;
use luminal::testing::CountingAlloc;
use luminal_cpu::CpuBackend;
use luminal_nn::{Conv2d, Conv2dOptions, Linear, Module};
use luminal_training::init::Init;
use luminal_training::loss::{cross_entropy, CrossEntropy};
use luminal_training::{Adam, StateMode, TrainOptions, TrainStep, Trainer};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

const BATCH: usize = 16;
const CLASSES: usize = 10;

#[derive(Clone, Copy, Debug)]
enum Net {
    Mlp,
    Cnn,
}

/// Allocations during steps 4..12 of a training run.
fn step_allocations(net: Net, threads: usize, mode: StateMode) -> usize {
    let cx = Graph::new();
    let mut init = Init::new(1);
    let mut params: Vec<(GraphTensor, Vec<f32>)> = vec![];
    let (x, logits) = match net {
        Net::Mlp => {
            let x = cx.tensor("x", (BATCH, 64));
            let l1 = Linear::new(&cx, "l1", 64, 32, true);
            let l2 = Linear::new(&cx, "l2", 32, CLASSES, true);
            for (l, fan_in) in [(&l1, 64), (&l2, 32)] {
                for p in l.parameters() {
                    let n = numel(p);
                    params.push((p, init.linear_default(n, fan_in)));
                }
            }
            (x, l2.forward(l1.forward(x).relu()))
        }
        Net::Cnn => {
            let x = cx.tensor("x", (BATCH, 1, 8, 8));
            let opts = Conv2dOptions {
                padding: 1,
                ..Conv2dOptions::default()
            };
            let c1 = Conv2d::new(&cx, "c1", 1, 4, 3, opts);
            let c2 = Conv2d::new(&cx, "c2", 4, 8, 3, Conv2dOptions { stride: 2, ..opts });
            let head = Linear::new(&cx, "head", 8 * 4 * 4, CLASSES, true);
            for (ps, fan_in) in [
                (c1.parameters(), 9),
                (c2.parameters(), 36),
                (head.parameters(), 128),
            ] {
                for p in ps {
                    let n = numel(p);
                    params.push((p, init.kaiming_uniform(n, fan_in)));
                }
            }
            let h = c2.forward(c1.forward(x).relu()).relu();
            (x, head.forward(h.reshape(vec![BATCH, 128])))
        }
    };
    let y = cx.input("y", BATCH, DType::I32);
    let loss = cross_entropy(logits, y, CrossEntropy::default());
    let tensors: Vec<GraphTensor> = params.iter().map(|(p, _)| *p).collect();
    let options = TrainOptions {
        mode,
        clip_grad_norm: Some(1.0),
        ..TrainOptions::default()
    };
    let step = TrainStep::build(&tensors, loss, &Adam::adamw(), options);
    let rt = cx
        .compile(CpuBackend::with_threads(threads), CompileOptions::default())
        .unwrap();
    let mut t = Trainer::new(rt, step).unwrap();
    for (p, v) in &params {
        t.runtime.set(*p, v).unwrap();
    }
    let features = numel(x) / BATCH;
    let xs: Vec<Vec<f32>> = (0..4)
        .map(|b| {
            (0..BATCH * features)
                .map(|i| ((i * 7 + b * 13) % 17) as f32 / 17.0)
                .collect()
        })
        .collect();
    let ys: Vec<Vec<i32>> = (0..4)
        .map(|b| (0..BATCH).map(|i| ((i + b) % CLASSES) as i32).collect())
        .collect();
    let mut first = 0.0;
    let mut last = 0.0;
    for s in 0..12 {
        if s == 4 {
            GLOBAL.start();
        }
        t.runtime.set(x, &xs[s % 4]).unwrap();
        t.runtime.set(y, &ys[s % 4]).unwrap();
        last = t.step(3e-3).unwrap();
        if s == 0 {
            first = last;
        }
    }
    let allocations = GLOBAL.stop();
    assert!(first.is_finite() && last.is_finite());
    assert_ne!(first, last, "{net:?}: the parameters did not change");
    allocations
}

fn numel(t: GraphTensor) -> usize {
    t.shape()
        .iter()
        .map(|d| d.as_constant().unwrap() as usize)
        .product()
}

#[test]
fn training_steps_allocate_nothing() {
    for net in [Net::Mlp, Net::Cnn] {
        for threads in [1, 2] {
            for mode in [StateMode::InPlace, StateMode::HostCopy] {
                let n = step_allocations(net, threads, mode);
                assert_eq!(
                    n, 0,
                    "{net:?}, {threads} threads, {mode:?}: {n} allocations in 8 steps"
                );
            }
        }
    }
}
