//! Ten-step optimizer trajectories (with schedules and clipping) and learning-rate schedules
//! against PyTorch (`scripts/gen_training_fixtures.py`), on the reference backend (state
//! written in place, and copied through the host) and the CPU backend (host copy).

mod common;

use common::*;
use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_training::loss::{self, Reduction};
use luminal_training::*;

fn optimizer(name: &str) -> (Box<dyn Optimizer>, Box<dyn Schedule>, Option<f32>) {
    let sgd = |lr: f32, momentum: f32| -> (Box<dyn Optimizer>, Box<dyn Schedule>, Option<f32>) {
        (
            Box::new(Sgd {
                momentum,
                ..Sgd::default()
            }),
            Box::new(Constant(lr)),
            None,
        )
    };
    let adam = |wd: f32, decoupled: bool| Adam {
        weight_decay: wd,
        decoupled,
        ..Adam::default()
    };
    match name {
        "sgd" => sgd(0.1, 0.0),
        "sgd_momentum" => sgd(0.1, 0.9),
        "sgd_nesterov_wd" => (
            Box::new(Sgd {
                momentum: 0.9,
                nesterov: true,
                weight_decay: 0.01,
            }),
            Box::new(Constant(0.1)),
            None,
        ),
        "adam" => (Box::new(adam(0.0, false)), Box::new(Constant(0.05)), None),
        "adam_l2" => (Box::new(adam(0.1, false)), Box::new(Constant(0.05)), None),
        "adamw" => (Box::new(adam(0.1, true)), Box::new(Constant(0.05)), None),
        "rmsprop" => (Box::new(RmsProp::default()), Box::new(Constant(0.01)), None),
        "rmsprop_momentum_wd" => (
            Box::new(RmsProp {
                momentum: 0.9,
                weight_decay: 0.01,
                ..RmsProp::default()
            }),
            Box::new(Constant(0.01)),
            None,
        ),
        "lion" => (
            Box::new(Lion {
                weight_decay: 0.1,
                ..Lion::default()
            }),
            Box::new(Constant(0.01)),
            None,
        ),
        "adam_clip" => (
            Box::new(adam(0.0, false)),
            Box::new(Constant(0.05)),
            Some(0.5),
        ),
        "sgd_step_lr" => (
            Box::new(Sgd {
                momentum: 0.9,
                ..Sgd::default()
            }),
            Box::new(StepDecay {
                lr: 0.1,
                step_size: 3,
                gamma: 0.5,
            }),
            None,
        ),
        "adam_cosine" => (
            Box::new(adam(0.0, false)),
            Box::new(Cosine {
                lr: 0.05,
                min_lr: 0.001,
                t_max: 8,
            }),
            None,
        ),
        "adamw_warmup_cosine" => (
            Box::new(Adam::adamw()),
            Box::new(WarmupCosine {
                lr: 0.05,
                min_lr: 0.0,
                start_factor: 0.1,
                warmup: 3,
                total: 10,
            }),
            None,
        ),
        "sgd_one_cycle" => (
            Box::new(Sgd::default()),
            Box::new(OneCycle::new(0.2, 10)),
            None,
        ),
        other => panic!("no optimizer for case {other}"),
    }
}

fn check_trajectories<B: Backend>(backend: impl Fn() -> B, mode: StateMode, label: &str) {
    let problem = &fixture()["optim_problem"];
    let cases = fixture()["optim"].as_object().unwrap();
    assert!(cases.len() >= 14);
    for (name, case) in cases {
        let (opt, schedule, clip) = optimizer(name);
        let cx = Graph::new();
        let x = input(&cx, "x", &problem["x"]);
        let y = input(&cx, "y", &problem["y"]);
        let w = input(&cx, "w", &problem["w"]);
        let b = input(&cx, "b", &problem["b"]);
        let l = loss::mse(x.matmul(w) + b, y, Reduction::Mean);
        let options = TrainOptions {
            mode,
            clip_grad_norm: clip,
            ..TrainOptions::default()
        };
        let step = TrainStep::build(&[w, b], l, opt.as_ref(), options);
        let rt = cx.compile(backend(), CompileOptions::default()).unwrap();
        let mut t = Trainer::new(rt, step).unwrap();
        for (tensor, key) in [(x, "x"), (y, "y"), (w, "w"), (b, "b")] {
            set(&mut t.runtime, tensor, &problem[key]);
        }
        let lrs = floats(&case["lr"]);
        let (losses, ws, bs) = (&case["loss"], &case["w"], &case["b"]);
        for s in 0..10 {
            let what = format!("{label} {name} step {s}");
            let lr = schedule.lr(s);
            assert_close(&format!("{what} lr"), &[lr], &[lrs[s]], 1e-7, 1e-5);
            let got = t.step_with(schedule.as_ref()).unwrap();
            assert_close(
                &format!("{what} loss"),
                &[got],
                &[floats(losses)[s]],
                1e-5,
                1e-5,
            );
            assert_close(
                &format!("{what} w"),
                &t.state_value(w).unwrap(),
                &floats(&ws[s]),
                1e-5,
                1e-5,
            );
            assert_close(
                &format!("{what} b"),
                &t.state_value(b).unwrap(),
                &floats(&bs[s]),
                1e-5,
                1e-5,
            );
        }
    }
}

