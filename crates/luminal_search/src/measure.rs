//! Extraction by measurement: candidates are compiled on the real backend, run on inputs of
//! the real shapes, checked against the reference runtime, and timed (warm-up, repeats
//! interleaved across candidates so that load on the machine hits them alike, median).

use luminal::graph::{GraphData, NodeId, TensorId, TensorRef};
use luminal::op::Op;
use luminal::{
    Backend, CompileOptions, DType, FusedTerm, HostData, ReferenceBackend, Runtime, SharedBytes,
    Tunable,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A plan to try: a graph (the source graph, or one rebuilt from extracted terms) and a
/// backend schedule.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Which graph variant (`"source"`, `"extracted"`, …).
    pub variant: String,
    pub graph: GraphData,
    /// Nodes of `graph` the backend is to compute with its fused terms.
    pub terms: Vec<FusedTerm>,
    pub schedule: String,
    /// Cost-model estimate of the graph (lower is better).
    pub cost: f64,
}

/// What happened to one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Outputs matched the reference; `median` of the timed runs.
    Timed { median: Duration, runs: usize },
    /// Outputs differ from the reference (or the candidate failed to compile or run).
    Rejected(String),
    /// The budget ran out before it was tried.
    NotTried,
}

#[derive(Clone, Debug)]
pub struct CandidateReport {
    pub variant: String,
    pub schedule: String,
    pub cost: f64,
    /// Largest error against the reference, in units of the tolerance (≤ 1 passes).
    pub error: Option<f64>,
    pub outcome: Outcome,
    /// For a candidate that beat the backend's own plan: whether it beat it again head to
    /// head (`false`: it is not chosen).
    pub confirmed: Option<bool>,
}

