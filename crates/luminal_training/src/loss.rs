//! Loss functions, built from hl_ops (so they are differentiable and run on every backend).
//! Names, arguments and reductions follow `torch.nn.functional`.

use luminal::prelude::*;

/// How per-element losses are combined (PyTorch's `reduction=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The mean over elements (or over non-ignored targets for the classification losses).
    #[default]
    Mean,
    Sum,
    /// Per-element losses, shaped like the input (like the target for classification).
    None,
}

fn all_axes(t: GraphTensor) -> Vec<i64> {
    (0..t.rank() as i64).collect()
}

fn reduce<'g>(per_element: GraphTensor<'g>, reduction: Reduction) -> GraphTensor<'g> {
    match reduction {
        Reduction::Mean if per_element.rank() > 0 => per_element.mean(all_axes(per_element)),
        Reduction::Sum if per_element.rank() > 0 => per_element.sum(all_axes(per_element)),
        _ => per_element,
    }
}

fn same_shape(op: &str, a: GraphTensor, b: GraphTensor) {
    assert_eq!(
        a.shape(),
        b.shape(),
        "{op}: input shape {:?} and target shape {:?} differ",
        a.shape(),
        b.shape()
    );
}

/// `cond ? a : b` for finite `a` and `b`, as arithmetic: unlike `select` (a gather, whose
/// gradient is a scatter-add over the whole table) its gradient is elementwise.
fn blend<'g>(cond: GraphTensor<'g>, a: GraphTensor<'g>, b: GraphTensor<'g>) -> GraphTensor<'g> {
    let m = cond.cast(a.dtype());
    m * a + (1.0 - m) * b
}

/// Mean squared error `(input - target)²` (`F.mse_loss`).
pub fn mse<'g>(
    input: GraphTensor<'g>,
    target: GraphTensor<'g>,
    reduction: Reduction,
) -> GraphTensor<'g> {
    same_shape("mse", input, target);
    reduce((input - target).square(), reduction)
}

/// Mean absolute error `|input - target|` (`F.l1_loss`).
pub fn l1<'g>(
    input: GraphTensor<'g>,
    target: GraphTensor<'g>,
    reduction: Reduction,
) -> GraphTensor<'g> {
    same_shape("l1", input, target);
    reduce((input - target).abs(), reduction)
}

/// Huber loss (`F.huber_loss`): `0.5 d²` where `|d| < delta`, else `delta (|d| - 0.5 delta)`.
pub fn huber<'g>(
    input: GraphTensor<'g>,
    target: GraphTensor<'g>,
    delta: f32,
    reduction: Reduction,
) -> GraphTensor<'g> {
    same_shape("huber", input, target);
    assert!(delta > 0.0, "huber: delta must be > 0, got {delta}");
    let d = (input - target).abs();
    let quadratic = d.square() * 0.5;
    let linear = (d - 0.5 * delta) * delta;
    reduce(blend(d.lt(delta), quadratic, linear), reduction)
}

/// Smooth L1 loss (`F.smooth_l1_loss`): Huber divided by `beta`.
pub fn smooth_l1<'g>(
    input: GraphTensor<'g>,
    target: GraphTensor<'g>,
    beta: f32,
    reduction: Reduction,
) -> GraphTensor<'g> {
    same_shape("smooth_l1", input, target);
    assert!(beta > 0.0, "smooth_l1: beta must be > 0, got {beta}");
    let d = (input - target).abs();
    let quadratic = d.square() * (0.5 / beta);
    let linear = d - 0.5 * beta;
    reduce(blend(d.lt(beta), quadratic, linear), reduction)
}

/// Options of [`cross_entropy`] (PyTorch's defaults).
#[derive(Clone, Copy, Debug)]
pub struct CrossEntropy {
    /// Targets equal to this contribute nothing and are not counted in the mean.
    pub ignore_index: i32,
    /// Mixes the one-hot target with the uniform distribution: `(1 - ε) y + ε / C`.
    pub label_smoothing: f32,
    pub reduction: Reduction,
}

