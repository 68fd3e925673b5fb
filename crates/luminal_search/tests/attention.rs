//! Attention derived by the rules (`rules/attention.egg`), not pattern-matched: plain
//! attention written with hl_ops, compiled on the CPU backend with its hand `attention`
//! rule switched off, becomes the `"online_attention"` fused term, which runs as one kernel
//! that never materialises the `[s, t]` scores and equals the reference runtime.

use luminal::prelude::*;
use luminal::{FusedTerm, GraphData, Tunable};
use luminal_cpu::CpuBackend;
use luminal_search::egraph::{self, CostWeights, Limits};
use luminal_search::measure::{self, Outcome};
use luminal_search::{terms, STAGES};
use std::collections::HashMap;
use std::time::Duration;

const H: usize = 2;
const D: usize = 16;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

/// `softmax(q·kᵀ/√d (+ causal mask))·v` over `[H, s, D]` from hl_ops; returns the graph's
/// input handles and the output.
fn attention(cx: &Graph, s: usize, t: usize, causal: bool) -> ([TensorRef; 3], TensorRef) {
    let q = cx.tensor("q", (H, s, D));
    let k = cx.tensor("k", (H, t, D));
    let v = cx.tensor("v", (H, t, D));
    let mut scores = q.matmul(k.permute([0, 2, 1])) * (1.0 / (D as f32).sqrt());
    if causal {
        let key = cx.arange(t).expand(0, s);
        let query = cx.arange(s).expand(1, t);
        let bias = (key - query)
            .le(cx.constant((t - s) as f32))
            .cast(DType::F32)
            .log2();
        scores = scores + bias.expand(0, H);
    }
    let out = scores.softmax(2).matmul(v).output();
    ([q.handle(), k.handle(), v.handle()], out.handle())
}

fn run<R: Runtime>(
    rt: &mut R,
    ins: &[TensorRef; 3],
    out: TensorRef,
    s: usize,
    t: usize,
) -> Vec<f32> {
    rt.set(ins[0], &values(H * s * D, 1)).unwrap();
    rt.set(ins[1], &values(H * t * D, 2)).unwrap();
    rt.set(ins[2], &values(H * t * D, 3)).unwrap();
    rt.run().unwrap();
    rt.get::<f32>(out).unwrap()
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 + 1e-4 * y.abs(),
            "element {i}: {x} vs {y}"
        );
    }
}

/// The rules saturated over `g`, the cheapest terms extracted and rebuilt, as the search
/// does for its "extracted" variant.
fn derive(g: &GraphData, backend: &CpuBackend) -> (GraphData, Vec<FusedTerm>) {
    let mut enc = terms::encode(g, backend.supports("matmul"));
    enc.online_attention = backend.supports("online_attention");
    let rules: String = egraph::RULE_FILES.iter().map(|r| r.1).collect();
    let mut eg = egraph::seed(&enc, &rules).unwrap();
    let limits = Limits {
        max_enodes: 100_000,
        time: Duration::from_secs(20),
        max_iterations: 64,
    };
    egraph::saturate(&mut eg, STAGES, &limits, &mut |_, _| {}).unwrap();
    let classes = egraph::read_classes(&eg, &enc, g).unwrap();
    let dag = egraph::extract(&classes, &enc, g, &CostWeights::DEFAULT, &HashMap::new()).unwrap();
    terms::rebuild_with_terms(g, &enc, &dag).unwrap()
}

