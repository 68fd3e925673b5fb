//! The CPU backend's choices for `luminal_search` ([`luminal::Tunable`]): how many threads
//! a plan runs on, and which kernel-merging passes run (`rows`: a last-axis reduction fused
//! with its producers and consumers; `shared`: a multi-consumer producer recomputed inside
//! its consumers). Each trades memory traffic against recomputation or parallel grain, and
//! which wins depends on the shapes, so the search times them.
//!
//! One kernel-level knob: how many of the plan's threads the matrix products use (`mm=1`:
//! products run single-threaded while the other kernels keep the pool; for plans of small
//! products, where splitting a product costs more than it saves).
//!
//! A schedule is named `threads=N;off=a,b[;mm=M]` (`off=` lists passes switched off on top
//! of the backend's own [`CpuBackend::disable_rules`]; `mm` absent: products use every
//! thread), so a cached result is reapplied by name.

use crate::{detected_isa, CpuBackend, CpuRuntime};
use luminal::{Backend, CompileOptions, FusedTerm, GraphData, Tunable};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// The pass sets a schedule may switch off.
const PASS_CHOICES: &[&[&str]] = &[&[], &["rows"], &["shared"], &["rows", "shared"]];

fn available_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `disable_rules` takes a `'static` list; the few lists schedules make are interned once.
fn intern(names: BTreeSet<&'static str>) -> &'static [&'static str] {
    static LISTS: Mutex<Vec<&'static [&'static str]>> = Mutex::new(Vec::new());
    let names: Vec<&'static str> = names.into_iter().collect();
    let mut lists = LISTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = lists.iter().find(|l| **l == names.as_slice()) {
        return l;
    }
    let leaked: &'static [&'static str] = Box::leak(names.into_boxed_slice());
    lists.push(leaked);
    leaked
}

impl CpuBackend {
    fn thread_count(&self) -> usize {
        self.threads.unwrap_or_else(available_threads).max(1)
    }
}

impl Tunable for CpuBackend {
    fn tuning_id(&self) -> String {
        format!(
            "cpu-{}/isa={:?}/cores={}/threads={:?}/mm={:?}/qdots={:?}/off={}",
            env!("CARGO_PKG_VERSION"),
            detected_isa(),
            available_threads(),
            self.threads,
            self.matmul_threads,
            self.quant_dots.resolved(),
            self.disabled_rules.join(",")
        )
    }

    fn schedules(&self, _graph: &GraphData) -> Vec<String> {
        let current = self.thread_count();
        let mut threads = vec![current];
        for t in [1, available_threads()] {
            if !threads.contains(&t) {
                threads.push(t);
            }
        }
        let mm = |m: Option<usize>| m.map_or(String::new(), |m| format!(";mm={m}"));
        let mut out = vec![];
        for &t in &threads {
            for off in PASS_CHOICES {
                if off.iter().all(|p| self.disabled_rules.contains(p)) && !off.is_empty() {
                    continue; // already off: the same plan as `off=`
                }
                out.push(format!(
                    "threads={t};off={}{}",
                    off.join(","),
                    mm(self.matmul_threads)
                ));
            }
        }
        // The kernel-level knob, on the backend's own thread count and passes.
        if current > 1 && self.matmul_threads != Some(1) {
            out.push(format!("threads={current};off=;mm=1"));
        }
        out
    }

    fn schedule(&self, name: &str) -> Option<CpuBackend> {
        let mut threads = None;
        let mut matmul_threads = None;
        let mut off: BTreeSet<&'static str> = self.disabled_rules.iter().copied().collect();
        for part in name.split(';') {
            let (key, value) = part.split_once('=')?;
            match key {
                "threads" => threads = Some(value.parse::<usize>().ok().filter(|&t| t >= 1)?),
                "mm" => matmul_threads = Some(value.parse::<usize>().ok().filter(|&t| t >= 1)?),
                "off" => {
                    for p in value.split(',').filter(|p| !p.is_empty()) {
                        let known = PASS_CHOICES
                            .iter()
                            .flat_map(|c| c.iter())
                            .find(|k| **k == p)?;
                        off.insert(known);
                    }
                }
                _ => return None,
            }
        }
        Some(CpuBackend {
            threads: Some(threads?),
            disabled_rules: intern(off),
            matmul_threads,
            ..*self
        })
    }