impl Default for CrossEntropy {
    fn default() -> Self {
        CrossEntropy {
            ignore_index: -100,
            label_smoothing: 0.0,
            reduction: Reduction::Mean,
        }
    }
}

fn check_classification(op: &str, scores: GraphTensor, labels: GraphTensor) {
    assert_eq!(
        labels.dtype(),
        DType::I32,
        "{op}: labels must be I32, got {} with shape {:?}",
        labels.dtype(),
        labels.shape()
    );
    let s = scores.shape();
    assert!(
        s.len() == 2 && labels.shape() == vec![s[0].clone()],
        "{op}: needs scores [N, C] and labels [N], got shapes {s:?} and {:?}",
        labels.shape()
    );
}

/// The class count `C` of `scores [N, C]`, which must be static.
fn static_classes(op: &str, scores: GraphTensor<'_>) -> usize {
    scores.shape()[1].as_constant().unwrap_or_else(|| {
        panic!(
            "{op}: the class count must be static, got shape {:?}",
            scores.shape()
        )
    }) as usize
}

/// Per-row negative log-likelihood of `log_probs [N, C]` at `labels [N]`, times the row's
/// weight (0 for ignored rows), and that weight.
fn nll_rows<'g>(
    log_probs: GraphTensor<'g>,
    labels: GraphTensor<'g>,
    ignore_index: i32,
) -> (GraphTensor<'g>, GraphTensor<'g>) {
    let classes = static_classes("nll", log_probs);
    // An ignored label (any id outside 0..C) one-hot encodes to a row of zeros.
    let picked = (log_probs * one_hot_f32(labels, classes)).sum(1);
    let valid = not_ignored_f32(labels, ignore_index);
    (-picked * valid, valid)
}

/// `labels != ignore_index` as 1.0 / 0.0, by a float comparison, `(label − ignore)² ≥ 1/4`:
/// the same values for labels and index of magnitude below 2²⁴, in one fused elementwise
/// loop (an integer `ne` is two integer comparison kernels on backends whose integer
/// comparisons are not fused: 44 µs of the tiny GPT's 6 ms step on the CPU).
fn not_ignored_f32(labels: GraphTensor<'_>, ignore_index: i32) -> GraphTensor<'_> {
    let d = labels.cast(DType::F32) - ignore_index as f32;
    1.0 - (d * d).lt(0.25).cast(DType::F32)
}

/// `labels.one_hot(classes)` by a float comparison, `(label - class)² < 1/4`: the same
/// values for labels of magnitude below 2²⁴, in one fused elementwise loop on backends whose
/// integer comparisons are not.
fn one_hot_f32<'g>(labels: GraphTensor<'g>, classes: usize) -> GraphTensor<'g> {
    let n = labels.shape()[0].clone();
    let shape = vec![n, Expression::from(classes)];
    let l = labels
        .cast(DType::F32)
        .unsqueeze(1)
        .expand_to(shape.clone());
    // −class negated before it is broadcast (a subtraction of the broadcast classes made
    // the backend materialise the negated `[N, C]` grid).
    let neg_c = (labels.graph.arange(classes) * -1.0)
        .unsqueeze(0)
        .expand_to(shape);
    let d = l + neg_c;
    (d * d).lt(0.25).cast(DType::F32)
}

fn reduce_rows<'g>(
    per_row: GraphTensor<'g>,
    valid: GraphTensor<'g>,
    reduction: Reduction,
) -> GraphTensor<'g> {
    match reduction {
        Reduction::Mean => per_row.sum(0) / valid.sum(0),
        Reduction::Sum => per_row.sum(0),
        Reduction::None => per_row,
    }
}

