//! The op suite compiled through the whole search (saturation, extraction, candidates
//! checked against the reference and timed, the winner compiled) on the CPU backend: every
//! case's plan must still give numpy's values. A small budget keeps it quick. The `dynamic`
//! family is left out: a search needs values for dynamic dims up front (tested in
//! `search.rs`), which the suite only binds at run time.

use luminal::testing::{check_state_update, check_write_slice, run_family, FAMILIES};
use luminal::SearchBudget;
use luminal_cpu::CpuBackend;
use luminal_search::Search;
use std::time::Duration;

fn budget() -> SearchBudget {
    SearchBudget {
        time: Duration::from_millis(300),
        max_candidates: 3,
        repeats: 1,
        use_cache: false,
        ..SearchBudget::default()
    }
}

fn searched() -> Search<CpuBackend> {
    Search::new(CpuBackend::default()).with_budget(budget())
}

#[test]
fn op_suite_through_search() {
    for family in FAMILIES.iter().filter(|f| **f != "dynamic") {
        run_family(family, searched);
    }
}

#[test]
fn state_through_search() {
    // The state checks bind "p" and "s" at run time; the search times p = 1, s = 2.
    let with_dims =
        || Search::new(CpuBackend::default()).with_budget(budget().dim("p", 1).dim("s", 2));
    check_write_slice(with_dims());
    check_state_update(with_dims());
}

/// Casts into quantized types and a quantized state (a q8_0 KV cache) through the search.
#[test]
fn quantized_state_through_search() {
    let with_dims =
        || Search::new(CpuBackend::default()).with_budget(budget().dim("p", 1).dim("s", 2));
    luminal::testing::check_quantized_cast(searched());
    luminal::testing::check_quantized_state(with_dims());
}
