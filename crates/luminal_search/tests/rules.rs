//! Every rule of every rule file, checked alone: small graphs that contain its left-hand
//! side are put in an e-graph with only that rule, saturated, and then *every* alternative
//! the rule added is extracted (each e-node of each class with a choice, forced in turn),
//! rebuilt and run on the reference runtime; its outputs must equal the source graph's
//! (within the op suite's float tolerance: the reassociation rules move rounding). Each
//! rule must fire on at least one graph, so a rule that stops matching fails too.

use luminal::graph::{Edge, GraphData};
use luminal::op::Op;
use luminal::prelude::*;
use luminal_search::egraph::{self, Classes, CostWeights, Limits};
use luminal_search::{measure, terms};
use std::collections::HashMap;
use std::time::Duration;

/// A contiguous copy of a tensor that is already whole and in order (what the graph gets
/// when a pass or a user copies a buffer; `contiguous()` itself skips it).
fn copy<'g>(x: GraphTensor<'g>) -> GraphTensor<'g> {
    let edge = Edge {
        node: x.node(),
        view: x.view(),
    };
    x.graph
        .add_op(Op::Contiguous, vec![edge], x.dtype(), x.shape())
}

/// The small graphs the rules are tried on.
/// The graph as the search receives it for the graphs that build softmax: through the
/// identity simplifications of the generic passes (softmax's detached max is a copy node
/// until then).
fn simplified(cx: &Graph) -> GraphData {
    use luminal::passes::{ArithmeticSimplify, DeadNodeElimination, Pass};
    let mut g = cx.snapshot();
    ArithmeticSimplify.run(&mut g);
    DeadNodeElimination.run(&mut g);
    g
}

fn graphs() -> Vec<(&'static str, GraphData)> {
    let mut out = vec![];
    {
        let cx = Graph::new();
        let x = cx.tensor("x", (4, 6));
        let y = cx.tensor("y", (6, 4));
        let t = x.permute([1, 0]).contiguous(); // a real copy, [6, 4]
        (t.exp2() + y).output();
        (y * copy(t)).output();
        (copy(t) + y).output();
        copy(t).sum(1).output();
        copy(x).sqrt().output();
        out.push(("copies", cx.snapshot()));
    }
    {
        let cx = Graph::new();
        let x = cx.tensor("x", (3, 5));
        (x * cx.ones((3, 5))).output();
        (cx.zeros((3, 5)) + x.sin()).output();
        (x.exp2() + cx.zeros((3, 5))).output();
        out.push(("identities", cx.snapshot()));
    }
    {
        let cx = Graph::new();
        let a = cx.tensor("a", (8, 3));
        let b = cx.tensor("b", (3, 9));
        let c = cx.tensor("c", (9, 5));
        a.matmul(b).matmul(c).output();
        a.matmul(b.matmul(c)).exp2().output();
        out.push(("matmul-chains", cx.snapshot()));
    }
    {
        let cx = Graph::new();
        let x = cx.tensor("x", (2, 6));
        let w = cx.tensor("w", (6, 7));
        let w2 = cx.tensor("w2", (6, 7));
        let a = cx.tensor("a", (6, 2));
        let b = cx.tensor("b", (2, 7));
        x.matmul(w + a.matmul(b)).output();
        (x.matmul(w) + x.matmul(w2)).output();
        out.push(("adapters", cx.snapshot()));
    }
    {
        let cx = Graph::new();
        let x = cx.tensor("x", (2, 7));
        let w = cx.tensor("w", (7,));
        (x.softmax(1) * w.expand_to((2, 7))).output();
        x.rms_norm(1, 1e-5).output();
        out.push(("rows", simplified(&cx)));
    }
    {
        // Plain attention over heads, written with hl_ops, without a mask and with a causal
        // one (the odd key count makes the online rule's two tiles unequal).
        let cx = Graph::new();
        let q = cx.tensor("q", (2, 5, 3));
        let k = cx.tensor("k", (2, 7, 3));
        let v = cx.tensor("v", (2, 7, 4));
        let scores = q.matmul(k.permute([0, 2, 1])) * 0.5;
        scores.softmax(2).matmul(v).output();
        let (s, t) = (5, 7);
        let key = cx.arange(t).expand(0, s);
        let query = cx.arange(s).expand(1, t);
        let bias = (key - query)
            .le(cx.constant((t - s) as f32))
            .cast(DType::F32)
            .log2();
        (scores + bias.expand(0, 2)).softmax(2).matmul(v).output();
        out.push(("attention", simplified(&cx)));
    }
    {
        // As luminal_nn writes it: [batch, heads, seq, head_dim], grouped-query heads.
        let cx = Graph::new();
        let q = cx.tensor("q", (1, 4, 6, 8));
        let k = cx.tensor("k", (1, 2, 6, 8));
        let v = cx.tensor("v", (1, 2, 6, 8));
        luminal_nn::causal_attention(q, k, v).output();
        out.push(("nn-attention", simplified(&cx)));
    }
    {
        // The same over an f16 KV cache (keys and values widened as the products read them),
        // causal and unmasked.
        let cx = Graph::new();
        let q = cx.tensor("q", (1, 4, 6, 8));
        let k = cx.input("k", (1, 2, 7, 8), DType::F16);
        let v = cx.input("v", (1, 2, 7, 8), DType::F16);
        luminal_nn::causal_attention(q, k, v).output();
        let k4 = cx.input("k4", (1, 4, 7, 8), DType::F16);
        let v4 = cx.input("v4", (1, 4, 7, 8), DType::F16);
        let scores = luminal_nn::scores_product(q, k4) * 0.35;
        luminal_nn::values_product(scores.softmax(-1), v4).output();
        out.push(("nn-attention-f16", simplified(&cx)));
    }
    out
}