/// Cross-entropy of `logits [N, C]` against integer `labels [N]` (`F.cross_entropy`), with
/// label smoothing and an ignore index. The mean is over non-ignored rows.
pub fn cross_entropy<'g>(
    logits: GraphTensor<'g>,
    labels: GraphTensor<'g>,
    options: CrossEntropy,
) -> GraphTensor<'g> {
    check_classification("cross_entropy", logits, labels);
    assert!(
        (0.0..=1.0).contains(&options.label_smoothing),
        "cross_entropy: label_smoothing must be in [0, 1], got {}",
        options.label_smoothing
    );
    // From the logits directly, as `lse − x[label]` (lse = log Σ e^x, through the detached
    // row max): the same values as `nll(log_softmax(x))`, without evaluating the log-sum
    // for every element of a row (`log_softmax`'s `shifted − log Σ`, then one-hot sums).
    let c = static_classes("cross_entropy", logits);
    let shifted = logits
        - logits
            .max(1)
            .detach()
            .unsqueeze(1)
            .expand_to(logits.shape());
    let lse = shifted.exp().sum(1).log();
    // Labels outside 0..C one-hot encode to zeros: ignored rows (their weight is 0 below).
    let picked = (shifted * one_hot_f32(labels, c)).sum(1);
    let valid = not_ignored_f32(labels, options.ignore_index);
    let eps = options.label_smoothing;
    let mut per_row = lse - picked;
    if eps > 0.0 {
        // The uniform part: −mean_j log p_j = lse − mean_j shifted_j.
        per_row = per_row * (1.0 - eps) + (lse - shifted.mean(1)) * eps;
    }
    reduce_rows(per_row * valid, valid, options.reduction)
}

/// Negative log-likelihood of `log_probs [N, C]` at `labels [N]` (`F.nll_loss`).
pub fn nll<'g>(
    log_probs: GraphTensor<'g>,
    labels: GraphTensor<'g>,
    ignore_index: i32,
    reduction: Reduction,
) -> GraphTensor<'g> {
    check_classification("nll", log_probs, labels);
    let (per_row, valid) = nll_rows(log_probs, labels, ignore_index);
    reduce_rows(per_row, valid, reduction)
}

/// Binary cross-entropy on logits (`F.binary_cross_entropy_with_logits`), in the stable
/// form `max(x, 0) - x y + log(1 + e^{-|x|})`.
pub fn bce_with_logits<'g>(
    logits: GraphTensor<'g>,
    targets: GraphTensor<'g>,
    reduction: Reduction,
) -> GraphTensor<'g> {
    same_shape("bce_with_logits", logits, targets);
    let per = logits.relu() - logits * targets + ((-logits.abs()).exp() + 1.0).ln();
    reduce(per, reduction)
}

/// How [`kl_div`] reduces (PyTorch's `reduction=` for `F.kl_div`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KlReduction {
    /// Sum divided by the batch size (the mathematically correct KL; PyTorch recommends it).
    #[default]
    BatchMean,
    Mean,
    Sum,
    None,
}

/// `KL(target ‖ input)` with `input` given as log-probabilities and `target` as
/// probabilities (`F.kl_div(input, target)`): `target (log target - input)`, 0 where
/// `target` is 0.
pub fn kl_div<'g>(
    input: GraphTensor<'g>,
    target: GraphTensor<'g>,
    reduction: KlReduction,
) -> GraphTensor<'g> {
    same_shape("kl_div", input, target);
    let positive = target.gt(0.0);
    // log of a clamped target keeps the unused branch finite (0 · log 0 would be NaN).
    let log_t = target.maximum(f32::MIN_POSITIVE).ln();
    let per = positive.cast(DType::F32) * target * (log_t - input);
    match reduction {
        KlReduction::BatchMean => {
            let n = input.shape()[0].clone();
            per.sum(all_axes(per)) / input.graph.constant_expr(n, DType::F32)
        }
        KlReduction::Mean => reduce(per, Reduction::Mean),
        KlReduction::Sum => reduce(per, Reduction::Sum),
        KlReduction::None => per,
    }
}
