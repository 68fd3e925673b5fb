//! Layers that train differently from how they infer.
//!
//! BatchNorm2d in training mode against PyTorch (`scripts/gen_training_fixtures.py`): three
//! SGD steps (loss, input gradient, parameters and running statistics after each step), then
//! inference with the running statistics; on the reference backend (state in place) and the
//! CPU backend (host copy). Dropout against its definition with a seeded mask.

mod common;

use common::*;
use luminal::autograd::gradients;
use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_nn::{dropout_mask, BatchNorm, Dropout, Module};
use luminal_training::*;

fn check<B: Backend>(backend: impl Fn() -> B, mode: StateMode, label: &str) {
    let f = &fixture()["batchnorm"];
    let cx = Graph::new();
    let x = cx.tensor("x", (4, 3, 2, 2));
    let w = input(&cx, "w", &f["w"]);
    let bn = BatchNorm::new(&cx, "bn", 3);
    let (y, stats) = bn.forward_train(x);
    let loss = (y * w).sum([0, 1, 2, 3]);
    let grad_x = gradients(&[x], loss)[0].output();
    let options = TrainOptions {
        mode,
        ..TrainOptions::default()
    };
    let step = TrainStep::build_with_state(
        &bn.parameters(),
        loss,
        &Sgd::default(),
        options,
        stats.into_iter().map(Into::into).collect(),
    );
    let mut t = Trainer::new(
        cx.compile(backend(), CompileOptions::default()).unwrap(),
        step,
    )
    .unwrap();
    set(&mut t.runtime, w, &f["w"]);
    set(&mut t.runtime, bn.weight.unwrap(), &f["weight"]);
    set(&mut t.runtime, bn.bias.unwrap(), &f["bias"]);
    for s in 0..3 {
        set(&mut t.runtime, x, &f["x"][s]);
        let l = t.step(0.1).unwrap();
        let what = format!("{label} step {s}");
        assert_close(
            &what,
            &[l],
            &[f["loss"][s].as_f64().unwrap() as f32],
            1e-4,
            1e-5,
        );
        if s == 0 {
            let got = t.runtime.get::<f32>(grad_x).unwrap();
            assert_close(
                &format!("{what} dx"),
                &got,
                &floats(&f["grad_x"]["data"]),
                1e-5,
                1e-4,
            );
        }
        for (tensor, key) in [
            (bn.weight.unwrap(), "weight_after"),
            (bn.bias.unwrap(), "bias_after"),
            (bn.running_mean, "running_mean"),
            (bn.running_var, "running_var"),
        ] {
            let got = t.state_value(tensor).unwrap();
            assert_close(
                &format!("{what} {key}"),
                &got,
                &floats(&f[key][s]),
                1e-5,
                1e-5,
            );
        }
    }
    // Inference with the trained parameters and running statistics.
    let ecx = Graph::new();
    let ex = ecx.tensor("x", (2, 3, 2, 2));
    let ebn = BatchNorm::new(&ecx, "bn", 3);
    let ey = ebn.forward(ex).output();
    let mut ert = ecx.compile(backend(), CompileOptions::default()).unwrap();
    for (e, tr) in [
        (ebn.weight.unwrap(), bn.weight.unwrap()),
        (ebn.bias.unwrap(), bn.bias.unwrap()),
        (ebn.running_mean, bn.running_mean),
        (ebn.running_var, bn.running_var),
    ] {
        ert.set(e, &t.state_value(tr).unwrap()).unwrap();
    }
    set(&mut ert, ex, &f["x_eval"]);
    ert.run().unwrap();
    let got = ert.get::<f32>(ey).unwrap();
    assert_close(
        &format!("{label} eval"),
        &got,
        &floats(&f["y_eval"]["data"]),
        1e-5,
        1e-4,
    );
}

#[test]
fn batchnorm_matches_pytorch_reference_in_place() {
    check(|| ReferenceBackend, StateMode::InPlace, "reference");
}

#[test]
fn batchnorm_matches_pytorch_cpu_host_copy() {
    check(|| CpuBackend::with_threads(2), StateMode::InPlace, "cpu");
}

#[test]
fn dropout_scales_kept_values_and_their_gradient() {
    use rand::{Rng, SeedableRng};
    let p = 0.25f32;
    let cx = Graph::new();
    let x = cx.tensor("x", (8, 16));
    let drop = Dropout::new(&cx, "drop", (8, 16), p);
    let y = drop.forward(x);
    let g = gradients(&[x], y.sum([0, 1]))[0].output();
    let y = y.output();
    let mut rt = cx
        .compile(CpuBackend::with_threads(1), CompileOptions::default())
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut mask = vec![0f32; 128];
    dropout_mask(&mut mask, p, || rng.random::<f32>());
    let zeros = mask.iter().filter(|&&m| m == 0.0).count();
    assert!(
        (16..=48).contains(&zeros),
        "{zeros} of 128 dropped at p = 0.25"
    );
    let xv: Vec<f32> = (0..128).map(|i| i as f32 * 0.5 - 7.0).collect();
    rt.set(x, &xv).unwrap();
    rt.set(drop.mask, &mask).unwrap();
    rt.run().unwrap();
    let (yv, gv) = (rt.get::<f32>(y).unwrap(), rt.get::<f32>(g).unwrap());
    for i in 0..128 {
        let keep = mask[i] / (1.0 - p);
        assert!((yv[i] - xv[i] * keep).abs() < 1e-6 && (gv[i] - keep).abs() < 1e-6);
    }
}
