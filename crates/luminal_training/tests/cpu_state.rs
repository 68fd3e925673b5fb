//! The CPU backend and in-place optimizer state.
//!
//! An optimizer step reads a state tensor (a parameter, a moment) and writes its next value
//! in the same run. `WriteSlice` expresses that (`state.write_slice(0, 0, next)`): every
//! other reader of the state sees its value from before the run (the CPU backend orders the
//! write after them).

use luminal::prelude::*;
use luminal_cpu::CpuBackend;

/// The smallest read-modify-write of a state input: `s <- s * 0.5 + 1`.
fn halve_and_add_one<B: Backend>(backend: B) -> Result<Vec<f32>> {
    let cx = Graph::new();
    let s = cx.tensor("s", 3);
    let next = s.write_slice(0, 0usize, s * 0.5 + 1.0);
    let mut rt = cx.compile(backend, CompileOptions::default())?;
    rt.set(s, &[2f32, 4., 6.])?;
    rt.run()?;
    rt.run()?;
    rt.get::<f32>(next)
}

#[test]
fn reference_backend_updates_state_read_in_the_same_run() {
    // Two runs of s * 0.5 + 1 from [2, 4, 6]: [2, 3, 4], then [2, 2.5, 3].
    assert_eq!(
        halve_and_add_one(ReferenceBackend).unwrap(),
        vec![2.0, 2.5, 3.0]
    );
}

#[test]
fn cpu_write_slice_read_modify_write_of_state() {
    assert_eq!(
        halve_and_add_one(CpuBackend::with_threads(1)).unwrap(),
        vec![2.0, 2.5, 3.0]
    );
}
