//! Search vs the hand lowering on the CPU backend, workload by workload.
//!
//! For each workload: compile with the hand lowering (`CompileOptions::default()`), and with
//! `Search::new(CpuBackend::default())` under `CompileOptions::search(budget)` (no cache, so
//! every workload is searched); then time both runtimes in the same loop, alternating (each
//! sample a batch of runs of about 5 ms for sub-millisecond graphs), and report the ratio of
//! medians (> 1: search is faster), the search's compile time and the plan it chose.
//!
//! Three kinds of workload: graphs built here; the same with some of the backend's hand
//! rules switched off on both sides (`CpuBackend::disable_rules`: what the search derives
//! where the backend has no hand kernel); and the whole SmolLM2-135M-Instruct (Q4_1 GGUF
//! from `./scripts/fetch-models.sh`; skipped with a line when absent) loaded through
//! `LlamaModel::load`, once on the hand backend and once on a `Search` with the budget's
//! dims set to the step timed (decode: `s = 1`, `p = 64`, `n_out = 1`; prefill: `s = 128`,
//! `p = 0`, `n_out = 1`). The model rows' compile column is the searched model's whole load
//! (weights, search, compile); the hand load time is printed below the table.
//!
//! `cargo bench -p luminal_search` (all), or with a substring filter:
//! `cargo bench -p luminal_search -- attention`. `LUMINAL_SEARCH_BENCH_RUNS=n` sets the
//! timed runs per plan (default 21, the whole model too: a SmolLM2 row takes ~10 s of timing
//! on 2 cores), `LUMINAL_SEARCH_BENCH_TIME=s` the search budget (10).

use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_models::{LlamaModel, LoadOptions, Model};
use luminal_nn::{Module, Rope, RopeLayout, TransformerBlock};
use luminal_search::{Search, SearchReport};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type Build = fn(&Graph) -> Vec<GraphTensor<'_>>;

fn attention(cx: &Graph, seq: usize) -> Vec<GraphTensor<'_>> {
    // Plain attention from hl_ops: [heads, seq, 64].
    let (h, d) = (4, 64);
    let q = cx.tensor("q", (h, seq, d));
    let k = cx.tensor("k", (h, seq, d));
    let v = cx.tensor("v", (h, seq, d));
    let scores = q.matmul(k.permute([0, 2, 1])) * (1.0 / (d as f32).sqrt());
    vec![scores.softmax(2).matmul(v)]
}

fn causal_attention(cx: &Graph, seq: usize) -> Vec<GraphTensor<'_>> {
    // The same with a causal mask: the hand `attention` rule's pattern.
    let (h, d) = (4, 64);
    let q = cx.tensor("q", (h, seq, d));
    let k = cx.tensor("k", (h, seq, d));
    let v = cx.tensor("v", (h, seq, d));
    let key = cx.arange(seq).expand(0, seq);
    let query = cx.arange(seq).expand(1, seq);
    let mask = (key - query).le(cx.constant(0.0)).cast(DType::F32).log2();
    let scores = q.matmul(k.permute([0, 2, 1])) * (1.0 / (d as f32).sqrt()) + mask.expand(0, h);
    vec![scores.softmax(2).matmul(v)]
}

