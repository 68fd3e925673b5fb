//! Behavioural tests: on the CPU backend the digits MLP (64-128-10, Adam, batch 64) reaches
//! at least 95% test accuracy within 600 steps, and the CNN (conv 16, conv 32, linear) 97%
//! within 400. Needs models/digits.csv
//! (`scripts/fetch-digits.sh`, which CI runs); skips with a message when it is absent.

use luminal_cpu::CpuBackend;
use luminal_training::data::Digits;
use luminal_training::digits::{train_mlp, Arch, MlpConfig};
use std::path::PathBuf;

#[test]
fn digits_mlp_reaches_95_percent() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/digits.csv");
    if !path.exists() {
        eprintln!(
            "skipping: {} is missing (run scripts/fetch-digits.sh)",
            path.display()
        );
        return;
    }
    let data = Digits::load(&path).unwrap();
    assert_eq!(data.len(), 1797);
    let (train, test) = data.split(0.2, 0);
    let config = MlpConfig {
        steps: 600,
        ..MlpConfig::default()
    };
    let mut losses = vec![];
    let report = train_mlp(
        || CpuBackend::with_threads(2),
        &train,
        &test,
        &config,
        &mut |_, l| losses.push(l),
    )
    .unwrap();
    assert!(losses[0] > 2.0, "initial loss {} (ln 10 = 2.30)", losses[0]);
    assert!(report.final_loss < 0.2, "final loss {}", report.final_loss);
    assert!(
        report.test_accuracy >= 0.95,
        "test accuracy {}",
        report.test_accuracy
    );
}

#[test]
fn malformed_digits_file_is_a_typed_error() {
    let dir = std::env::temp_dir().join(format!("luminal_digits_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "1,2,3\n").unwrap();
    let err = Digits::load(&bad).unwrap_err().to_string();
    assert!(err.contains("expected 65 fields"), "{err}");
    let missing = Digits::load(dir.join("nope.csv")).unwrap_err().to_string();
    assert!(missing.contains("I/O"), "{missing}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn digits_cnn_reaches_97_percent() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/digits.csv");
    if !path.exists() {
        eprintln!(
            "skipping: {} is missing (run scripts/fetch-digits.sh)",
            path.display()
        );
        return;
    }
    let (train, test) = Digits::load(&path).unwrap().split(0.2, 0);
    let config = MlpConfig {
        arch: Arch::Cnn,
        steps: 400,
        ..MlpConfig::default()
    };
    let report = train_mlp(
        || CpuBackend::with_threads(2),
        &train,
        &test,
        &config,
        &mut |_, _| {},
    )
    .unwrap();
    assert!(
        report.test_accuracy >= 0.97,
        "test accuracy {}",
        report.test_accuracy
    );
}

#[test]
fn digits_mlp_in_bf16_with_loss_scaling_reaches_95_percent() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/digits.csv");
    if !path.exists() {
        eprintln!(
            "skipping: {} is missing (run scripts/fetch-digits.sh)",
            path.display()
        );
        return;
    }
    let (train, test) = Digits::load(&path).unwrap().split(0.2, 0);
    let config = MlpConfig {
        half: Some(luminal::prelude::DType::BF16),
        ..MlpConfig::default()
    };
    let report = train_mlp(
        || CpuBackend::with_threads(2),
        &train,
        &test,
        &config,
        &mut |_, _| {},
    )
    .unwrap();
    assert!(
        report.test_accuracy >= 0.95,
        "test accuracy {}",
        report.test_accuracy
    );
}