#[test]
fn trajectories_match_pytorch_reference_in_place() {
    check_trajectories(
        || ReferenceBackend,
        StateMode::InPlace,
        "reference in place",
    );
}

#[test]
fn trajectories_match_pytorch_reference_host_copy() {
    check_trajectories(
        || ReferenceBackend,
        StateMode::HostCopy,
        "reference host copy",
    );
}

#[test]
fn trajectories_match_pytorch_cpu_in_place() {
    check_trajectories(
        || CpuBackend::with_threads(2),
        StateMode::InPlace,
        "cpu in place",
    );
}

#[test]
fn trajectories_match_pytorch_cpu_host_copy() {
    check_trajectories(
        || CpuBackend::with_threads(2),
        StateMode::HostCopy,
        "cpu host copy",
    );
}

#[test]
fn schedules_match_pytorch() {
    let s = &fixture()["schedules"];
    let check = |name: &str, sched: &dyn Schedule| {
        let want = floats(&s[name]);
        let got: Vec<f32> = (0..want.len()).map(|i| sched.lr(i)).collect();
        assert_close(name, &got, &want, 1e-8, 1e-5);
    };
    check(
        "step",
        &StepDecay {
            lr: 0.1,
            step_size: 4,
            gamma: 0.3,
        },
    );
    check(
        "cosine",
        &Cosine {
            lr: 0.1,
            min_lr: 0.005,
            t_max: 20,
        },
    );
    check(
        "warmup_cosine",
        &WarmupCosine {
            lr: 0.1,
            min_lr: 0.01,
            start_factor: 0.2,
            warmup: 5,
            total: 30,
        },
    );
    check("one_cycle", &OneCycle::new(0.5, 30));
}