fn workloads() -> Vec<(&'static str, Build)> {
    vec![
        ("matmul square 256", |cx| {
            let a = cx.tensor("a", (256, 256));
            let b = cx.tensor("b", (256, 256));
            vec![a.matmul(b)]
        }),
        ("matmul skinny 1x576x1536", |cx| {
            let a = cx.tensor("a", (1, 576));
            let b = cx.tensor("b", (576, 1536));
            vec![a.matmul(b)]
        }),
        ("matmul batched 8x64x64", |cx| {
            let a = cx.tensor("a", (8, 64, 64));
            let b = cx.tensor("b", (8, 64, 64));
            vec![a.matmul(b)]
        }),
        ("matmul transposed b 128x256x192", |cx| {
            let a = cx.tensor("a", (128, 256));
            let b = cx.tensor("b", (192, 256));
            vec![a.matmul(b.permute([1, 0]))]
        }),
        ("low-rank chain (96x8·8x512)·512x512", |cx| {
            let a = cx.tensor("a", (96, 8));
            let b = cx.tensor("b", (8, 512));
            let c = cx.tensor("c", (512, 512));
            vec![a.matmul(b).matmul(c)]
        }),
        ("adapter decode x·(W+A·B) 1x576x1536 r16", |cx| {
            let x = cx.tensor("x", (1, 576));
            let w = cx.tensor("w", (576, 1536));
            let a = cx.tensor("a", (576, 16));
            let b = cx.tensor("b", (16, 1536));
            vec![x.matmul(w + a.matmul(b))]
        }),
        ("swiglu mlp 32x576x1536", |cx| {
            let x = cx.tensor("x", (32, 576));
            let g = cx.tensor("g", (576, 1536));
            let u = cx.tensor("u", (576, 1536));
            let d = cx.tensor("d", (1536, 576));
            vec![(x.matmul(g).silu() * x.matmul(u)).matmul(d)]
        }),
        ("softmax rows 256x1024", |cx| {
            vec![cx.tensor("x", (256, 1024)).softmax(1)]
        }),
        ("rms_norm rows 256x576", |cx| {
            vec![cx.tensor("x", (256, 576)).rms_norm(1, 1e-5)]
        }),
        ("rms_norm -> matmul 64x576x576", |cx| {
            let x = cx.tensor("x", (64, 576));
            let w = cx.tensor("w", (576, 576));
            vec![x.rms_norm(1, 1e-5).matmul(w)]
        }),
        ("attention seq 128", |cx| attention(cx, 128)),
        ("attention seq 256", |cx| attention(cx, 256)),
        ("attention seq 512", |cx| attention(cx, 512)),
        ("attention seq 1024", |cx| attention(cx, 1024)),
        ("causal attention seq 1024 (hand kernel)", |cx| {
            causal_attention(cx, 1024)
        }),
        ("conv2d 1x16x32x32 k3 ->32", |cx| {
            let x = cx.tensor("x", (1, 16, 32, 32));
            let w = cx.tensor("w", (32, 16, 3, 3));
            vec![x.conv2d(w, (1, 1), (1, 1), (1, 1), 1)]
        }),
        ("SmolLM2-shaped layer, seq 32 (f32)", |cx| {
            let rope = Rope::new(64, 100000.0, RopeLayout::NeoX);
            let block = TransformerBlock::new(cx, "l0", 576, 1536, 9, 3, false, rope, 1e-5);
            let x = cx.tensor("x", (1, 32, 576));
            vec![block.forward(x)]
        }),
    ]
}

/// Graph workloads compiled on `CpuBackend::default().disable_rules(rules)` for both the
/// hand side and the search's backend.
fn rule_off_workloads() -> Vec<(&'static str, Build, &'static [&'static str])> {
    vec![(
        "causal attention seq 2048 (hand attention rule off)",
        |cx| causal_attention(cx, 2048),
        &["attention"],
    )]
}

/// The step a whole-model workload times.
#[derive(Clone, Copy)]
enum Step {
    /// `DECODE_BLOCK` one-token steps after a `DECODE_CACHED`-token prefill, per step.
    Decode,
    /// A prompt of this many tokens from an empty cache, logits of the last position only.
    Prefill(usize),
}

const DECODE_CACHED: usize = 64;
const DECODE_BLOCK: usize = 8;
const PREFILL: usize = 128;

/// A whole-model workload: name, step, budget dims `(s, p, n_out)` (`n_out`: how many of
/// the last positions get logits; 1 when generating), and the hand rules switched off on
/// both sides.
type ModelWorkload = (
    &'static str,
    Step,
    (usize, usize, usize),
    &'static [&'static str],
);

fn model_workloads() -> Vec<ModelWorkload> {
    vec![
        (
            "SmolLM2 decode step (whole model, 64 cached)",
            Step::Decode,
            (1, DECODE_CACHED, 1),
            &[],
        ),
        (
            "SmolLM2 prefill step (whole model, 128 tokens)",
            Step::Prefill(PREFILL),
            (PREFILL, 0, 1),
            &[],
        ),
        // Where the backend has no hand attention kernel, the search derives it for the
        // model's grouped-query attention over the f16 KV cache.
        (
            "SmolLM2 prefill step (whole model, 512 tokens, hand attention rule off)",
            Step::Prefill(LONG_PREFILL),
            (LONG_PREFILL, 0, 1),
            &["attention"],
        ),
    ]
}

const LONG_PREFILL: usize = 512;

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Token ids for a prompt of `n` (arbitrary, below the vocabulary size).
fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 2 + (i * 37) % 1000).collect()
}

/// One timed run of `step`; the reset and the decode's prefill are outside the timing.
fn time_step<R: Runtime>(m: &mut LlamaModel<R>, step: Step, logits: &mut Vec<f32>) -> Duration {
    m.reset();
    match step {
        Step::Decode => {
            m.forward_into(&prompt(DECODE_CACHED), 1, logits).unwrap();
            let next = prompt(DECODE_BLOCK + 1);
            let t = Instant::now();
            for &tok in &next[1..] {
                m.forward_into(&[tok], 1, logits).unwrap();
            }
            t.elapsed() / DECODE_BLOCK as u32
        }
        Step::Prefill(n) => {
            let tokens = prompt(n);
            let t = Instant::now();
            m.forward_into(&tokens, 1, logits).unwrap();
            t.elapsed()
        }
    }
}