    fn supports(&self, term: &str) -> bool {
        match term {
            // Products are recognised from their broadcast-multiply + sum pattern and run by
            // gemm.
            "matmul" => !self.disabled_rules.contains(&"matmul"),
            // Attention as one online-softmax recurrence over tiles of keys, the operands
            // named by the search (`lower/terms.rs`): the tiled kernel of `kernels/attention.rs`,
            // whether or not the hand `attention` rule is on.
            "online_attention" => !self.disabled_rules.contains(&"terms"),
            _ => false,
        }
    }

    fn compile_terms(
        &self,
        graph: GraphData,
        terms: &[FusedTerm],
        options: &CompileOptions,
    ) -> luminal::Result<CpuRuntime> {
        crate::lower::with_terms(terms, || self.compile(graph, options))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_back_and_keep_disabled_rules() {
        let b = CpuBackend::with_threads(1).disable_rules(&["concat"]);
        let g = GraphData::default();
        let names = b.schedules(&g);
        assert!(names[0].starts_with("threads=1;"));
        for n in &names {
            let s = b
                .schedule(n)
                .unwrap_or_else(|| panic!("{n} does not parse"));
            assert!(s.disabled_rules.contains(&"concat"), "{n}");
        }
        let s = b.schedule("threads=2;off=rows,shared").unwrap();
        assert_eq!(s.threads, Some(2));
        assert_eq!(s.disabled_rules, &["concat", "rows", "shared"]);
        assert!(b.schedule("threads=0;off=").is_none());
        let m = b.schedule("threads=2;off=;mm=1").unwrap();
        assert_eq!((m.threads, m.matmul_threads), (Some(2), Some(1)));
        assert_eq!(b.schedule("threads=2;off=").unwrap().matmul_threads, None);
        assert!(b.schedule("threads=2;off=;mm=0").is_none());
        // The knob is offered where there is more than one thread, and parses back.
        let two = CpuBackend::with_threads(2);
        let names = two.schedules(&g);
        assert!(names.iter().any(|n| n.ends_with(";mm=1")), "{names:?}");
        assert_eq!(two.schedule(&names[0]).unwrap().matmul_threads, None);
        assert!(b.schedule("threads=2;off=fallback").is_none());
    }

    /// A product with an epilogue on `backend`, on fixed data.
    fn product_on<B: Backend>(backend: B) -> (Vec<f32>, Vec<String>)
    where
        B::Runtime: KernelNames,
    {
        use luminal::prelude::*;
        let data = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 37) % 23) as f32 / 11.0 - 1.0)
                .collect()
        };
        let cx = Graph::new();
        let a = cx.tensor("a", (67, 130));
        let b = cx.tensor("b", (130, 45));
        let y = (a.matmul(b).relu() + 1.0).output();
        let mut rt = cx.compile(backend, CompileOptions::default()).unwrap();
        rt.set(a, &data(67 * 130)).unwrap();
        rt.set(b, &data(130 * 45)).unwrap();
        rt.run().unwrap();
        (rt.get::<f32>(y).unwrap(), rt.names())
    }

    trait KernelNames {
        fn names(&self) -> Vec<String>;
    }
    impl KernelNames for CpuRuntime {
        fn names(&self) -> Vec<String> {
            self.kernel_names()
        }
    }
    impl KernelNames for luminal::ReferenceRuntime {
        fn names(&self) -> Vec<String> {
            vec![]
        }
    }

    #[test]
    fn single_threaded_products_equal_the_reference() {
        let knob = CpuBackend::with_threads(2)
            .schedule("threads=2;off=;mm=1")
            .unwrap();
        let (want, _) = product_on(luminal::ReferenceBackend);
        let (got, names) = product_on(knob);
        assert!(names.iter().any(|n| n.starts_with("matmul")), "{names:?}");
        for (x, w) in got.iter().zip(&want) {
            assert!((x - w).abs() <= 1e-4 * w.abs().max(1.0), "{x} vs {w}");
        }
    }
}
