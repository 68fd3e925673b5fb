//! A whole model under search: compile time cold and from the cache, and decode speed
//! against the hand lowering.
//!
//! `cargo run --release -p luminal_search --example model_search -- MODEL.gguf [budget_s] [attention]`
//! (`attention`: the backend's hand attention rule off on both sides)
//!
//! The search times the decode shape (`s = 1`, 64 cached positions). Its cache goes to a
//! fresh folder under the temp dir, so the first compile is cold.

use luminal::prelude::*;
use luminal_cpu::CpuBackend;
use luminal_models::{LlamaModel, LoadOptions, Model};
use luminal_search::Search;
use std::time::{Duration, Instant};

fn decode_tok_s<R: Runtime>(m: &mut LlamaModel<R>, steps: usize) -> f64 {
    m.reset();
    let mut logits = vec![];
    m.forward_into(&[1; 64], 1, &mut logits).unwrap();
    let t0 = Instant::now();
    for i in 0..steps {
        m.forward_into(&[(i % 100) as u32 + 2], 1, &mut logits)
            .unwrap();
    }
    steps as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .expect("usage: model_search MODEL.gguf [budget_s]");
    let budget_s: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    // Optional: hand rules switched off on both sides (e.g. `attention`: the search must
    // derive the attention kernel itself).
    let off: &'static [&'static str] = match args.get(2).map(String::as_str) {
        Some("attention") => &["attention"],
        Some(other) => panic!("unknown rule list {other} (known: attention)"),
        None => &[],
    };
    let backend = CpuBackend::default().disable_rules(off);
    let opts = LoadOptions {
        max_ctx: 256,
        ..Default::default()
    };
    let cache = std::env::temp_dir().join(format!("luminal-model-search-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let budget = SearchBudget {
        time: Duration::from_secs(budget_s),
        ..SearchBudget::default()
    }
    .dim("s", 1)
    .dim("p", 64)
    .dim("n_out", 1);

    let t0 = Instant::now();
    let (mut hand, _) = LlamaModel::load(path, backend, &opts, |_, _| {}).unwrap();
    let hand_load = t0.elapsed();

    let mut searched = vec![];
    for pass in ["cold", "cached"] {
        let s = Search::new(backend)
            .cache_dir(&cache)
            .with_budget(budget.clone());
        let h = s.report_handle();
        let t0 = Instant::now();
        let (m, _) = LlamaModel::load(path, s, &opts, |_, _| {}).unwrap();
        let load = t0.elapsed();
        let report = h.lock().unwrap().take().unwrap();
        println!(
            "{pass}: load + compile {:.2} s (hand lowering: {:.2} s)",
            load.as_secs_f64(),
            hand_load.as_secs_f64()
        );
        println!("{report}");
        searched.push(m);
    }
    let mut m = searched.pop().unwrap();
    let (mut th, mut ts) = (vec![], vec![]);
    for _ in 0..3 {
        th.push(decode_tok_s(&mut hand, 32));
        ts.push(decode_tok_s(&mut m, 32));
    }
    th.sort_by(f64::total_cmp);
    ts.sort_by(f64::total_cmp);
    println!(
        "decode: hand {:.1} tok/s, search {:.1} tok/s ({:.2}×), median of 3 × 32 steps, alternating",
        th[1],
        ts[1],
        ts[1] / th[1]
    );
    let _ = std::fs::remove_dir_all(&cache);
}