/// `classes` with class `c` reduced to its `k`-th e-node.
fn forced(classes: &Classes, c: usize, k: usize) -> Classes {
    let mut f = classes.clone();
    f.nodes[c] = vec![classes.nodes[c][k]];
    f
}

#[test]
fn every_rule_preserves_outputs() {
    let rules = egraph::rules();
    assert!(rules.len() >= 10, "rule files hold {} rules", rules.len());
    let dims = HashMap::new();
    let mut report = vec![];
    for rule in &rules {
        // Rules of the attention file rewrite the previous rule's result: the ones before
        // this one run first (ruleset `setup`), then this one alone.
        let setup: Vec<String> = if rule.ruleset == "attention" {
            rules
                .iter()
                .filter(|r| r.ruleset == "attention")
                .take_while(|r| r.name != rule.name)
                .map(|r| r.text.replace(":ruleset attention", ":ruleset setup"))
                .collect()
        } else {
            vec![]
        };
        let text = format!(
            "(ruleset only)\n(ruleset setup)\n{}\n{}\n",
            setup.join("\n"),
            rule.text
                .replace(&format!(":ruleset {}", rule.ruleset), ":ruleset only")
        );
        let mut fired = 0;
        let mut variants_checked = 0;
        for (gname, g) in graphs() {
            let mut enc = terms::encode(&g, true);
            enc.online_attention = true;
            let mut eg = egraph::seed(&enc, &text).expect("seed");
            let limits = Limits {
                max_enodes: 20_000,
                time: Duration::from_secs(5),
                max_iterations: 8,
            };
            egraph::saturate(&mut eg, &["setup"], &limits, &mut |_, _| {}).expect("setup");
            let run =
                egraph::saturate(&mut eg, &["only"], &limits, &mut |_, _| {}).expect("saturate");
            if run[0].iterations == 1 && run[0].stopped == egraph::StopReason::Saturated {
                continue; // the rule changed nothing on this graph
            }
            let classes = egraph::read_classes(&eg, &enc, &g).expect("classes");
            let inputs = measure::make_inputs(&g, &dims).unwrap();
            let outputs = measure::output_handles(&g);
            let want = measure::reference_outputs(&g, &inputs, &dims, &outputs).unwrap();
            let source_text = enc.dag.to_text();
            for c in 0..classes.nodes.len() {
                if classes.nodes[c].len() < 2 {
                    continue;
                }
                fired += 1;
                for k in 0..classes.nodes[c].len() {
                    let f = forced(&classes, c, k);
                    // A choice that can only be completed through itself (x = copy(x)) has
                    // no finite term: nothing to check.
                    let Ok(dag) = egraph::extract(&f, &enc, &g, &CostWeights::DEFAULT, &dims)
                    else {
                        continue;
                    };
                    if dag.to_text() == source_text {
                        continue;
                    }
                    let Some(g2) = terms::rebuild(&g, &enc, &dag) else {
                        // A forced choice may sit in a class no output reaches any more.
                        continue;
                    };
                    let got = measure::reference_outputs(&g2, &inputs, &dims, &outputs)
                        .unwrap_or_else(|e| panic!("rule {} on {gname}: {e}", rule.name));
                    for (o, (x, y)) in got.iter().zip(&want).enumerate() {
                        let err = measure::error_ratio(x, y);
                        assert!(
                            err <= 1.0,
                            "rule {} on {gname}: output {o} differs ({err:.3e} × tolerance) \
                             choosing {:?} in class {c}",
                            rule.name,
                            classes.nodes[c][k]
                        );
                    }
                    variants_checked += 1;
                }
            }
        }
        report.push(format!(
            "{}: {fired} classes, {variants_checked} variants",
            rule.name
        ));
        assert!(
            fired > 0 && variants_checked > 0,
            "rule {} never fired (or never gave a new graph) on the test graphs",
            rule.name
        );
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn a_wrong_rule_is_caught() {
    // The same check must fail for an unsound rule: x·y = x+y.
    let text = "(ruleset only)\n(rewrite (Bin \"Mul\" a b) (Bin \"Add\" a b) :ruleset only)\n";
    let cx = Graph::new();
    let x = cx.tensor("x", (3, 5));
    let y = cx.tensor("y", (3, 5));
    (x * y).output();
    let g = cx.snapshot();
    let enc = terms::encode(&g, true);
    let mut eg = egraph::seed(&enc, text).unwrap();
    let limits = Limits {
        max_enodes: 1000,
        time: Duration::from_secs(5),
        max_iterations: 4,
    };
    egraph::saturate(&mut eg, &["only"], &limits, &mut |_, _| {}).unwrap();
    let classes = egraph::read_classes(&eg, &enc, &g).unwrap();
    let dims = HashMap::new();
    let inputs = measure::make_inputs(&g, &dims).unwrap();
    let outputs = measure::output_handles(&g);
    let want = measure::reference_outputs(&g, &inputs, &dims, &outputs).unwrap();
    let mut worst = 0f64;
    for c in 0..classes.nodes.len() {
        for k in 0..classes.nodes[c].len() {
            let f = forced(&classes, c, k);
            let dag = egraph::extract(&f, &enc, &g, &CostWeights::DEFAULT, &dims).unwrap();
            let g2 = terms::rebuild(&g, &enc, &dag).unwrap();
            let got = measure::reference_outputs(&g2, &inputs, &dims, &outputs).unwrap();
            worst = worst.max(measure::error_ratio(&got[0], &want[0]));
        }
    }
    assert!(worst > 1.0, "the unsound rule went unnoticed");
}
