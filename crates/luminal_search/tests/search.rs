//! The search end to end on the CPU backend: results equal the reference, a wrong candidate
//! is rejected, budgets are honoured, the cache is hit and invalidated.

use luminal::prelude::*;
use luminal::Tunable;
use luminal_cpu::CpuBackend;
use luminal_search::egraph::StopReason;
use luminal_search::measure::{self, Candidate, Outcome};
use luminal_search::{Search, SearchReport};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn temp_cache(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("luminal-search-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn budget() -> SearchBudget {
    SearchBudget {
        time: Duration::from_secs(20),
        repeats: 3,
        ..SearchBudget::default()
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

/// A low-rank product `(a·b)·c` whose right association is 16× cheaper, plus a softmax.
/// Compiles it with `backend` and options, runs on fixed data; returns outputs and report.
fn chain(backend: impl Backend, options: CompileOptions) -> (Vec<Vec<f32>>, Option<SearchReport>) {
    let cx = Graph::new();
    let a = cx.tensor("a", (96, 4));
    let b = cx.tensor("b", (4, 96));
    let c = cx.tensor("c", (96, 80));
    let y = a.matmul(b).matmul(c).output();
    let s = a.matmul(b).softmax(1).output();
    let mut rt = cx.compile(backend, options).unwrap();
    rt.set(a, &values(96 * 4, 1)).unwrap();
    rt.set(b, &values(4 * 96, 2)).unwrap();
    rt.set(c, &values(96 * 80, 3)).unwrap();
    rt.run().unwrap();
    (
        vec![rt.get::<f32>(y).unwrap(), rt.get::<f32>(s).unwrap()],
        None,
    )
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>]) {
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (x, y) in g.iter().zip(w) {
            assert!((x - y).abs() <= 1e-3 + 1e-4 * y.abs(), "{x} vs {y}");
        }
    }
}

fn search_chain(search: Search<CpuBackend>, budget: SearchBudget) -> (Vec<Vec<f32>>, SearchReport) {
    let handle = search.report_handle();
    let (out, _) = chain(search, CompileOptions::search(budget));
    let report = handle.lock().unwrap().take().expect("a search ran");
    (out, report)
}

#[test]
fn search_result_equals_reference_and_finds_the_cheap_association() {
    let dir = temp_cache("equals");
    let (want, _) = chain(ReferenceBackend, CompileOptions::default());
    let (got, report) = search_chain(
        Search::new(CpuBackend::default()).cache_dir(&dir),
        SearchBudget {
            use_cache: false,
            ..budget()
        },
    );
    eprintln!("{report}");
    assert_close(&got, &want);
    assert!(!report.from_cache);
    assert_eq!(report.stages.len(), luminal_search::STAGES.len());
    // The reassociation rules found the right association, and the cost model prefers it.
    let source = &report.candidates[0];
    assert_eq!(source.variant, "source");
    let extracted = report
        .candidates
        .iter()
        .find(|c| c.variant == "extracted")
        .expect("an extracted variant");
    assert!(
        extracted.cost < source.cost,
        "{} vs {}",
        extracted.cost,
        source.cost
    );
    // Every timed candidate passed the reference check; the chosen one was timed.
    for c in &report.candidates {
        if let Outcome::Timed { .. } = c.outcome {
            assert!(c.error.unwrap() <= 1.0);
        }
    }
    assert!(report.chosen_time().is_some());
    // A plain compile is unaffected by the wrapper.
    let (plain, _) = chain(
        Search::new(CpuBackend::default()),
        CompileOptions::default(),
    );
    assert_close(&plain, &want);
}

#[test]
fn a_wrong_candidate_is_rejected() {
    let cx = Graph::new();
    let x = cx.tensor("x", (64, 256));
    x.exp2().sum(1).output();
    let g = cx.snapshot();
    // The same graph with the sum turned into a max: cheaper, and wrong.
    let mut wrong = g.clone();
    let out = *g.outputs.iter().next().unwrap();
    match &mut wrong.node_mut(out).op {
        luminal::op::Op::Reduce { op, .. } => *op = luminal::op::ReduceOp::Max,
        other => panic!("unexpected output op {other:?}"),
    }
    let dims = HashMap::new();
    let inputs = measure::make_inputs(&g, &dims).unwrap();
    let outputs = measure::output_handles(&g);
    let reference = measure::reference_outputs(&g, &inputs, &dims, &outputs).unwrap();
    let backend = CpuBackend::default();
    let sched = backend.schedules(&g)[0].clone();
    let cand = |variant: &str, graph: &luminal::GraphData| Candidate {
        variant: variant.into(),
        graph: graph.clone(),
        terms: vec![],
        schedule: sched.clone(),
        cost: 0.0,
    };
    let candidates = vec![cand("source", &g), cand("wrong", &wrong)];
    let reports = measure::measure(
        &|s: &str| backend.schedule(s),
        &candidates,
        &inputs,
        &dims,
        &reference,
        &outputs,
        8,
        3,
        0.03,
        Instant::now() + Duration::from_secs(10),
        &mut |_| {},
    );
    assert!(
        matches!(reports[0].outcome, Outcome::Timed { .. }),
        "{:?}",
        reports[0]
    );
    assert!(
        matches!(reports[1].outcome, Outcome::Rejected(_)),
        "{:?}",
        reports[1]
    );
    assert!(reports[1].error.unwrap() > 1.0);
    assert_eq!(measure::pick(&reports, 0.0), Some(0));
}

#[test]
fn budgets_are_honoured() {
    // Candidates: only the first two are tried.
    let (_, r) = search_chain(
        Search::new(CpuBackend::default()),
        SearchBudget {
            max_candidates: 2,
            use_cache: false,
            ..budget()
        },
    );
    let tried = r
        .candidates
        .iter()
        .filter(|c| c.outcome != Outcome::NotTried)
        .count();
    assert!(r.candidates.len() > 2 && tried == 2, "{r}");
    // E-nodes: saturation stops at the limit.
    let (_, r) = search_chain(
        Search::new(CpuBackend::default()),
        SearchBudget {
            max_enodes: 10,
            use_cache: false,
            ..budget()
        },
    );
    assert!(
        r.stages
            .iter()
            .all(|s| s.stopped == StopReason::NodeLimit && s.iterations == 0),
        "{r}"
    );
    // Time: with none, nothing is saturated and only the backend's own plan is run.
    let (got, r) = search_chain(
        Search::new(CpuBackend::default()),
        SearchBudget {
            time: Duration::ZERO,
            use_cache: false,
            ..budget()
        },
    );
    assert!(
        r.stages.iter().all(|s| s.stopped == StopReason::TimeLimit),
        "{r}"
    );
    assert_eq!(r.chosen, Some(0));
    let tried = r
        .candidates
        .iter()
        .filter(|c| c.outcome != Outcome::NotTried)
        .count();
    assert_eq!(tried, 1, "{r}");
    let (want, _) = chain(ReferenceBackend, CompileOptions::default());
    assert_close(&got, &want);
}

#[test]
fn cache_is_hit_then_invalidated_by_the_key() {
    let dir = temp_cache("cache");
    let (want, _) = chain(ReferenceBackend, CompileOptions::default());
    let first = search_chain(Search::new(CpuBackend::default()).cache_dir(&dir), budget()).1;
    assert!(!first.from_cache);
    let path = first.cache_path.clone().expect("written to the cache");
    assert!(path.starts_with(&dir) && path.exists());
    // Same graph, same backend: read back, nothing searched, same results.
    let t0 = Instant::now();
    let (got, second) = search_chain(Search::new(CpuBackend::default()).cache_dir(&dir), budget());
    let _ = t0.elapsed();
    assert!(second.from_cache, "{second}");
    assert!(second.stages.is_empty() && second.candidates.is_empty());
    assert_eq!(second.cache_key, first.cache_key);
    assert_eq!(second.schedule, first.schedule);
    assert_close(&got, &want);
    // Another backend setting changes the key: searched again.
    let third = search_chain(
        Search::new(CpuBackend::with_threads(1)).cache_dir(&dir),
        budget(),
    )
    .1;
    assert!(!third.from_cache && third.cache_key != first.cache_key);
    // So does another graph (different shapes).
    let cx = Graph::new();
    let a = cx.tensor("a", (32, 4));
    a.exp2().output();
    let s = Search::new(CpuBackend::default()).cache_dir(&dir);
    let h = s.report_handle();
    cx.compile(s, CompileOptions::search(budget())).unwrap();
    let fourth = h.lock().unwrap().take().unwrap();
    assert!(!fourth.from_cache && fourth.cache_key != first.cache_key);
    // A damaged entry is a miss, not an error.
    std::fs::write(
        &path,
        "luminal-search-plan v1\nschedule threads=1;off=\n0 Bogus\n",
    )
    .unwrap();
    let fifth = search_chain(Search::new(CpuBackend::default()).cache_dir(&dir), budget()).1;
    assert!(!fifth.from_cache);
    // No cache: nothing read.
    let sixth = search_chain(
        Search::new(CpuBackend::default()).cache_dir(&dir),
        SearchBudget {
            use_cache: false,
            ..budget()
        },
    )
    .1;
    assert!(!sixth.from_cache);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dynamic_dims_need_a_value_and_the_bucket_is_in_the_key() {
    let dir = temp_cache("dyn");
    let build = |cx: &Graph| {
        let x = cx.tensor("x", ("seq", 16));
        x.softmax(1).output();
    };
    let cx = Graph::new();
    build(&cx);
    let e = cx
        .compile(
            Search::new(CpuBackend::default()).cache_dir(&dir),
            CompileOptions::search(budget()),
        )
        .err()
        .expect("an unbound dim is an error");
    assert!(e.to_string().contains("seq"), "{e}");
    let key = |seq: usize| {
        let cx = Graph::new();
        build(&cx);
        let s = Search::new(CpuBackend::default()).cache_dir(&dir);
        let h = s.report_handle();
        cx.compile(s, CompileOptions::search(budget().dim("seq", seq)))
            .unwrap();
        let r = h.lock().unwrap().take().unwrap();
        (r.cache_key, r.from_cache)
    };
    let (k5, hit5) = key(5);
    let (k7, hit7) = key(7); // same bucket (8)
    let (k9, _) = key(9); // next bucket
    assert!(!hit5 && hit7 && k5 == k7 && k9 != k5);
    let _ = std::fs::remove_dir_all(&dir);
}
