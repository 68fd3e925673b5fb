//! A counting global allocator for "makes no heap allocation" tests.
//!
//! ```ignore
//! use luminal::testing::CountingAlloc;
//! #[global_allocator]
//! static ALLOC: CountingAlloc = CountingAlloc::new();
//! // ...
//! ALLOC.start();
//! step();
//! assert_eq!(ALLOC.stop(), 0);
//! ```
//!
//! Every thread's allocations count while counting is on (the counter is process-wide, so
//! tests that count must not run concurrently with other allocating tests of the binary).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Forwards to the system allocator and, between [`start`](Self::start) and
/// [`stop`](Self::stop), counts allocations and reallocations.
pub struct CountingAlloc {
    counting: AtomicBool,
    count: AtomicUsize,
}

impl CountingAlloc {
    pub const fn new() -> Self {
        CountingAlloc {
            counting: AtomicBool::new(false),
            count: AtomicUsize::new(0),
        }
    }

    /// Resets the count to zero and starts counting.
    pub fn start(&self) {
        self.count.store(0, Ordering::SeqCst);
        self.counting.store(true, Ordering::SeqCst);
    }

    /// Stops counting; returns the allocations since [`start`](Self::start).
    pub fn stop(&self) -> usize {
        self.counting.store(false, Ordering::SeqCst);
        self.count.load(Ordering::SeqCst)
    }

    fn note(&self) {
        if self.counting.load(Ordering::Relaxed) {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Default for CountingAlloc {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        self.note();
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        self.note();
        System.realloc(p, l, n)
    }
}
