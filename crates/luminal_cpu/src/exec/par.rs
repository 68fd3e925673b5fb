//! The kernel thread pool: `threads - 1` persistent workers plus the thread that calls
//! `run()`, which works too. A parallel loop is published with one atomic store; idle
//! workers spin on that word for a while (kernels of a decode step are tens of
//! microseconds apart, too short to go to sleep and be woken through the kernel), then
//! sleep on a condition variable until the next publication. Tasks are claimed one at a
//! time from a shared counter, so a slow or descheduled thread delays nobody: the caller
//! finishes whatever is left itself. No allocation per loop.
//!
//! Kernels call the free functions below ([`for_each`], [`for_each_chunk`],
//! [`broadcast`], [`threads`]). They run on the pool entered with [`Pool::enter`], and
//! sequentially on the calling thread outside any pool or inside a task (nested loops do
//! not fork again).

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps, and after how long of that it starts
/// yielding its CPU between polls (to any other runnable thread: a busy machine).
const SPIN_FOR: Duration = Duration::from_micros(1000);
const YIELD_AFTER: Duration = Duration::from_micros(50);

/// The published loop, in one word: generation (24 bits) | task count (20) | next task (20).
/// Claiming a task is one compare-exchange that also checks the generation, so a thread
/// that read an older loop's word can never claim a task of the new one by mistake.
const IDX_BITS: u32 = 20;
const MAX_TASKS: usize = (1 << IDX_BITS) - 1;
const IDX_MASK: u64 = MAX_TASKS as u64;

fn pack(generation: u64, n: usize, idx: usize) -> u64 {
    ((generation & 0xff_ffff) << (2 * IDX_BITS)) | ((n as u64) << IDX_BITS) | idx as u64
}
fn generation_of(w: u64) -> u64 {
    w >> (2 * IDX_BITS)
}
fn count_of(w: u64) -> usize {
    ((w >> IDX_BITS) & IDX_MASK) as usize
}
fn index_of(w: u64) -> usize {
    (w & IDX_MASK) as usize
}

/// One parallel loop: `f(task)` for every task; `once` = each thread takes at most one.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    once: bool,
}

struct Shared {
    word: AtomicU64,
    /// The current [`Job`]; valid while any task of the current generation is unfinished
    /// (the publishing thread waits for all of them before it returns).
    job: AtomicPtr<Job<'static>>,
    done: AtomicUsize,
    panicked: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    /// Held by the thread publishing a loop (a second caller runs its loop inline).
    busy: AtomicBool,
    threads: usize,
}