/// Input values for a timing run: uniform in [-1, 1) for floats, 0 for integers and
/// booleans (valid gather indices), and random blocks with finite scales for quantized data.
pub fn make_inputs(
    g: &GraphData,
    dims: &HashMap<String, i64>,
) -> Result<Vec<(TensorRef, HostData)>, String> {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut out = vec![];
    for id in g.node_ids() {
        let node = g.node(id);
        let Op::Input { name } = &node.op else {
            continue;
        };
        let Some(t) = whole_handle(g, id) else {
            continue;
        };
        let mut n = 1usize;
        for d in &node.shape {
            let v = d.eval_with(&|k| dims.get(k).copied()).map_err(|_| {
                format!("input '{name}' has dim {d}: give its value in SearchBudget::dims")
            })?;
            n *= v.max(0) as usize;
        }
        let data = if node.dtype.is_quantized() {
            let bytes = node
                .dtype
                .bytes_for(n)
                .ok_or_else(|| format!("input '{name}': {n} values are not whole blocks"))?;
            // Every byte ≤ 0x2b: every f16 scale in the blocks is finite and below 1/16,
            // so the weights are of the size trained weights have. (Scales near 1 give
            // weights near 10: a deep model's activations then grow layer by layer and
            // any change of summation order, such as an online softmax's, moves its
            // outputs past the check's float tolerance.)
            let raw: Vec<u8> = (0..bytes).map(|_| (next() % 0x2c) as u8).collect();
            HostData::from_bytes(node.dtype, SharedBytes::from_vec(raw))
                .map_err(|e| e.to_string())?
        } else if node.dtype.is_float() {
            let v: Vec<f64> = (0..n)
                .map(|_| (next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
                .collect();
            HostData::from_f64(node.dtype, &v)
        } else {
            HostData::from_f64(node.dtype, &vec![0.0; n])
        };
        out.push((t, data));
    }
    Ok(out)
}

/// A handle to the whole of node `id` (how runtimes are given inputs and read outputs).
fn whole_handle(g: &GraphData, id: NodeId) -> Option<TensorRef> {
    let shape = &g.node(id).shape;
    g.tensors
        .iter()
        .position(|t| t.node == id && t.view.is_contiguous() && t.view.dims() == *shape)
        .map(|i| TensorRef {
            graph_id: g.graph_id,
            id: TensorId(i as u32),
        })
}

/// The graph's outputs that have a whole handle, in node order.
pub fn output_handles(g: &GraphData) -> Vec<(NodeId, TensorRef)> {
    g.outputs
        .iter()
        .filter_map(|&o| whole_handle(g, o).map(|t| (o, t)))
        .collect()
}

/// Runs `g` once on `backend` with `inputs`; returns the runtime and the outputs.
pub fn run_once<B: Backend>(
    backend: &B,
    g: &GraphData,
    inputs: &[(TensorRef, HostData)],
    dims: &HashMap<String, i64>,
    outputs: &[(NodeId, TensorRef)],
) -> Result<(B::Runtime, Vec<HostData>), String> {
    let opts = CompileOptions {
        optimize: false,
        ..CompileOptions::default()
    };
    let rt = backend
        .compile(g.clone(), &opts)
        .map_err(|e| format!("compile: {e}"))?;
    run_compiled(rt, inputs, dims, outputs)
}

/// [`run_once`] of a plan with fused terms (see [`luminal::Tunable::compile_terms`]).
pub fn run_once_terms<B: Tunable>(
    backend: &B,
    g: &GraphData,
    terms: &[FusedTerm],
    inputs: &[(TensorRef, HostData)],
    dims: &HashMap<String, i64>,
    outputs: &[(NodeId, TensorRef)],
) -> Result<(B::Runtime, Vec<HostData>), String> {
    let opts = CompileOptions {
        optimize: false,
        ..CompileOptions::default()
    };
    let rt = backend
        .compile_terms(g.clone(), terms, &opts)
        .map_err(|e| format!("compile: {e}"))?;
    run_compiled(rt, inputs, dims, outputs)
}

fn run_compiled<R: Runtime>(
    mut rt: R,
    inputs: &[(TensorRef, HostData)],
    dims: &HashMap<String, i64>,
    outputs: &[(NodeId, TensorRef)],
) -> Result<(R, Vec<HostData>), String> {
    for (name, &v) in dims {
        rt.set_dim(name, v.max(0) as usize);
    }
    for (t, data) in inputs {
        rt.set_data(*t, data.clone())
            .map_err(|e| format!("set: {e}"))?;
    }
    rt.run().map_err(|e| format!("run: {e}"))?;
    let outs = outputs
        .iter()
        .map(|(_, t)| rt.get_data(*t).map_err(|e| format!("get: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((rt, outs))
}

/// Tolerances by dtype, as the op suite's: `|got - want| <= atol + rtol·|want|`.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (1e-2, 1e-2),
        DType::BF16 => (2e-2, 2e-2),
        DType::F32 => (1e-4, 1e-4),
        _ => (0.0, 0.0),
    }
}

/// Largest error of `got` against `want` in units of the tolerance (≤ 1 passes; ∞ for a
/// NaN or infinity where the reference has none, or a length mismatch).
pub fn error_ratio(got: &HostData, want: &HostData) -> f64 {
    let (g, w) = (got.to_f64(), want.to_f64());
    if g.len() != w.len() || got.dtype() != want.dtype() {
        return f64::INFINITY;
    }
    let (atol, rtol) = tolerance(want.dtype());
    // Large sums carry rounding relative to their inputs, not to the (maybe small) result:
    // scale the absolute tolerance by the output's magnitude.
    let scale = w
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()))
        .max(1.0);
    let mut worst = 0f64;
    for (&a, &b) in g.iter().zip(&w) {
        let r = if b.is_nan() {
            if a.is_nan() {
                0.0
            } else {
                f64::INFINITY
            }
        } else if b.is_infinite() {
            if a == b {
                0.0
            } else {
                f64::INFINITY
            }
        } else if !a.is_finite() {
            f64::INFINITY
        } else {
            let allowed = atol * scale + rtol * b.abs();
            if allowed == 0.0 {
                if a == b {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (a - b).abs() / allowed
            }
        };
        worst = worst.max(r);
    }
    worst
}

/// A candidate whose check run (compile + one run) takes this many times the fastest
/// candidate's is not timed further.
pub const PRUNE_SLOWER: f64 = 4.0;

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Checks every candidate against `reference` (the reference runtime's outputs on `inputs`),
/// then times those that pass, interleaving the candidates round by round until `repeats`
/// rounds or `deadline` (see [`pick`] and the head-to-head check). Candidates past `max_candidates` are not tried. A candidate passes
/// if its error is within tolerance, or — when the first candidate (the backend's own plan)
/// is itself outside tolerance (e.g. int8 activations) — within twice that plan's error.
#[allow(clippy::too_many_arguments)]
pub fn measure<B: Tunable>(
    backend_for: &dyn Fn(&str) -> Option<B>,
    candidates: &[Candidate],
    inputs: &[(TensorRef, HostData)],
    dims: &HashMap<String, i64>,
    reference: &[HostData],
    outputs: &[(NodeId, TensorRef)],
    max_candidates: usize,
    repeats: usize,
    margin: f64,
    deadline: Instant,
    on_step: &mut dyn FnMut(usize),
) -> Vec<CandidateReport> {
    measure_from(
        backend_for,
        candidates,
        inputs,
        dims,
        reference,
        outputs,
        max_candidates,
        repeats,
        margin,
        deadline,
        on_step,
        None,
    )
}

/// [`measure`], with candidate 0 already compiled and run once: `baseline` is its runtime
/// and the seconds that took, when its outputs are the `reference` (a graph too large for
/// the reference runtime is checked against the backend's own plan: running that plan a
/// second time as candidate 0 would cost as much again, seconds for a long attention).
#[allow(clippy::too_many_arguments)]
pub fn measure_from<B: Tunable>(
    backend_for: &dyn Fn(&str) -> Option<B>,
    candidates: &[Candidate],
    inputs: &[(TensorRef, HostData)],
    dims: &HashMap<String, i64>,
    reference: &[HostData],
    outputs: &[(NodeId, TensorRef)],
    max_candidates: usize,
    repeats: usize,
    margin: f64,
    deadline: Instant,
    on_step: &mut dyn FnMut(usize),
    baseline: Option<(B::Runtime, f64)>,
) -> Vec<CandidateReport> {
    let mut reports: Vec<CandidateReport> = candidates
        .iter()
        .map(|c| CandidateReport {
            variant: c.variant.clone(),
            schedule: c.schedule.clone(),
            cost: c.cost,
            error: None,
            outcome: Outcome::NotTried,
            confirmed: None,
        })
        .collect();
    let mut runtimes: Vec<(usize, B::Runtime)> = vec![];
    let mut allowed = 1.0f64;
    // Seconds of each candidate's check (compile + one run), and the fastest so far.
    let mut check = vec![0f64; candidates.len()];
    let mut fastest = f64::INFINITY;
    let mut pruned_variants: Vec<String> = vec![];
    let mut baseline = baseline;
    for (i, c) in candidates.iter().enumerate().take(max_candidates.max(1)) {
        // Past the deadline only the backend's own plan is checked, and the next candidate
        // when the cost model rates it cheaper: a derived attention next to seconds-long
        // runs of the materialised one, whose check alone can take the whole budget
        // (without this, nothing but the slow plan would ever be tried).
        let far_cheaper = i == 1 && c.cost < candidates[0].cost;
        if i > 0 && Instant::now() >= deadline && !far_cheaper {
            break;
        }
        // A graph pruned under one schedule is not checked under the others (they move
        // times by far less than the pruning factor).
        if pruned_variants.contains(&c.variant) {
            reports[i].outcome =
                Outcome::Rejected("pruned under another schedule: not checked".into());
            continue;
        }
        if i == 0 {
            if let Some((rt, secs)) = baseline.take() {
                reports[0].error = Some(0.0);
                check[0] = secs;
                fastest = fastest.min(secs);
                runtimes.push((0, rt));
                on_step(1);
                continue;
            }
        }
        let t0 = Instant::now();
        let Some(backend) = backend_for(&c.schedule) else {
            reports[i].outcome = Outcome::Rejected(format!("unknown schedule {}", c.schedule));
            continue;
        };
        // Checked on the backend's exact variant where it has one (then compiled again to
        // be timed as it is), else checked and timed on one runtime. `timed_from`: when the
        // timed plan's compile and run began (its check time, for pruning).
        let checked = match backend.checking() {
            None => run_once_terms(&backend, &c.graph, &c.terms, inputs, dims, outputs)
                .map(|(rt, outs)| (rt, outs, t0)),
            Some(exact) => run_once_terms(&exact, &c.graph, &c.terms, inputs, dims, outputs)
                .and_then(|(_, outs)| {
                    let t1 = Instant::now();
                    let (rt, _) =
                        run_once_terms(&backend, &c.graph, &c.terms, inputs, dims, outputs)?;
                    Ok((rt, outs, t1))
                }),
        };
        match checked {
            Err(e) => reports[i].outcome = Outcome::Rejected(e),
            Ok((rt, outs, timed_from)) => {
                let err = outs
                    .iter()
                    .zip(reference)
                    .map(|(g, w)| error_ratio(g, w))
                    .fold(0f64, f64::max);
                reports[i].error = Some(err);
                if i == 0 && err > 1.0 && err.is_finite() {
                    allowed = 2.0 * err;
                }
                if err <= allowed {
                    check[i] = timed_from.elapsed().as_secs_f64();
                    fastest = fastest.min(check[i]);
                    runtimes.push((i, rt));
                    // Plans far slower than the fastest are not timed further, and their
                    // buffers are freed at once (a materialised attention next to the derived
                    // one: gigabytes). The backend's own plan is always timed.
                    let slow = |j: usize| j > 0 && check[j] > PRUNE_SLOWER * fastest.max(0.01);
                    for (j, _) in runtimes.iter().filter(|(j, _)| slow(*j)) {
                        pruned_variants.push(candidates[*j].variant.clone());
                        reports[*j].outcome = Outcome::Rejected(format!(
                            "pruned: its check took {:.1} ms, over {PRUNE_SLOWER}× the fastest ({:.1} ms)",
                            check[*j] * 1e3,
                            fastest * 1e3
                        ));
                    }
                    runtimes.retain(|(j, _)| !slow(*j));
                } else {
                    reports[i].outcome = Outcome::Rejected(format!(
                        "outputs differ from the reference: error {err:.3e} × tolerance"
                    ));
                }
            }
        }
        on_step(i + 1);
    }
    // Tiny plans are timed in batches of runs (about a millisecond per sample) so that one
    // sample is not one scheduler tick.
    let mut batch: Vec<usize> = vec![1; candidates.len()];
    for (i, rt) in runtimes.iter_mut() {
        let t0 = Instant::now();
        if rt.run().is_ok() {
            let one = t0.elapsed().as_secs_f64().max(1e-7);
            batch[*i] = ((1e-3 / one).ceil() as usize).clamp(1, 1000);
        }
    }
    let mut times: Vec<Vec<Duration>> = vec![vec![]; candidates.len()];
    let sample = |i: usize,
                  rt: &mut B::Runtime,
                  reports: &mut Vec<CandidateReport>,
                  times: &mut Vec<Vec<Duration>>| {
        let t0 = Instant::now();
        for _ in 0..batch[i] {
            if let Err(e) = rt.run() {
                reports[i].outcome = Outcome::Rejected(format!("run: {e}"));
                return;
            }
        }
        times[i].push(t0.elapsed() / batch[i] as u32);
    };
    for round in 0..repeats.max(1) {
        if round > 0 && Instant::now() >= deadline {
            break;
        }
        // After the first round, plans far slower than the fastest sample are not run
        // again (their first sample stands): a materialised attention at seq 8192 takes
        // seconds a run.
        let best = times.iter().filter_map(|t| t.iter().min()).min().copied();
        for (i, rt) in runtimes.iter_mut() {
            let slow = |t: &Vec<Duration>| {
                let (Some(b), Some(m)) = (best, t.iter().min()) else {
                    return false;
                };
                m.as_secs_f64() > PRUNE_SLOWER * b.as_secs_f64().max(1e-3)
            };
            if round > 0 && slow(&times[*i]) {
                continue;
            }
            sample(*i, rt, &mut reports, &mut times);
        }
    }
    let timed: Vec<usize> = runtimes.iter().map(|(i, _)| *i).collect();
    let finish = |reports: &mut Vec<CandidateReport>, times: &mut Vec<Vec<Duration>>| {
        for i in &timed {
            if !matches!(reports[*i].outcome, Outcome::Rejected(_)) && !times[*i].is_empty() {
                let runs = times[*i].len();
                reports[*i].outcome = Outcome::Timed {
                    median: median(&mut times[*i].clone()),
                    runs,
                };
            }
        }
    };
    finish(&mut reports, &mut times);
    // A winner other than the backend's own plan must win again, head to head with it, in
    // fresh alternating runs: one lucky round on a loaded machine does not change the plan.
    if let Some(w) = pick(&reports, margin).filter(|&w| w != 0) {
        if let Some(base) = runtimes.iter().position(|(i, _)| *i == 0) {
            let wpos = runtimes.iter().position(|(i, _)| *i == w).expect("timed");
            let (mut tb, mut tw) = (vec![], vec![]);
            let mut settled = false;
            for pair in 0..(2 * repeats).max(5) {
                for (pos, out) in [(base, &mut tb), (wpos, &mut tw)] {
                    let (i, rt) = &mut runtimes[pos];
                    let mut t = vec![vec![]; candidates.len()];
                    sample(*i, rt, &mut reports, &mut t);
                    out.append(&mut t[*i]);
                }
                // Every run of the winner (the rounds' and these, three or more of each)
                // beating every run of the baseline by the margin settles it early.
                let all_b: Vec<Duration> = times[0].iter().chain(&tb).copied().collect();
                let all_w: Vec<Duration> = times[w].iter().chain(&tw).copied().collect();
                let worst_w = all_w
                    .iter()
                    .max()
                    .map_or(f64::INFINITY, |d| d.as_secs_f64());
                let best_b = all_b.iter().min().map_or(0.0, |d| d.as_secs_f64());
                if all_b.len().min(all_w.len()) >= 3 && worst_w < best_b * (1.0 - margin) {
                    settled = true;
                    break;
                }
                if pair >= 2 && Instant::now() >= deadline {
                    break;
                }
            }
            if !tb.is_empty() && !tw.is_empty() {
                let (mb, mw) = (median(&mut tb), median(&mut tw));
                if !settled && mw.as_secs_f64() > mb.as_secs_f64() * (1.0 - margin) {
                    reports[w].confirmed = Some(false);
                } else {
                    reports[w].confirmed = Some(true);
                }
                times[0].extend(tb);
                times[w].extend(tw);
                finish(&mut reports, &mut times);
            }
        }
    }
    reports
}

/// The reference runtime's outputs for `g` on `inputs`.
pub fn reference_outputs(
    g: &GraphData,
    inputs: &[(TensorRef, HostData)],
    dims: &HashMap<String, i64>,
    outputs: &[(NodeId, TensorRef)],
) -> Result<Vec<HostData>, String> {
    run_once(&ReferenceBackend, g, inputs, dims, outputs)
        .map(|(_, o)| o)
        .map_err(|e| format!("reference runtime: {e}"))
}

/// The winner: the fastest timed candidate (not refuted head to head), unless it is not at
/// least `margin` faster than candidate 0 (the backend's own plan), which then stays.
pub fn pick(reports: &[CandidateReport], margin: f64) -> Option<usize> {
    // After the head-to-head: its winner if confirmed, else the backend's own plan (the
    // best contender lost; another one's median, improved by the head-to-head's extra runs
    // of the baseline, is not a second win).
    let timed = |i: usize| matches!(reports[i].outcome, Outcome::Timed { .. });
    if let Some(w) = (0..reports.len()).find(|&i| reports[i].confirmed == Some(true) && timed(i)) {
        return Some(w);
    }
    if reports.iter().any(|r| r.confirmed == Some(false)) && !reports.is_empty() && timed(0) {
        return Some(0);
    }
    let time = |i: usize| match reports[i].outcome {
        Outcome::Timed { median, .. } if reports[i].confirmed != Some(false) => Some(median),
        _ => None,
    };
    let fastest = (0..reports.len())
        .filter_map(|i| time(i).map(|t| (t, i)))
        .min()?;
    match time(0) {
        Some(base) if fastest.0.as_secs_f64() > base.as_secs_f64() * (1.0 - margin) => Some(0),
        _ => Some(fastest.1),
    }
}
