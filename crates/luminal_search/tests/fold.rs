//! Identical subgraphs searched once (`luminal_search::fold`): a stack of identical
//! transformer blocks is seeded into the e-graph as one block, and what is extracted from it
//! is instantiated for every block, with the same outputs as the unfolded graph.

use luminal::prelude::*;
use luminal::{FusedTerm, GraphData, Tunable};
use luminal_cpu::CpuBackend;
use luminal_nn::{Module, Rope, RopeLayout, TransformerBlock};
use luminal_search::egraph::{self, CostWeights, Limits};
use luminal_search::{fold, measure, terms, STAGES};
use std::collections::HashMap;
use std::time::Duration;

const BLOCKS: usize = 6;

/// `BLOCKS` Llama blocks (grouped-query causal attention, SwiGLU) over `[1, 24, 64]`, all
/// weights created before the first block is applied (as a model loader does); each block's
/// output is also a graph output.
fn stack() -> (Graph, usize) {
    let cx = Graph::new();
    let rope = Rope::new(16, 10000.0, RopeLayout::NeoX);
    let blocks: Vec<TransformerBlock> = (0..BLOCKS)
        .map(|i| TransformerBlock::new(&cx, &format!("l{i}"), 64, 96, 4, 2, false, rope, 1e-5))
        .collect();
    let mut x = cx.tensor("x", (1, 24, 64));
    for b in &blocks {
        x = b.forward(x);
        x.output();
    }
    (x * 0.5).output();
    let n = cx.snapshot().outputs.len();
    (cx, n)
}

/// Outputs of `run` (a graph rebuilt from `g`, whose handles stay valid) on `g`'s inputs.
fn outputs_on<B: Tunable>(
    b: &B,
    g: &GraphData,
    run: &GraphData,
    terms: &[FusedTerm],
) -> Vec<HostData> {
    let dims = HashMap::new();
    let inputs = measure::make_inputs(g, &dims).unwrap();
    let outs = measure::output_handles(g);
    measure::run_once_terms(b, run, terms, &inputs, &dims, &outs)
        .unwrap()
        .1
}

/// The reference runtime's outputs of `run` on `g`'s inputs.
fn reference_outputs(g: &GraphData, run: &GraphData) -> Vec<HostData> {
    let dims = HashMap::new();
    let inputs = measure::make_inputs(g, &dims).unwrap();
    let outs = measure::output_handles(g);
    measure::reference_outputs(run, &inputs, &dims, &outs).unwrap()
}

fn assert_close(got: &[HostData], want: &[HostData]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        let r = measure::error_ratio(g, w);
        assert!(r <= 1.0, "error {r} tolerances");
    }
}

#[test]
fn a_stack_of_identical_blocks_is_seeded_as_one() {
    let (cx, n_outputs) = stack();
    let g = cx.snapshot();
    assert_eq!(n_outputs, BLOCKS + 1);
    let enc = terms::encode(&g, true);
    let fd = fold::find(&enc, &g).expect("the blocks repeat");
    // The first block reads the shared constants first (they are created there), so the
    // run may start at the second block, or inside the first.
    assert!(fd.count >= BLOCKS - 1, "{} instances", fd.count);
    let (source, seeded) = fd.sizes(&enc);
    assert!(
        seeded * 2 < source,
        "seeded {seeded} of {source} terms ({} × {})",
        fd.count,
        fd.period
    );
    // Extracting nothing new (the reduced encoding itself) and expanding gives back the
    // source's terms exactly: the same structure at every root.
    let whole = fd.expand(&fd.reduced.dag).expect("expands");
    let hashes = |d: &terms::TermDag| d.signature();
    assert_eq!(hashes(&whole), hashes(&enc.dag));
    let g2 = terms::rebuild(&g, &enc, &whole).unwrap();
    assert_close(&reference_outputs(&g, &g2), &reference_outputs(&g, &g));
}

#[test]
fn attention_derived_in_the_folded_block_reaches_every_block() {
    let (cx, _) = stack();
    let g = cx.snapshot();
    let backend = CpuBackend::default().disable_rules(&["attention"]);
    let mut enc = terms::encode(&g, backend.supports("matmul"));
    enc.online_attention = backend.supports("online_attention");
    let fd = fold::find(&enc, &g).expect("the blocks repeat");
    let rules: String = egraph::RULE_FILES.iter().map(|r| r.1).collect();
    let mut eg = egraph::seed(&fd.reduced, &rules).unwrap();
    let limits = Limits {
        max_enodes: 100_000,
        time: Duration::from_secs(30),
        max_iterations: 64,
    };
    egraph::saturate(&mut eg, STAGES, &limits, &mut |_, _| {}).unwrap();
    let classes = egraph::read_classes(&eg, &fd.reduced, &g).unwrap();
    let dag = egraph::extract(
        &classes,
        &fd.reduced,
        &g,
        &CostWeights::DEFAULT,
        &HashMap::new(),
    )
    .unwrap();
    let whole = fd.expand(&dag).expect("expands");
    let (g2, fused) = terms::rebuild_with_terms(&g, &enc, &whole).unwrap();
    // One online-attention term per block, though only one block was in the e-graph.
    assert_eq!(
        fused.len(),
        BLOCKS,
        "{:?}",
        fused.iter().map(|f| &f.term).collect::<Vec<_>>()
    );
    assert_close(
        &outputs_on(&backend, &g, &g2, &fused),
        &reference_outputs(&g, &g),
    );
}

#[test]
fn the_search_reports_the_fold_and_equals_the_reference() {
    let (cx, _) = stack();
    let g = cx.snapshot();
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
    let f = report.folded.expect("folded");
    assert!(f.instances >= BLOCKS - 1 && f.seeded_terms * 2 < f.source_terms);
    assert!(report.to_string().contains("identical segments"));
    // The compiled plan (whichever won) equals the reference on the search's own inputs.
    let dims = HashMap::new();
    let inputs = measure::make_inputs(&g, &dims).unwrap();
    for (t, data) in &inputs {
        rt.set_data(*t, data.clone()).unwrap();
    }
    rt.run().unwrap();
    let outs = measure::output_handles(&g);
    let got: Vec<HostData> = outs.iter().map(|(_, t)| rt.get_data(*t).unwrap()).collect();
    assert_close(&got, &reference_outputs(&g, &g));
}

#[test]
fn a_graph_without_repeats_is_not_folded() {
    let cx = Graph::new();
    let a = cx.tensor("a", (16, 8));
    let b = cx.tensor("b", (8, 12));
    (a.matmul(b).softmax(1) + 1.0).output();
    let g = cx.snapshot();
    assert!(fold::find(&terms::encode(&g, true), &g).is_none());
}