#[test]
fn attention_is_derived_into_the_online_kernel() {
    // Lengths that cross the kernel's tiles (64 queries × 256 keys) and leave partial ones.
    for (s, t, causal) in [
        (300, 300, true),
        (300, 300, false),
        (70, 333, true),
        (1, 9, false),
    ] {
        let cx = Graph::new();
        let (ins, out) = attention(&cx, s, t, causal);
        let g = cx.snapshot();
        let want = run(
            &mut cx
                .compile(ReferenceBackend, CompileOptions::default())
                .unwrap(),
            &ins,
            out,
            s,
            t,
        );
        let hand_off = CpuBackend::default().disable_rules(&["attention"]);
        let (g2, fused) = derive(&g, &hand_off);
        assert_eq!(fused.len(), 1, "s={s} t={t} causal={causal}: no fused term");
        assert_eq!(fused[0].term, "online_attention");
        assert_eq!(fused[0].inputs.len(), if causal { 4 } else { 3 });
        let mut rt = hand_off
            .compile_terms(g2.clone(), &fused, &CompileOptions::default())
            .unwrap();
        let names = rt.kernel_names();
        assert!(names.contains(&"online_attention".to_string()), "{names:?}");
        assert_close(&run(&mut rt, &ins, out, s, t), &want);
        // Without the term the same graph materialises the scores; with it no buffer of the
        // plan holds them (inputs, output and the kernel's per-thread tiles only).
        let scores = H * s * t * 4;
        if s * t >= 300 * 300 {
            assert!(rt.buffer_bytes() < scores, "{} bytes", rt.buffer_bytes());
            let mut plain = hand_off.compile(g2, &CompileOptions::default()).unwrap();
            assert_close(&run(&mut plain, &ins, out, s, t), &want);
            assert!(
                plain.buffer_bytes() >= scores,
                "{} bytes",
                plain.buffer_bytes()
            );
        }
        // A backend that does not run the term never gets it.
        let no_terms = CpuBackend::default().disable_rules(&["attention", "terms"]);
        assert!(derive(&g, &no_terms).1.is_empty());
    }
}

#[test]
fn grouped_query_attention_from_luminal_nn_is_derived_too() {
    // luminal_nn::causal_attention: [b, heads, s, d] with 4 query heads over 2 kv heads
    // (the kv heads broadcast over their group, read in place).
    let (s, d) = (150, 16);
    let cx = Graph::new();
    let q = cx.tensor("q", (1, 4, s, d));
    let k = cx.tensor("k", (1, 2, s, d));
    let v = cx.tensor("v", (1, 2, s, d));
    let out = luminal_nn::causal_attention(q, k, v).output();
    let g = cx.snapshot();
    let set = |rt: &mut dyn FnMut(TensorRef, Vec<f32>)| {
        rt(q.handle(), values(4 * s * d, 1));
        rt(k.handle(), values(2 * s * d, 2));
        rt(v.handle(), values(2 * s * d, 3));
    };
    let mut reference = cx
        .compile(ReferenceBackend, CompileOptions::default())
        .unwrap();
    set(&mut |t, x| reference.set(t, &x).unwrap());
    reference.run().unwrap();
    let want: Vec<f32> = reference.get(out).unwrap();
    let hand_off = CpuBackend::default().disable_rules(&["attention"]);
    let (g2, fused) = derive(&g, &hand_off);
    assert_eq!(fused.len(), 1);
    let mut rt = hand_off
        .compile_terms(g2, &fused, &CompileOptions::default())
        .unwrap();
    assert!(rt.kernel_names().contains(&"online_attention".to_string()));
    set(&mut |t, x| rt.set(t, &x).unwrap());
    rt.run().unwrap();
    assert_close(&rt.get::<f32>(out).unwrap(), &want);
}

#[test]
fn attention_over_an_f16_cache_is_derived_reading_the_half_values_in_place() {
    // luminal_nn::causal_attention over f16 keys and values (an f16 KV cache: the products
    // widen them as they read them), more keys than queries (a decode chunk after a prefix).
    for (s, t, d) in [(40, 300, 16), (300, 300, 32)] {
        let cx = Graph::new();
        let q = cx.tensor("q", (1, 4, s, d));
        let k = cx.input("k", (1, 2, t, d), DType::F16);
        let v = cx.input("v", (1, 2, t, d), DType::F16);
        luminal_nn::causal_attention(q, k, v).output();
        let g = cx.snapshot();
        let dims = HashMap::new();
        let inputs = measure::make_inputs(&g, &dims).unwrap();
        let outs = measure::output_handles(&g);
        let want = measure::reference_outputs(&g, &inputs, &dims, &outs).unwrap();
        let hand_off = CpuBackend::default().disable_rules(&["attention"]);
        let (g2, fused) = derive(&g, &hand_off);
        assert_eq!(fused.len(), 1, "no fused term");
        // The term reads the f16 values themselves, not a widened copy.
        for e in &fused[0].inputs[1..3] {
            assert_eq!(g2.node(e.node).dtype, DType::F16);
        }
        let (rt, got) =
            measure::run_once_terms(&hand_off, &g2, &fused, &inputs, &dims, &outs).unwrap();
        assert!(rt.kernel_names().contains(&"online_attention".to_string()));
        let err = measure::error_ratio(&got[0], &want[0]);
        assert!(err <= 1.0, "s={s} t={t} d={d}: {err}");
    }
}