impl Shared {
    /// Claims and runs tasks of `generation` until none are left (one at most for a
    /// `once` job).
    fn work(&self, generation: u64) {
        loop {
            let w = self.word.load(Ordering::Acquire);
            if generation_of(w) != generation || index_of(w) >= count_of(w) {
                return;
            }
            if self
                .word
                .compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // SAFETY: the claim succeeded, so task `index_of(w)` of this generation is not
            // finished and its publisher is still waiting inside `run`, keeping the job
            // (on its stack) alive; the job was stored before the word was published.
            let job = unsafe { &*self.job.load(Ordering::Acquire) };
            if catch_unwind(AssertUnwindSafe(|| (job.f)(index_of(w)))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            let once = job.once;
            self.done.fetch_add(1, Ordering::Release);
            if once {
                return;
            }
        }
    }

    fn worker(&self) {
        IN_TASK.with(|t| t.set(true));
        // Workers start before the first loop is published (generation 1).
        let mut seen = 0;
        loop {
            let start = Instant::now();
            let mut spins = 0u32;
            let generation = loop {
                let g = generation_of(self.word.load(Ordering::Acquire));
                if g != seen {
                    break g;
                }
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                spins = spins.wrapping_add(1);
                if spins % 64 != 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let idle = start.elapsed();
                if idle < YIELD_AFTER {
                    continue;
                }
                if idle < SPIN_FOR {
                    std::thread::yield_now();
                    continue;
                }
                // Sleep. The sleeper count is raised before the word is re-read, and the
                // publisher stores the word before it reads the count (both SeqCst): one
                // of the two sees the other, so no wake-up is lost.
                self.sleepers.fetch_add(1, Ordering::SeqCst);
                let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                while generation_of(self.word.load(Ordering::SeqCst)) == seen
                    && !self.shutdown.load(Ordering::SeqCst)
                {
                    guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                drop(guard);
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
            };
            seen = generation;
            self.work(generation);
        }
    }
}

/// A persistent pool of `threads - 1` workers (see the module docs).
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool running loops on `threads` threads (the caller included).
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            word: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            threads,
        });
        let workers = (1..threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("luminal-cpu-{i}"))
                    .spawn(move || s.worker())
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Pool { shared, workers })
    }

    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Runs `f` with this pool as the one the kernel loops below use.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const Pool);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(self as *const Pool)));
        f()
    }

    /// `f(task)` for `task < n` on all threads; returns when every task has finished.
    fn run(&self, n: usize, once: bool, f: &(dyn Fn(usize) + Sync)) {
        debug_assert!(n <= MAX_TASKS);
        let s = &*self.shared;
        if s.busy.swap(true, Ordering::Acquire) {
            // Another thread entered the same pool and is publishing: run inline.
            return (0..n).for_each(f);
        }
        let job = Job { f, once };
        // Only the holder of `busy` publishes, so the generation can be derived from the word.
        let generation = (generation_of(s.word.load(Ordering::Relaxed)) + 1) & 0xff_ffff;
        // SAFETY (lifetime erasure): the pointer is only dereferenced by a thread holding
        // an unfinished task of this generation, and this function does not return before
        // all `n` tasks have finished.
        let ptr = &job as *const Job<'_> as *mut Job<'static>;
        s.job.store(ptr, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        s.word.store(pack(generation, n, 0), Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let was = IN_TASK.with(|t| t.replace(true));
        s.work(generation);
        IN_TASK.with(|t| t.set(was));
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < n {
            spins = spins.wrapping_add(1);
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        s.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        s.busy.store(false, Ordering::Release);
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("luminal_cpu: a kernel task panicked on a pool thread");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

thread_local! {
    static CURRENT: Cell<*const Pool> = const { Cell::new(std::ptr::null()) };
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

/// The pool loops may fork onto: none inside a task or outside [`Pool::enter`].
fn current() -> Option<&'static Pool> {
    if IN_TASK.with(|t| t.get()) {
        return None;
    }
    let p = CURRENT.with(|c| c.get());
    // SAFETY: `enter` sets the pointer only for the duration of its closure, during which
    // the pool is borrowed and alive.
    (!p.is_null())
        .then(|| unsafe { &*p })
        .filter(|p| p.threads() > 1)
}

/// Threads the kernels may use (1 when loops run sequentially).
pub fn threads() -> usize {
    current().map_or(1, Pool::threads)
}

/// `f(task)` for every `task < n`, in parallel when a pool is entered.
pub fn for_each(n: usize, f: impl Fn(usize) + Sync) {
    match current() {
        Some(pool) if n > 1 => {
            if n <= MAX_TASKS {
                pool.run(n, false, &f);
            } else {
                let per = n.div_ceil(MAX_TASKS);
                pool.run(n.div_ceil(per), false, &|t| {
                    (t * per..((t + 1) * per).min(n)).for_each(&f)
                });
            }
        }
        _ => (0..n).for_each(f),
    }
}

/// `f(index, chunk)` for every `chunk`-sized piece of `data`, in parallel when a pool is
/// entered (and there is more than one piece).
pub fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    let chunk = chunk.max(1);
    let len = data.len();
    let base = SendPtr(data.as_mut_ptr());
    for_each(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        let end = (start + chunk).min(len);
        let base = &base;
        // SAFETY: tasks get disjoint ranges `start..end` of `data`, which outlives the
        // loop (borrowed mutably for this call).
        let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
        f(i, piece)
    });
}

struct SendPtr<T>(*mut T);
// SAFETY: used only to hand disjoint sub-slices of a `&mut [T: Send]` to tasks.
unsafe impl<T: Send> Sync for SendPtr<T> {}

/// Runs `f` once on every thread of the entered pool (once on the caller otherwise).
pub fn broadcast(f: impl Fn() + Sync) {
    match current() {
        Some(pool) => pool.run(pool.threads(), true, &|_| f()),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once_and_nested_loops_stay_inline() {
        let pool = Pool::new(3).unwrap();
        pool.enter(|| {
            for n in [0usize, 1, 2, 7, 1000] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                for_each(n, |i| {
                    // A single task runs on the caller as is, and may fork itself.
                    assert_eq!(threads(), if n == 1 { 3 } else { 1 }, "nested loops");
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "n = {n}"
                );
            }
            let mut data = vec![0usize; 1001];
            for_each_chunk(&mut data, 10, |i, c| c.iter_mut().for_each(|x| *x += i + 1));
            for (j, x) in data.iter().enumerate() {
                assert_eq!(*x, j / 10 + 1);
            }
        });
    }

    #[test]
    fn broadcast_reaches_every_thread_and_sleepers_wake() {
        let pool = Pool::new(4).unwrap();
        // Long enough for the workers to go to sleep between loops.
        for _ in 0..3 {
            std::thread::sleep(SPIN_FOR * 3);
            let names = Mutex::new(std::collections::BTreeSet::new());
            pool.enter(|| {
                broadcast(|| {
                    let id = format!("{:?}", std::thread::current().id());
                    names.lock().unwrap().insert(id);
                })
            });
            assert_eq!(names.lock().unwrap().len(), 4);
        }
    }

    #[test]
    fn a_panicking_task_panics_the_caller_not_the_pool() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.enter(|| for_each(8, |i| assert!(i != 5, "task 5")))
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.enter(|| {
            for_each(8, |_| {
                count.fetch_add(1, Ordering::Relaxed);
            })
        });
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn outside_a_pool_loops_are_sequential() {
        assert_eq!(threads(), 1);
        let order = Mutex::new(Vec::new());
        for_each(5, |i| order.lock().unwrap().push(i));
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }
}
