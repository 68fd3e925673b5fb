//! Trains a classifier on scikit-learn's `digits` (8x8 images, 10 classes) and prints the
//! test accuracy.
//!
//! ```bash
//! cargo run --release --example digits -- mlp [--steps 600] [--threads 2] [--backend cpu|reference]
//! cargo run --release --example digits -- cnn
//! cargo run --release --example digits -- mlp --bf16    # mixed precision, dynamic loss scaling
//! ```
//!
//! The data (models/digits.csv, git-ignored) is fetched by `scripts/fetch-digits.sh` from the
//! scikit-learn wheel on PyPI on first use. 80/20 seeded train/test split, batch 64, Adam
//! (lr 3e-3); `mlp` is 64-128-10, `cnn` is conv 16 → conv 32 (stride 2) → linear.

use indicatif::{ProgressBar, ProgressStyle};
use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_training::data::Digits;
use luminal_training::digits::{train_mlp, Arch, MlpConfig};
use luminal_training::StateMode;
use std::path::PathBuf;
use std::process::Command;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn digits_csv() -> Result<PathBuf, String> {
    let path = repo_root().join("models/digits.csv");
    if path.exists() {
        return Ok(path);
    }
    eprintln!("models/digits.csv is missing: running scripts/fetch-digits.sh");
    let status = Command::new("bash")
        .arg(repo_root().join("scripts/fetch-digits.sh"))
        .status()
        .map_err(|e| format!("cannot run scripts/fetch-digits.sh: {e}"))?;
    if !status.success() || !path.exists() {
        return Err(format!("scripts/fetch-digits.sh failed ({status})"));
    }
    Ok(path)
}

fn usage() -> ! {
    eprintln!("usage: digits mlp|cnn [--steps N] [--threads N] [--backend cpu|reference] [--bf16]");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arch = match args.first().map(String::as_str) {
        Some("mlp") => Arch::Mlp,
        Some("cnn") => Arch::Cnn,
        _ => usage(),
    };
    let mut config = MlpConfig {
        arch,
        ..MlpConfig::default()
    };
    let (mut threads, mut backend) = (2usize, "cpu".to_string());
    let mut it = args[1..].iter();
    while let Some(flag) = it.next() {
        if flag == "--bf16" {
            config.half = Some(DType::BF16);
            continue;
        }
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--steps" => config.steps = value.parse().unwrap_or_else(|_| usage()),
            "--threads" => threads = value.parse().unwrap_or_else(|_| usage()),
            "--backend" => backend = value.clone(),
            _ => usage(),
        }
    }
    let data = match digits_csv().and_then(|p| Digits::load(p).map_err(|e| e.to_string())) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let (train, test) = data.split(0.2, 0);
    eprintln!(
        "digits: {} train / {} test images, {:?}, batch {}, Adam lr {}, {} steps, {backend} backend",
        train.len(),
        test.len(),
        config.arch,
        config.batch,
        config.lr,
        config.steps
    );
    let bar = ProgressBar::new(config.steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {per_sec} {msg}")
            .expect("valid template"),
    );
    let mut on_step = |_: usize, loss: f32| {
        bar.inc(1);
        bar.set_message(format!("loss {loss:.4}"));
    };
    let report = match backend.as_str() {
        "cpu" => train_mlp(
            || CpuBackend::with_threads(threads),
            &train,
            &test,
            &config,
            &mut on_step,
        ),
        "reference" => {
            config.mode = StateMode::InPlace;
            train_mlp(|| ReferenceBackend, &train, &test, &config, &mut on_step)
        }
        _ => usage(),
    };
    bar.finish();
    match report {
        Ok(r) => {
            eprintln!(
                "final loss {:.4}, {:.1} µs/step",
                r.final_loss,
                r.step_time.as_secs_f64() * 1e6
            );
            println!("test accuracy {:.4}", r.test_accuracy);
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
