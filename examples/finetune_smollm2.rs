//! Fine-tunes the last blocks of SmolLM2 (or any Llama-family GGUF) on a text file.
//!
//! ```bash
//! ./scripts/fetch-models.sh
//! cargo run --release -p luminal_training --example finetune_smollm2 -- \
//!     [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--file F] [--steps 40] \
//!     [--seq 64] [--batch 2] [--train-last 2] [--lr 2e-4] [--threads 2]
//! ```
//!
//! The text is tokenized and cut into windows of `seq + 1` tokens; the last tenth of them is
//! held out. The frozen blocks stay in the file's quantized storage; the last `--train-last`
//! blocks and the final norm are f32 parameters trained with AdamW (next-token
//! cross-entropy, gradient clipping at 1.0, linear warm-up then cosine decay) on the CPU
//! backend. Prints the held-out loss before and after, and the training loss as it goes.
//! Without `--file` it trains on the repository's README.

use indicatif::{ProgressBar, ProgressStyle};
use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_models::finetune::LlamaFinetune;
use luminal_training::loss::{cross_entropy, CrossEntropy};
use luminal_training::{Adam, Schedule, StateMode, TrainOptions, TrainStep, Trainer, WarmupCosine};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut model = format!("{root}/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut file = format!("{root}/README.md");
    let (mut steps, mut seq, mut batch, mut train_last, mut lr, mut threads) =
        (40usize, 64usize, 2usize, 2usize, 2e-4f32, 2usize);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--model" => model = v.clone(),
            "--file" => file = v.clone(),
            "--steps" => steps = v.parse()?,
            "--seq" => seq = v.parse()?,
            "--batch" => batch = v.parse()?,
            "--train-last" => train_last = v.parse()?,
            "--lr" => lr = v.parse()?,
            "--threads" => threads = v.parse()?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    if !std::path::Path::new(&model).exists() {
        return Err(format!("{model} not found: run ./scripts/fetch-models.sh first").into());
    }
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;

    // Training graph: forward, cross-entropy on the next token, AdamW on the last blocks.
    let cx = Graph::new();
    let (ft, tokenizer) = LlamaFinetune::build(&cx, &model, batch, seq, train_last)?;
    let ids = tokenizer.encode(&text, false)?;
    let windows: Vec<&[u32]> = ids.chunks_exact(seq + 1).collect();
    let held_out = (windows.len() / 10).max(1);
    if windows.len() < held_out + batch {
        return Err(format!(
            "{file} has {} tokens: too short for windows of {} tokens",
            ids.len(),
            seq + 1
        )
        .into());
    }
    let (train, test) = windows.split_at(windows.len() - held_out);
    let targets = cx.input("targets", batch * seq, DType::I32);
    let loss = cross_entropy(ft.logits, targets, CrossEntropy::default());
    let n_trained: usize = ft.trainable.iter().map(|t| numel(*t)).sum();
    let options = TrainOptions {
        mode: StateMode::InPlace,
        clip_grad_norm: Some(1.0),
        ..TrainOptions::default()
    };
    let step = TrainStep::build(&ft.trainable, loss, &Adam::adamw(), options);
    let t0 = Instant::now();
    let rt = cx.compile(CpuBackend::with_threads(threads), CompileOptions::default())?;
    let mut trainer = Trainer::new(rt, step)?;
    ft.load_weights(&mut trainer.runtime)?;
    eprintln!(
        "{}: {} layers, training the last {train_last} ({n_trained} parameters); {} tokens → \
         {} training and {} held-out windows of {seq}; compiled and loaded in {:.1} s",
        model.rsplit('/').next().unwrap_or(&model),
        ft.config.n_layers,
        ids.len(),
        train.len(),
        test.len(),
        t0.elapsed().as_secs_f64()
    );

    // Evaluation graph: the same forward with batch 1 and the loss as an output.
    let ecx = Graph::new();
    let (eft, _) = LlamaFinetune::build(&ecx, &model, 1, seq, train_last)?;
    let etargets = ecx.input("targets", seq, DType::I32);
    let eloss = cross_entropy(eft.logits, etargets, CrossEntropy::default()).output();
    let mut eval = ecx.compile(CpuBackend::with_threads(threads), CompileOptions::default())?;
    eft.load_weights(&mut eval)?;
    let held_out_loss = |eval: &mut luminal_cpu::CpuRuntime| -> Result<f32, LuminalError> {
        let mut total = 0.0;
        for w in test {
            let x: Vec<i32> = w[..seq].iter().map(|&t| t as i32).collect();
            let y: Vec<i32> = w[1..].iter().map(|&t| t as i32).collect();
            eval.set(eft.tokens, &x)?;
            eval.set(etargets, &y)?;
            eval.run()?;
            total += eval.get::<f32>(eloss)?[0];
        }
        Ok(total / test.len() as f32)
    };
    let before = held_out_loss(&mut eval)?;
    eprintln!("held-out loss before: {before:.4}");

    let schedule = WarmupCosine {
        lr,
        min_lr: lr / 10.0,
        start_factor: 0.1,
        warmup: steps / 10,
        total: steps.max(2),
    };
    let mut rng = StdRng::seed_from_u64(0);
    let mut order: Vec<usize> = (0..train.len()).collect();
    let (mut xb, mut yb) = (vec![0i32; batch * seq], vec![0i32; batch * seq]);
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").expect("template"));
    let start = Instant::now();
    let mut first = f32::NAN;
    let mut last = f32::NAN;
    let mut next = order.len();
    for s in 0..steps {
        for b in 0..batch {
            if next == order.len() {
                order.shuffle(&mut rng);
                next = 0;
            }
            let w = train[order[next]];
            next += 1;
            for i in 0..seq {
                xb[b * seq + i] = w[i] as i32;
                yb[b * seq + i] = w[i + 1] as i32;
            }
        }
        trainer.runtime.set(ft.tokens, &xb)?;
        trainer.runtime.set(targets, &yb)?;
        last = trainer.step(schedule.lr(s))?;
        if s == 0 {
            first = last;
        }
        let tok_s = ((s + 1) * batch * seq) as f64 / start.elapsed().as_secs_f64();
        bar.set_message(format!("loss {last:.3}  {tok_s:.0} tok/s"));
        bar.inc(1);
        if s % 10 == 0 || s + 1 == steps {
            bar.suspend(|| eprintln!("step {s:>4}  loss {last:.4}"));
        }
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "training loss {first:.4} → {last:.4}; {:.0} ms/step, {:.0} tokens/s",
        secs * 1e3 / steps.max(1) as f64,
        (steps * batch * seq) as f64 / secs
    );

    // The trained weights into the evaluation runtime.
    for (p, e) in ft.trainable.iter().zip(&eft.trainable) {
        eval.set(*e, &trainer.state_value(*p)?)?;
    }
    let after = held_out_loss(&mut eval)?;
    println!("held-out loss {before:.4} → {after:.4}");
    Ok(())
}

fn numel(t: GraphTensor) -> usize {
    t.shape()
        .iter()
        .map(|d| d.as_constant().unwrap_or(0) as usize)
        .product()
}
