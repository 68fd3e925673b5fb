//! Fits `y = 3x₀ - 2x₁ + 0.5 + noise` with a linear model, on the CPU backend: the smallest
//! complete training loop (graph, loss, SGD with momentum, a cosine schedule).
//!
//! ```bash
//! cargo run --release --example linear_regression
//! ```

use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_training::loss::{mse, Reduction};
use luminal_training::{Cosine, Sgd, StateMode, TrainOptions, TrainStep, Trainer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const N: usize = 256;
    let mut rng = StdRng::seed_from_u64(0);
    let xs: Vec<f32> = (0..N * 2).map(|_| rng.random_range(-1.0..1.0)).collect();
    let ys: Vec<f32> = (0..N)
        .map(|i| 3.0 * xs[2 * i] - 2.0 * xs[2 * i + 1] + 0.5 + rng.random_range(-0.05..0.05))
        .collect();

    let cx = Graph::new();
    let x = cx.tensor("x", (N, 2));
    let y = cx.tensor("y", (N, 1));
    let w = cx.tensor("w", (2, 1));
    let b = cx.tensor("b", 1);
    let loss = mse(x.matmul(w) + b, y, Reduction::Mean);
    let optimizer = Sgd {
        momentum: 0.9,
        ..Sgd::default()
    };
    let options = TrainOptions {
        mode: StateMode::HostCopy, // the CPU backend's WriteSlice only appends (see the crate docs)
        clip_grad_norm: None,
        ..TrainOptions::default()
    };
    let step = TrainStep::build(&[w, b], loss, &optimizer, options);
    let rt = cx.compile(CpuBackend::with_threads(1), CompileOptions::default())?;
    let mut trainer = Trainer::new(rt, step)?;
    trainer.runtime.set(x, &xs)?;
    trainer.runtime.set(y, &ys)?;
    trainer.runtime.set(w, &[0f32, 0.])?;
    trainer.runtime.set(b, &[0f32])?;
    let schedule = Cosine {
        lr: 0.1,
        min_lr: 0.001,
        t_max: 200,
    };
    for s in 0..200 {
        let l = trainer.step_with(&schedule)?;
        if s % 40 == 0 || s == 199 {
            println!("step {s:>3}  loss {l:.6}");
        }
    }
    let (w, b) = (trainer.state_value(w)?, trainer.state_value(b)?);
    println!(
        "w = [{:.3}, {:.3}], b = {:.3}  (true: [3, -2], 0.5)",
        w[0], w[1], b[0]
    );
    Ok(())
}