#[test]
fn checkpoint_resume_reproduces_the_trajectory_bit_for_bit() {
    let problem = &fixture()["optim_problem"];
    let dir = std::env::temp_dir().join(format!("luminal_ckpt_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("adam.safetensors");
    let run = |steps_before: usize, resume: bool| -> Vec<f32> {
        let cx = Graph::new();
        let x = input(&cx, "x", &problem["x"]);
        let y = input(&cx, "y", &problem["y"]);
        let w = input(&cx, "w", &problem["w"]);
        let b = input(&cx, "b", &problem["b"]);
        let l = loss::mse(x.matmul(w) + b, y, Reduction::Mean);
        let step = TrainStep::build(
            &[w, b],
            l,
            &Adam::default(),
            TrainOptions {
                mode: StateMode::HostCopy,
                clip_grad_norm: None,
                ..TrainOptions::default()
            },
        );
        let rt = cx
            .compile(CpuBackend::with_threads(2), CompileOptions::default())
            .unwrap();
        let mut t = Trainer::new(rt, step).unwrap();
        for (tensor, key) in [(x, "x"), (y, "y"), (w, "w"), (b, "b")] {
            set(&mut t.runtime, tensor, &problem[key]);
        }
        let sched = Cosine {
            lr: 0.05,
            min_lr: 0.0,
            t_max: 10,
        };
        if resume {
            t.load(&path).unwrap();
            assert_eq!(t.steps, steps_before);
        } else {
            for _ in 0..steps_before {
                t.step_with(&sched).unwrap();
            }
            t.save(&path).unwrap();
        }
        while t.steps < 10 {
            t.step_with(&sched).unwrap();
        }
        [t.state_value(w).unwrap(), t.state_value(b).unwrap()].concat()
    };
    let straight = run(4, false);
    let resumed = run(4, true);
    assert_eq!(
        straight.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        resumed.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // A truncated file is a typed error, not a panic.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let cx = Graph::new();
    let w = cx.tensor("w", (3, 2));
    let l = (w * w).sum([0, 1]);
    let step = TrainStep::build(&[w], l, &Sgd::default(), TrainOptions::default());
    let rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut t = Trainer::new(rt, step).unwrap();
    assert!(matches!(t.load(&path), Err(TrainingError::Safetensors(_))));
    std::fs::remove_dir_all(&dir).ok();
}

/// Two micro-batches of 3 rows with `accumulate: 2` follow PyTorch's full-batch (6 rows) Adam
/// trajectory: the mean of the two half-batch mean losses is the full mean.
fn check_accumulation<B: Backend>(backend: B, mode: StateMode) {
    let problem = &fixture()["optim_problem"];
    let case = &fixture()["optim"]["adam"];
    let (xs, ys) = (floats(&problem["x"]["data"]), floats(&problem["y"]["data"]));
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 3));
    let y = cx.tensor("y", (3, 2));
    let w = input(&cx, "w", &problem["w"]);
    let b = input(&cx, "b", &problem["b"]);
    let l = loss::mse(x.matmul(w) + b, y, Reduction::Mean);
    let options = TrainOptions {
        mode,
        accumulate: 2,
        ..TrainOptions::default()
    };
    let step = TrainStep::build(&[w, b], l, &Adam::default(), options);
    let mut t = Trainer::new(
        cx.compile(backend, CompileOptions::default()).unwrap(),
        step,
    )
    .unwrap();
    set(&mut t.runtime, w, &problem["w"]);
    set(&mut t.runtime, b, &problem["b"]);
    for s in 0..10 {
        let mut total = 0.0;
        for half in 0..2 {
            t.runtime.set(x, &xs[half * 9..half * 9 + 9]).unwrap();
            t.runtime.set(y, &ys[half * 6..half * 6 + 6]).unwrap();
            total += t.step(0.05).unwrap();
            assert_eq!(t.steps, s + half);
        }
        let what = format!("accumulated step {s}");
        assert_close(
            &what,
            &[total / 2.0],
            &[floats(&case["loss"])[s]],
            1e-5,
            1e-5,
        );
        assert_close(
            &what,
            &t.state_value(w).unwrap(),
            &floats(&case["w"][s]),
            1e-5,
            1e-5,
        );
        assert_close(
            &what,
            &t.state_value(b).unwrap(),
            &floats(&case["b"][s]),
            1e-5,
            1e-5,
        );
    }
}

#[test]
fn gradient_accumulation_matches_full_batch_pytorch() {
    check_accumulation(ReferenceBackend, StateMode::InPlace);
    check_accumulation(CpuBackend::with_threads(2), StateMode::InPlace);
}

/// Adam under dynamic loss scaling against `torch.amp.GradScaler`: an overflowing start
/// (skipped steps, backoff) and a growing scale.
fn check_loss_scale<B: Backend>(backend: impl Fn() -> B, mode: StateMode, label: &str) {
    let problem = &fixture()["optim_problem"];
    for (name, case) in fixture()["loss_scale"].as_object().unwrap() {
        let cx = Graph::new();
        let x = input(&cx, "x", &problem["x"]);
        let y = input(&cx, "y", &problem["y"]);
        let w = input(&cx, "w", &problem["w"]);
        let b = input(&cx, "b", &problem["b"]);
        let l = loss::mse(x.matmul(w) + b, y, Reduction::Mean);
        let options = TrainOptions {
            mode,
            loss_scale: Some(LossScale {
                init_scale: case["init_scale"].as_f64().unwrap() as f32,
                growth_interval: case["growth_interval"].as_u64().unwrap() as usize,
                backoff_factor: case["backoff"].as_f64().unwrap() as f32,
                ..LossScale::default()
            }),
            ..TrainOptions::default()
        };
        let step = TrainStep::build(&[w, b], l, &Adam::default(), options);
        let scale = step.scale.unwrap();
        let mut t = Trainer::new(
            cx.compile(backend(), CompileOptions::default()).unwrap(),
            step,
        )
        .unwrap();
        for (tensor, key) in [(x, "x"), (w, "w"), (b, "b")] {
            set(&mut t.runtime, tensor, &problem[key]);
        }
        let factor = case["y_factor"].as_f64().unwrap() as f32;
        let ys: Vec<f32> = floats(&problem["y"]["data"])
            .iter()
            .map(|v| v * factor)
            .collect();
        t.runtime.set(y, &ys).unwrap();
        for s in 0..10 {
            let what = format!("{label} {name} step {s}");
            let got = t.step(0.05).unwrap();
            assert_close(
                &format!("{what} loss"),
                &[got],
                &[floats(&case["loss"])[s]],
                1e-5,
                1e-5,
            );
            assert_close(
                &format!("{what} w"),
                &t.state_value(w).unwrap(),
                &floats(&case["w"][s]),
                1e-5,
                1e-5,
            );
            assert_close(
                &format!("{what} b"),
                &t.state_value(b).unwrap(),
                &floats(&case["b"][s]),
                1e-5,
                1e-5,
            );
            let sc = t.state_value(scale).unwrap();
            assert_eq!(sc[0], floats(&case["scale"])[s], "{what} scale");
        }
    }
}

#[test]
fn loss_scaling_matches_pytorch_grad_scaler() {
    check_loss_scale(|| ReferenceBackend, StateMode::InPlace, "reference");
    check_loss_scale(|| CpuBackend::with_threads(2), StateMode::InPlace, "cpu");
}

/// A gradient scale (clipping's factor, which the trainer hands the optimizer instead of
/// scaling every gradient) gives the update of the explicitly scaled gradients, for every
/// optimizer and its weight-decay forms (the scale is folded into their scalar factors).
#[test]
fn a_folded_gradient_scale_equals_scaling_the_gradients() {
    let optimizers: Vec<(&str, Box<dyn Optimizer>)> = vec![
        ("sgd", Box::new(Sgd::default())),
        (
            "sgd_nesterov_wd",
            Box::new(Sgd {
                momentum: 0.9,
                nesterov: true,
                weight_decay: 0.01,
            }),
        ),
        ("adam", Box::new(Adam::default())),
        (
            "adam_l2",
            Box::new(Adam {
                weight_decay: 0.1,
                ..Adam::default()
            }),
        ),
        ("adamw", Box::new(Adam::adamw())),
        ("rmsprop", Box::new(RmsProp::default())),
        (
            "rmsprop_wd_momentum",
            Box::new(RmsProp {
                weight_decay: 0.05,
                momentum: 0.9,
                ..RmsProp::default()
            }),
        ),
        (
            "lion",
            Box::new(Lion {
                weight_decay: 0.1,
                ..Lion::default()
            }),
        ),
    ];
    let n = 37;
    let vals = |seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104729) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    };
    for (name, opt) in &optimizers {
        // The updates after one step, the gradients scaled first or the scale folded in.
        let run = |fold: bool| -> Vec<Vec<f32>> {
            let cx = Graph::new();
            let p = cx.tensor("p", n);
            let g = cx.tensor("g", n);
            let f = cx.tensor("f", ());
            let lr = cx.tensor("lr", ());
            let step = cx.tensor("step", ());
            let updates = if fold {
                let inputs = OptimizerInputs {
                    lr,
                    step,
                    grad_scale: Some(f),
                };
                opt.build(&[p], &[g], inputs)
            } else {
                let scaled = g * f.expand_to(vec![n]);
                opt.build(&[p], &[scaled], OptimizerInputs::new(lr, step))
            };
            let outs: Vec<_> = updates.iter().map(|u| u.next.output()).collect();
            let mut rt = cx
                .compile(CpuBackend::with_threads(2), CompileOptions::default())
                .unwrap();
            rt.set(p, &vals(1)).unwrap();
            rt.set(g, &vals(2)).unwrap();
            rt.set(f, &[0.37f32]).unwrap();
            rt.set(lr, &[0.01f32]).unwrap();
            rt.set(step, &[3.0f32]).unwrap();
            // State inputs (moments, buffers): positive values (second moments must be).
            for (k, u) in updates.iter().enumerate() {
                if u.state.entry().label != p.entry().label {
                    let s: Vec<f32> = vals(3 + k).iter().map(|x| x.abs() + 0.01).collect();
                    rt.set(u.state, &s).unwrap();
                }
            }
            rt.run().unwrap();
            outs.iter().map(|&o| rt.get::<f32>(o).unwrap()).collect()
        };
        let (explicit, folded) = (run(false), run(true));
        assert_eq!(explicit.len(), folded.len(), "{name}");
        for (i, (a, b)) in explicit.iter().zip(&folded).enumerate() {
            for (j, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                    "{name} update {i} [{j}]: {x} scaled first, {y} folded"
                );
            }
        }
    }
}