#[test]
fn search_compiles_plain_attention_with_the_hand_rule_off() {
    let (s, t) = (256, 256);
    let cx = Graph::new();
    let (ins, out) = attention(&cx, s, t, true);
    let want = run(
        &mut cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap(),
        &ins,
        out,
        s,
        t,
    );
    let budget = SearchBudget {
        time: Duration::from_secs(20),
        repeats: 3,
        use_cache: false,
        ..SearchBudget::default()
    };
    let backend = CpuBackend::default().disable_rules(&["attention"]);
    let (mut rt, report) =
        luminal_search::compile(&cx, backend, CompileOptions::search(budget)).unwrap();
    let report = report.expect("a search ran");
    eprintln!("{report}");
    assert_close(&run(&mut rt, &ins, out, s, t), &want);
    // The derived plan was a candidate and passed the reference check (which plan wins is
    // a matter of timing, not asserted).
    let derived = report
        .candidates
        .iter()
        .find(|c| c.variant == "extracted")
        .expect("an extracted variant");
    assert!(derived.error.is_some_and(|e| e <= 1.0), "{derived:?}");
    assert!(
        matches!(derived.outcome, Outcome::Timed { .. }),
        "{derived:?}"
    );
}

#[test]
fn a_cached_derived_plan_brings_its_fused_term_back() {
    // The derived plan stored as the search stores its choice; the next search of the same
    // graph reads it and hands the backend the same fused term, without searching.
    let (s, t) = (120, 120);
    let cx = Graph::new();
    let (ins, out) = attention(&cx, s, t, true);
    let g = cx.snapshot();
    let want = run(
        &mut cx
            .compile(ReferenceBackend, CompileOptions::default())
            .unwrap(),
        &ins,
        out,
        s,
        t,
    );
    let backend = CpuBackend::default().disable_rules(&["attention"]);
    let mut enc = terms::encode(&g, backend.supports("matmul"));
    enc.online_attention = backend.supports("online_attention");
    let rules: String = egraph::RULE_FILES.iter().map(|r| r.1).collect();
    let mut eg = egraph::seed(&enc, &rules).unwrap();
    let limits = Limits {
        max_enodes: 100_000,
        time: Duration::from_secs(20),
        max_iterations: 64,
    };
    egraph::saturate(&mut eg, STAGES, &limits, &mut |_, _| {}).unwrap();
    let classes = egraph::read_classes(&eg, &enc, &g).unwrap();
    let dims = HashMap::new();
    let dag = egraph::extract(&classes, &enc, &g, &CostWeights::DEFAULT, &dims).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "luminal-search-test-{}-attention-cache",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let key = luminal_search::cache::key(&enc, &g, &dims, &backend.tuning_id());
    let schedule = backend.schedules(&g)[0].clone();
    let entry = luminal_search::cache::Entry {
        schedule,
        dag,
        notes: String::new(),
    };
    luminal_search::cache::store(&dir, &key, &entry).unwrap();
    let plan = luminal_search::search(&backend, g, &SearchBudget::default(), &dir).unwrap();
    assert!(plan.report.from_cache, "{}", plan.report);
    assert_eq!(plan.report.fused, vec!["online_attention".to_string()]);
    let mut rt = backend
        .compile_terms(plan.graph, &plan.terms, &CompileOptions::default())
        .unwrap();
    assert!(rt.kernel_names().contains(&"online_attention".to_string()));
    assert_close(&run(&mut rt, &ins, out, s, t), &want);
    let _ = std::fs::remove_dir_all(&dir);
}
