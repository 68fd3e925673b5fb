//! The op suite through the term translation: every case's graph is encoded as terms,
//! put in an e-graph, extracted and rebuilt before the backend compiles it.
//!
//! - `round_trip`: no rules (graph → terms → graph gives the same outputs);
//! - `rewritten` / `rewritten_cpu`: all rule files saturated, the cost model's pick
//!   extracted, on the reference runtime and on the CPU backend.

use luminal::{Backend, CompileOptions, GraphData, LuminalError, ReferenceBackend, Result};
use luminal_cpu::CpuBackend;
use luminal_search::egraph::{self, CostWeights, Limits};
use luminal_search::terms;
use std::collections::HashMap;
use std::time::Duration;

#[derive(Clone, Debug)]
struct Terms<B> {
    inner: B,
    rules: bool,
}

fn through_terms(graph: &GraphData, rules: bool) -> std::result::Result<GraphData, String> {
    let enc = terms::encode(graph, true);
    let rule_text: String = if rules {
        egraph::RULE_FILES.iter().map(|r| r.1).collect()
    } else {
        String::new()
    };
    let mut eg = egraph::seed(&enc, &rule_text)?;
    if rules {
        let limits = Limits {
            max_enodes: 100_000,
            time: Duration::from_secs(10),
            max_iterations: 32,
        };
        egraph::saturate(&mut eg, luminal_search::STAGES, &limits, &mut |_, _| {})?;
    }
    let classes = egraph::read_classes(&eg, &enc, graph)?;
    let dag = egraph::extract(
        &classes,
        &enc,
        graph,
        &CostWeights::DEFAULT,
        &HashMap::new(),
    )?;
    if !rules {
        // Nothing to choose from: the same terms come back.
        assert_eq!(
            dag.nodes.len(),
            enc.dag.reachable().iter().filter(|&&l| l).count()
        );
    }
    terms::rebuild(graph, &enc, &dag)
        .ok_or_else(|| "the extracted terms do not rebuild".to_string())
}

impl<B: Backend> Backend for Terms<B> {
    type Runtime = B::Runtime;
    fn compile(&self, graph: GraphData, options: &CompileOptions) -> Result<B::Runtime> {
        let g = through_terms(&graph, self.rules).map_err(LuminalError::Backend)?;
        self.inner.compile(g, options)
    }
}

luminal::op_suite!(
    round_trip,
    Terms {
        inner: ReferenceBackend,
        rules: false
    }
);
luminal::op_suite!(
    rewritten,
    Terms {
        inner: ReferenceBackend,
        rules: true
    }
);
luminal::op_suite!(
    rewritten_cpu,
    Terms {
        inner: CpuBackend::default(),
        rules: true
    }
);
