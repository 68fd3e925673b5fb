//! The error model: building a wrong training graph panics naming the op and the shapes;
//! bad data (files, checkpoints) is a typed error.

use luminal::prelude::*;
use luminal_training::loss::{self, CrossEntropy, Reduction};
use luminal_training::*;

#[test]
#[should_panic(expected = "mse: input shape [3] and target shape [4] differ")]
fn loss_shape_mismatch_panics_with_both_shapes() {
    let cx = Graph::new();
    loss::mse(cx.tensor("a", 3), cx.tensor("b", 4), Reduction::Mean);
}

#[test]
#[should_panic(expected = "cross_entropy: labels must be I32")]
fn float_labels_panic() {
    let cx = Graph::new();
    loss::cross_entropy(
        cx.tensor("x", (2, 3)),
        cx.tensor("y", 2),
        CrossEntropy::default(),
    );
}

#[test]
#[should_panic(expected = "Sgd: 1 parameters but 2 gradients")]
fn optimizer_with_mismatched_gradients_panics() {
    let cx = Graph::new();
    let w = cx.tensor("w", 2);
    let inputs = OptimizerInputs::new(cx.tensor("lr", ()), cx.tensor("step", ()));
    Sgd::default().build(&[w], &[w, w], inputs);
}

#[test]
#[should_panic(expected = "Autograd: parameter")]
fn gradient_with_respect_to_a_view_panics() {
    let cx = Graph::new();
    let w = cx.tensor("w", (2, 3));
    let t = w.permute(&[1, 0]);
    luminal::autograd::gradients(&[t], t.sum([0, 1]));
}

#[test]
fn checkpoint_errors_are_typed() {
    let dir = std::env::temp_dir().join(format!("luminal_ckpt_err_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cx = Graph::new();
    let w = cx.tensor("w", 3);
    let step = TrainStep::build(
        &[w],
        (w * w).sum(0),
        &Adam::default(),
        TrainOptions::default(),
    );
    let rt = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    let mut t = Trainer::new(rt, step).unwrap();
    // Nothing to save before the first step; a missing file is an I/O error.
    assert!(matches!(
        t.save(dir.join("a.safetensors")),
        Err(TrainingError::NoStepYet)
    ));
    assert!(matches!(
        t.load(dir.join("missing.safetensors")),
        Err(TrainingError::Io(_))
    ));
    // A checkpoint of another model (no tensor named "w.adam.m") is a checkpoint error.
    let other = Graph::new();
    let v = other.tensor("v", 3);
    let ostep = TrainStep::build(
        &[v],
        (v * v).sum(0),
        &Sgd::default(),
        TrainOptions::default(),
    );
    let mut o = Trainer::new(
        other
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap(),
        ostep,
    )
    .unwrap();
    o.runtime.set(v, &[1f32, 2., 3.]).unwrap();
    o.step(0.1).unwrap();
    o.save(dir.join("other.safetensors")).unwrap();
    let err = t.load(dir.join("other.safetensors")).unwrap_err();
    assert!(
        matches!(err, TrainingError::Checkpoint(ref m) if m.contains("missing tensor")),
        "{err}"
    );
    // Running before the parameters are set is a typed runtime error.
    assert!(matches!(
        t.step(0.1),
        Err(TrainingError::Runtime(LuminalError::MissingInput(_)))
    ));
    std::fs::remove_dir_all(&dir).ok();
}
