//! Search vs the hand lowering on the CPU backend, workload by workload.
//!
//! For each workload: compile with the hand lowering (`CompileOptions::default()`), and with
//! `Search::new(CpuBackend::default())` under `CompileOptions::search(budget)` (no cache, so
//! every workload is searched); then time both runtimes in the same loop, alternating, and
//! report the ratio of medians (> 1: search is faster), the search's compile time and the
//! plan it chose.
//!
//! `cargo bench -p luminal_search` (all), or with a substring filter:
//! `cargo bench -p luminal_search -- attention`. `LUMINAL_SEARCH_BENCH_RUNS=n` sets the
//! timed runs per plan (default 21), `LUMINAL_SEARCH_BENCH_TIME=s` the search budget (10).

use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_nn::{Module, Rope, RopeLayout, TransformerBlock};
use luminal_search::Search;
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

fn fill(rt: &mut impl Runtime, g: &luminal::GraphData) {
    for (t, data) in luminal_search::measure::make_inputs(g, &Default::default()).unwrap() {
        rt.set_data(t, data).unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let runs = env("LUMINAL_SEARCH_BENCH_RUNS", 21) as usize;
    let budget_s = env("LUMINAL_SEARCH_BENCH_TIME", 10);
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
    for (name, build) in workloads() {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let cx = Graph::new();
        for o in build(&cx) {
            o.output();
        }
        let mut hand = cx
            .compile(CpuBackend::default(), CompileOptions::default())
            .unwrap();
        let search = Search::new(CpuBackend::default());
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
        hand.run().unwrap();
        searched.run().unwrap();
        let (mut th, mut ts) = (vec![], vec![]);
        for _ in 0..runs {
            let t = Instant::now();
            hand.run().unwrap();
            th.push(t.elapsed());
            let t = Instant::now();
            searched.run().unwrap();
            ts.push(t.elapsed());
        }
        let (mh, ms) = (median(th), median(ts));
        let ratio = mh.as_secs_f64() / ms.as_secs_f64();
        ratios.push(ratio);
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
                format!(" [{}]", report.fused.join(","))
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
    if !ratios.is_empty() {
        let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        let min = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
        let big = ratios.iter().filter(|&&r| r >= 1.3).count();
        println!(
            "\n{} workloads: geomean {geo:.2}×, min {min:.2}×, {big} at ≥ 1.3×",
            ratios.len()
        );
    }
}
