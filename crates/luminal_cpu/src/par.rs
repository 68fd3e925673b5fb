//! Parallel loops that run sequentially on the calling thread for a one-thread runtime:
//! such a runtime executes its kernels on the caller (no hand-off to a pool thread and
//! back, which costs tens of microseconds per run on small graphs), and these helpers keep
//! the kernels off rayon's global pool there.

use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    static SEQUENTIAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the helpers below sequential on this thread.
pub fn sequential<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SEQUENTIAL.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SEQUENTIAL.with(|s| s.replace(true)));
    f()
}

fn is_sequential() -> bool {
    SEQUENTIAL.with(|s| s.get())
}

/// Threads the kernels may use.
pub fn threads() -> usize {
    if is_sequential() {
        1
    } else {
        rayon::current_num_threads().max(1)
    }
}

/// `f(index, chunk)` for every `chunk`-sized piece of `data`, in parallel unless sequential
/// (or a single piece).
pub fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    if is_sequential() || data.len() <= chunk {
        data.chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    }
}

/// Runs `f` on every thread that may run kernels.
pub fn broadcast(f: impl Fn() + Sync) {
    if is_sequential() {
        f()
    } else {
        rayon::broadcast(|_| f());
    }
}