fn fill(rt: &mut impl Runtime, g: &luminal::GraphData) {
    for (t, data) in luminal_search::measure::make_inputs(g, &Default::default()).unwrap() {
        rt.set_data(t, data).unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One workload's measurements.
struct Row {
    hand: Duration,
    search: Duration,
    compile: Duration,
    report: SearchReport,
}

/// A row's ratio, and whether the search chose a plan other than the hand lowering's.
type Ratio = (f64, bool);

fn print_row(name: &str, row: &Row, ratios: &mut Vec<Ratio>) {
    let Row {
        hand: mh,
        search: ms,
        compile,
        report,
    } = row;
    let ratio = mh.as_secs_f64() / ms.as_secs_f64();
    ratios.push((ratio, report.chosen != Some(0)));
    println!(
        "| {name} | {:.3} | {:.3} | {ratio:.2}× | {:.2} | {} | {} / {}{}{} |",
        mh.as_secs_f64() * 1e3,
        ms.as_secs_f64() * 1e3,
        compile.as_secs_f64(),
        report.enodes,
        report.variant,
        report.schedule,
        if report.fused.is_empty() {
            String::new()
        } else {
            let mut names = report.fused.clone();
            names.sort();
            names.dedup();
            let counted: Vec<String> = names
                .iter()
                .map(|n| match report.fused.iter().filter(|f| *f == n).count() {
                    1 => n.clone(),
                    k => format!("{n} ×{k}"),
                })
                .collect();
            format!(" [{}]", counted.join(", "))
        },
        if report.chosen == Some(0) {
            " (= the hand plan: the ratio is noise)"
        } else {
            ""
        }
    );
    if std::env::var("LUMINAL_SEARCH_LOG").is_ok() {
        eprintln!("{report}");
    }
}

/// A graph workload on `backend` (hand lowering) against `Search::new(backend)`.
fn graph_row(build: Build, backend: CpuBackend, runs: usize, budget_s: u64) -> Row {
    let cx = Graph::new();
    for o in build(&cx) {
        o.output();
    }
    let mut hand = cx.compile(backend, CompileOptions::default()).unwrap();
    let search = Search::new(backend);
    let handle = search.report_handle();
    let budget = SearchBudget {
        time: Duration::from_secs(budget_s),
        use_cache: false,
        ..SearchBudget::default()
    };
    let t0 = Instant::now();
    let mut searched = cx.compile(search, CompileOptions::search(budget)).unwrap();
    let compile = t0.elapsed();
    let report = handle.lock().unwrap().take().unwrap();
    let g = cx.snapshot();
    fill(&mut hand, &g);
    fill(&mut searched, &g);
    let t = Instant::now();
    hand.run().unwrap();
    let one = t.elapsed();
    searched.run().unwrap();
    // A sample is a batch of runs of about 5 ms, so that sub-millisecond plans are not
    // timed one scheduler tick or one cache refill (after the other side ran) at a time.
    let batch = (5e-3 / one.as_secs_f64().max(1e-7))
        .ceil()
        .clamp(1.0, 1000.0) as u32;
    let (mut th, mut ts) = (vec![], vec![]);
    for _ in 0..runs {
        let t = Instant::now();
        for _ in 0..batch {
            hand.run().unwrap();
        }
        th.push(t.elapsed() / batch);
        let t = Instant::now();
        for _ in 0..batch {
            searched.run().unwrap();
        }
        ts.push(t.elapsed() / batch);
    }
    Row {
        hand: median(th),
        search: median(ts),
        compile,
        report,
    }
}

/// A whole-model workload: `hand` against the model loaded on a `Search` whose budget's
/// dims are `dims` (a fresh cache folder, not read or written: every row is searched).
#[allow(clippy::too_many_arguments)]
fn model_row<R: Runtime>(
    path: &Path,
    hand: &mut LlamaModel<R>,
    backend: CpuBackend,
    opts: &LoadOptions,
    step: Step,
    (s, p, n_out): (usize, usize, usize),
    runs: usize,
    budget_s: u64,
) -> Row {
    let budget = SearchBudget {
        time: Duration::from_secs(budget_s),
        use_cache: false,
        ..SearchBudget::default()
    }
    .dim("s", s)
    .dim("p", p)
    .dim("n_out", n_out);
    let cache = std::env::temp_dir().join(format!(
        "luminal-search-bench-{}-{s}-{p}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&cache);
    let search = Search::new(backend).cache_dir(&cache).with_budget(budget);
    let handle = search.report_handle();
    let t0 = Instant::now();
    let (mut searched, _) = LlamaModel::load(path, search, opts, |_, _| {}).unwrap();
    let compile = t0.elapsed();
    let _ = std::fs::remove_dir_all(&cache);
    let report = handle.lock().unwrap().take().unwrap();
    let mut logits = vec![];
    let warm = time_step(hand, step, &mut logits);
    time_step(&mut searched, step, &mut logits);
    // A step of seconds (the materialised attention of the rule-off row) is timed 5 times.
    let runs = if warm > Duration::from_secs(1) {
        runs.min(5)
    } else {
        runs
    };
    let (mut th, mut ts) = (vec![], vec![]);
    for _ in 0..runs {
        th.push(time_step(hand, step, &mut logits));
        ts.push(time_step(&mut searched, step, &mut logits));
    }
    Row {
        hand: median(th),
        search: median(ts),
        compile,
        report,
    }
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected =
        |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    // 21 runs of the whole model are ~10 s a row on 2 cores (2026-11-26: a 128-token
    // prefill ≈ 0.27 s, a decode block of 64 prefilled + 8 steps ≈ 0.25 s, each side), so
    // it keeps the default.
    let runs = env("LUMINAL_SEARCH_BENCH_RUNS").unwrap_or(21) as usize;
    let budget_s = env("LUMINAL_SEARCH_BENCH_TIME").unwrap_or(10);
    println!(
        "isa {:?}, {} threads available; {runs} alternating runs per plan; search budget {budget_s} s",
        luminal_cpu::detected_isa(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "| workload | hand (ms) | search (ms) | ratio | search compile (s) | e-nodes | chosen plan |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let mut ratios = vec![];
    let mut notes = vec![];
    let graphs = workloads()
        .into_iter()
        .map(|(name, build)| (name, build, &[][..]))
        .chain(rule_off_workloads());
    for (name, build, off) in graphs {
        if selected(name) {
            let backend = CpuBackend::default().disable_rules(off);
            print_row(
                name,
                &graph_row(build, backend, runs, budget_s),
                &mut ratios,
            );
        }
    }
    let path = model_path();
    let opts = LoadOptions {
        // The decode block (64 + 8 positions) and the prefills fit.
        max_ctx: LONG_PREFILL + 64,
        ..LoadOptions::default()
    };
    let mut hands: Vec<(&[&str], LlamaModel<luminal_cpu::CpuRuntime>)> = vec![];
    for (name, step, dims, off) in model_workloads() {
        if !selected(name) {
            continue;
        }
        if !path.exists() {
            println!(
                "| {name} | skipped: {} not found (./scripts/fetch-models.sh) | | | | | |",
                path.display()
            );
            continue;
        }
        let backend = CpuBackend::default().disable_rules(off);
        if !hands.iter().any(|h| h.0 == off) {
            let t0 = Instant::now();
            let (m, _) = LlamaModel::load(&path, backend, &opts, |_, _| {}).unwrap();
            if hands.is_empty() {
                notes.push(format!(
                    "SmolLM2 hand lowering: load + compile {:.2} s (the whole-model rows' compile column includes the same loading)",
                    t0.elapsed().as_secs_f64()
                ));
            }
            hands.push((off, m));
        }
        let hand = &mut hands.iter_mut().find(|h| h.0 == off).unwrap().1;
        let row = model_row(&path, hand, backend, &opts, step, dims, runs, budget_s);
        print_row(name, &row, &mut ratios);
    }
    let summary = |rs: &[f64]| {
        let geo = (rs.iter().map(|r| r.ln()).sum::<f64>() / rs.len() as f64).exp();
        let min = rs.iter().cloned().fold(f64::INFINITY, f64::min);
        let big = rs.iter().filter(|&&r| r >= 1.3).count();
        format!("geomean {geo:.2}×, min {min:.2}×, {big} at ≥ 1.3×")
    };
    if !ratios.is_empty() {
        let all: Vec<f64> = ratios.iter().map(|r| r.0).collect();
        println!("\n{} workloads: {}", all.len(), summary(&all));
        let other: Vec<f64> = ratios.iter().filter(|r| r.1).map(|r| r.0).collect();
        if !other.is_empty() {
            println!(
                "{} where the search chose another plan than the hand lowering's: {} (the \
                 others run the hand plan on both sides: their ratios are the machine's noise)",
                other.len(),
                summary(&other)
            );
        }
    }
    for note in notes {
        println!("{note}");
    }
}
