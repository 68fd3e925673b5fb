//! Fine-tuning the last block (`luminal_models::finetune`) against PyTorch
//! (`scripts/gen_finetune_fixtures.py`, `fixtures/finetune_reference.json`): on the tiny
//! Llama and Qwen2 GGUF files, the loss and the gradients of the last block's weights, then
//! the losses of four AdamW steps, on the CPU backend.

mod common;

use common::*;
use luminal::autograd::gradients;
use luminal::prelude::*;
use luminal_cpu::{CpuBackend, QuantDots};
use luminal_models::finetune::LlamaFinetune;
use luminal_training::loss::{cross_entropy, CrossEntropy};
use luminal_training::{Adam, StateMode, TrainOptions, TrainStep, Trainer};
use serde_json::Value;

fn backend() -> CpuBackend {
    CpuBackend::with_threads(2).quant_dots(QuantDots::F32)
}

/// The fixture windows as (inputs, targets), flattened `[2 * seq]`.
fn windows(r: &Value) -> (Vec<i32>, Vec<i32>, usize) {
    let rows: Vec<Vec<i32>> = r["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| ids(row).into_iter().map(|t| t as i32).collect())
        .collect();
    let seq = rows[0].len() - 1;
    let x = rows.iter().flat_map(|r| r[..seq].to_vec()).collect();
    let y = rows.iter().flat_map(|r| r[1..].to_vec()).collect();
    (x, y, seq)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The fixture's model with its last block trainable, for the fixture's two windows: the
/// graph pieces and the windows' (inputs, targets).
struct Setup<'g> {
    ft: LlamaFinetune<'g>,
    targets: GraphTensor<'g>,
    loss: GraphTensor<'g>,
    x: Vec<i32>,
    y: Vec<i32>,
}

fn setup<'g>(cx: &'g Graph, model: &str, r: &Value) -> Setup<'g> {
    let (x, y, seq) = windows(r);
    let (ft, _) = LlamaFinetune::build(cx, fixture(&format!("{model}.gguf")), 2, seq, 1).unwrap();
    let targets = cx.input("targets", 2 * seq, DType::I32);
    let loss = cross_entropy(ft.logits, targets, CrossEntropy::default());
    Setup {
        ft,
        targets,
        loss,
        x,
        y,
    }
}

fn check_gradients(model: &str) {
    let fx = json(fixture("finetune_reference.json"));
    let r = &fx["models"][model];
    let cx = Graph::new();
    let Setup {
        ft,
        targets,
        loss,
        x,
        y,
    } = setup(&cx, model, r);
    let loss = loss.output();
    let grads: Vec<GraphTensor> = gradients(&ft.trainable, loss)
        .into_iter()
        .map(|g| g.output())
        .collect();
    let mut rt = cx.compile(backend(), CompileOptions::default()).unwrap();
    ft.load_weights(&mut rt).unwrap();
    rt.set(ft.tokens, &x).unwrap();
    rt.set(targets, &y).unwrap();
    rt.run().unwrap();
    let got_loss = rt.get::<f32>(loss).unwrap()[0];
    let want_loss = r["loss"].as_f64().unwrap() as f32;
    assert!(
        (got_loss - want_loss).abs() < 1e-4 * want_loss,
        "{model}: loss {got_loss} vs PyTorch {want_loss}"
    );
    let want = r["grads"].as_object().unwrap();
    let mut checked = 0;
    for (p, g) in ft.trainable.iter().zip(&grads) {
        let name = luminal_nn::parameter_name(*p);
        let Some(w) = want.get(&name) else { continue };
        let (got, w) = (rt.get::<f32>(*g).unwrap(), floats(w));
        assert_eq!(got.len(), w.len(), "{model}: {name}");
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(&w)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        println!("{model} {name}: max |Δgrad| {err:e} (max |grad| {scale:e})");
        assert!(
            err <= 2e-5 * scale + 1e-7,
            "{model}: gradient of {name} off by {err} (largest {scale})"
        );
        checked += 1;
    }
    assert_eq!(
        checked,
        want.len(),
        "{model}: every reference gradient compared"
    );
}

fn check_adamw(model: &str) {
    let fx = json(fixture("finetune_reference.json"));
    let r = &fx["models"][model];
    let cx = Graph::new();
    let Setup {
        ft,
        targets,
        loss,
        x,
        y,
    } = setup(&cx, model, r);
    let opts = TrainOptions {
        mode: StateMode::InPlace,
        ..TrainOptions::default()
    };
    let step = TrainStep::build(&ft.trainable, loss, &Adam::adamw(), opts);
    let rt = cx.compile(backend(), CompileOptions::default()).unwrap();
    let mut t = Trainer::new(rt, step).unwrap();
    ft.load_weights(&mut t.runtime).unwrap();
    t.runtime.set(ft.tokens, &x).unwrap();
    t.runtime.set(targets, &y).unwrap();
    let lr = r["adamw_lr"].as_f64().unwrap() as f32;
    let want = floats(&r["adamw_losses"]);
    let got: Vec<f32> = (0..want.len()).map(|_| t.step(lr).unwrap()).collect();
    println!("{model}: AdamW losses {got:?}, PyTorch {want:?}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() < 1e-4 * w.abs().max(1.0),
            "{model}: loss before AdamW step {i}: {g} vs PyTorch {w}"
        );
    }
    assert!(
        got[want.len() - 1] < got[0] / 2.0,
        "{model}: the loss went down"
    );
}

#[test]
fn tiny_llama_last_block_gradients_match_pytorch() {
    check_gradients("tiny-llama");
}

#[test]
fn tiny_qwen2_last_block_gradients_match_pytorch() {
    check_gradients("tiny-qwen2");
}

#[test]
fn tiny_llama_adamw_steps_match_pytorch() {
    check_adamw("tiny-llama");
}

#[test]
fn tiny_qwen2_adamw_steps_match_pytorch() {
    check_adamw("tiny-qwen2");
}

#[test]
fn bad_requests_are_errors() {
    let cx = Graph::new();
    let path = fixture("tiny-llama.gguf");
    assert!(
        LlamaFinetune::build(&cx, &path, 1, 8, 3).is_err(),
        "3 of 2 blocks"
    );
    assert!(
        LlamaFinetune::build(&cx, &path, 0, 8, 1).is_err(),
        "empty batch"
    );
    assert!(
        LlamaFinetune::build(&cx, &path, 1, 100_000, 1).is_err(),
        "past the context"
    );
    assert!(LlamaFinetune::build(&cx, fixture("missing.gguf"), 1, 8, 1).is_err());
}
