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
//! Two more kernel-level knobs of the f32 products, offered when the graph has a product that
//! runs on the blocked GEMM (more rows than a skinny product's):
//! the axis a single large product is split along across threads (`split=m`: rows of A,
//! each thread packing all of B; `split=n`: columns of B; `split=k`: whole `KC` slices of
//! K, added afterwards in order; absent: K for products much deeper than long and wide,
//! else N when it is wide enough, else M), and the products' cache blocking (`tiles=KCxMC`: `KC`-deep slices of K and
//! `MC`-row blocks of A; absent: 256 × 144), which trades packing traffic against cache
//! residency and depends on the shapes.
//!
//! A schedule is named `threads=N;off=a,b[;mm=M][;split=m|n|k][;tiles=KCxMC]` (`off=` lists
//! passes switched off on top of the backend's own [`CpuBackend::disable_rules`]; `mm`
//! absent: products use every thread), so a cached result is reapplied by name.

use crate::{detected_isa, CpuBackend, CpuRuntime, MatmulSplit, MatmulTiles};
use luminal::{Backend, CompileOptions, FusedTerm, GraphData, Tunable};
use std::collections::BTreeSet;
use std::sync::Mutex;

/// The cache blockings (`KC`, `MC`) offered besides the default.
const TILE_CHOICES: &[(usize, usize)] = &[(512, 288), (128, 72)];

/// Whether `graph` has a product that runs on the blocked GEMM (the broadcast multiply + sum
/// over K that `matmul` builds, `[.., M, N, K]`, with M not known to be a skinny product's
/// few rows): where the split and blocking knobs change anything.
fn has_gemm_product(graph: &GraphData) -> bool {
    use luminal::op::{BinaryOp, Op, ReduceOp};
    let skinny = crate::kernels::matmul::skinny::MAX_ROWS as i64;
    graph.node_ids().any(|id| {
        let n = graph.node(id);
        matches!(
            n.op,
            Op::Reduce {
                op: ReduceOp::Sum,
                ..
            }
        ) && n.inputs.first().is_some_and(|e| {
            let p = graph.node(e.node);
            let r = p.shape.len();
            p.op == Op::Binary(BinaryOp::Mul)
                && r >= 3
                && p.shape[r - 3].as_constant().is_none_or(|m| m > skinny)
        })
    })
}

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
            "cpu-{}/isa={:?}/amx={}/cores={}/threads={:?}/mm={:?}/split={:?}/tiles={:?}/prec={:?}/qdots={:?}/off={}",
            env!("CARGO_PKG_VERSION"),
            detected_isa(),
            crate::kernels::matmul::gemm_f32::amx_active(),
            available_threads(),
            self.threads,
            self.matmul_threads,
            self.matmul_split,
            self.matmul_tiles,
            self.matmul_precision.resolved(),
            self.quant_dots.resolved(),
            self.disabled_rules.join(",")
        )
    }

    fn schedules(&self, graph: &GraphData) -> Vec<String> {
        let current = self.thread_count();
        let mut threads = vec![current];
        for t in [1, available_threads()] {
            if !threads.contains(&t) {
                threads.push(t);
            }
        }
        // The backend's own kernel knobs, kept by every schedule that does not change them.
        let split = |s: MatmulSplit| match s {
            MatmulSplit::Auto => "",
            MatmulSplit::Rows => ";split=m",
            MatmulSplit::Cols => ";split=n",
            MatmulSplit::Depth => ";split=k",
        };
        let tiles = |t: Option<MatmulTiles>| {
            t.map_or(String::new(), |t| format!(";tiles={}x{}", t.kc, t.mc))
        };
        let own = format!("{}{}", split(self.matmul_split), tiles(self.matmul_tiles));
        let mm_only = |m: Option<usize>| m.map_or(String::new(), |m| format!(";mm={m}"));
        let mm = |m: Option<usize>| mm_only(m) + &own;
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
        // The kernel-level knobs, on the backend's own thread count and passes.
        if current > 1 && self.matmul_threads != Some(1) {
            out.push(format!("threads={current};off=;mm=1{own}"));
        }
        if has_gemm_product(graph) {
            let base = format!("threads={current};off={}", mm_only(self.matmul_threads));
            if current > 1 {
                for s in [MatmulSplit::Rows, MatmulSplit::Cols, MatmulSplit::Depth] {
                    if s != self.matmul_split {
                        out.push(format!("{base}{}{}", split(s), tiles(self.matmul_tiles)));
                    }
                }
            }
            for &(kc, mc) in TILE_CHOICES {
                let t = Some(MatmulTiles { kc, mc });
                if t != self.matmul_tiles {
                    out.push(format!("{base}{}{}", split(self.matmul_split), tiles(t)));
                }
            }
        }
        out
    }

    fn schedule(&self, name: &str) -> Option<CpuBackend> {
        let mut threads = None;
        let mut matmul_threads = None;
        let mut matmul_split = MatmulSplit::Auto;
        let mut matmul_tiles = None;
        let mut off: BTreeSet<&'static str> = self.disabled_rules.iter().copied().collect();
        for part in name.split(';') {
            let (key, value) = part.split_once('=')?;
            match key {
                "threads" => threads = Some(value.parse::<usize>().ok().filter(|&t| t >= 1)?),
                "mm" => matmul_threads = Some(value.parse::<usize>().ok().filter(|&t| t >= 1)?),
                "split" => {
                    matmul_split = match value {
                        "m" => MatmulSplit::Rows,
                        "n" => MatmulSplit::Cols,
                        "k" => MatmulSplit::Depth,
                        _ => return None,
                    }
                }
                "tiles" => {
                    let (kc, mc) = value.split_once('x')?;
                    let (kc, mc) = (kc.parse::<usize>().ok()?, mc.parse::<usize>().ok()?);
                    if !(16..=4096).contains(&kc) || !(12..=4096).contains(&mc) {
                        return None;
                    }
                    matmul_tiles = Some(MatmulTiles { kc, mc });
                }
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
            matmul_split,
            matmul_tiles,
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

    fn checking(&self) -> Option<CpuBackend> {
        // Int8 activations round each product's inputs: a candidate that reorders a sum
        // moves some roundings by one step, and thirty layers amplify that past any float
        // tolerance (SmolLM2, 512-token prefill: logits 0.3 apart between two exact
        // attention plans with int8 activations, 0.003 with f32 ones).
        (self.quant_dots.resolved() != crate::QuantDots::F32)
            .then(|| self.quant_dots(crate::QuantDots::F32))
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
        // The products' split axis and blocking parse back and are offered for a graph
        // with a product, keeping the backend's own passes.
        let s = b.schedule("threads=2;off=;split=m;tiles=512x288").unwrap();
        assert_eq!(s.matmul_split, MatmulSplit::Rows);
        assert_eq!(s.matmul_tiles, Some(MatmulTiles { kc: 512, mc: 288 }));
        assert_eq!(
            b.schedule("threads=2;off=;split=n").unwrap().matmul_split,
            MatmulSplit::Cols
        );
        assert_eq!(
            b.schedule("threads=2;off=;split=k").unwrap().matmul_split,
            MatmulSplit::Depth
        );
        for bad in [
            "split=x",
            "tiles=512",
            "tiles=8x8",
            "tiles=512x0",
            "tiles=axb",
        ] {
            assert!(
                b.schedule(&format!("threads=2;off=;{bad}")).is_none(),
                "{bad}"
            );
        }
        let cx = luminal::prelude::Graph::new();
        let x = cx.tensor("x", (24, 16));
        let w = cx.tensor("w", (16, 4));
        x.matmul(w).output();
        let names = two.schedules(&cx.snapshot());
        for knob in [";split=m", ";split=n", ";tiles=512x288", ";tiles=128x72"] {
            assert!(names.iter().any(|n| n.ends_with(knob)), "{knob}: {names:?}");
        }
        assert!(!two.schedules(&g).iter().any(|n| n.contains("tiles")));
        // A skinny product (a decode step's few rows) runs no blocked GEMM: no knobs.
        let cx = luminal::prelude::Graph::new();
        cx.tensor("x", (1, 16))
            .matmul(cx.tensor("w", (16, 4)))
            .output();
        assert!(!two
            .schedules(&cx.snapshot())
            .iter()
            .any(|n| n.contains("tiles") || n.contains("split")));
        // A backend with a schedule applied names itself the same way (passes switched off
        // become its own, so only schedules that switch none off are compared).
        for n in names
            .iter()
            .filter(|n| n.contains("off=;") || n.ends_with("off="))
        {
            assert_eq!(two.schedule(n).unwrap().schedules(&g)[0], *n, "{n}");
        }
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
    fn candidates_are_checked_with_f32_activations() {
        use crate::QuantDots;
        if std::env::var("LUMINAL_CPU_QDOT").is_ok() {
            return; // the environment overrides every backend's choice
        }
        let int8 = CpuBackend::with_threads(2).quant_dots(QuantDots::Int8RefineOutputs);
        let exact = int8.checking().expect("an exact variant");
        assert_eq!(exact.quant_dots.resolved(), QuantDots::F32);
        assert_eq!(
            (exact.threads, exact.disabled_rules),
            (int8.threads, int8.disabled_rules)
        );
        assert!(exact.checking().is_none());
    }

    #[test]
    fn products_under_every_split_and_blocking_equal_the_reference() {
        let (want, _) = product_on(luminal::ReferenceBackend);
        for name in [
            "threads=2;off=;split=m",
            "threads=2;off=;split=n",
            "threads=2;off=;tiles=512x288",
            "threads=2;off=;tiles=128x72",
            "threads=2;off=;split=m;tiles=16x12",
            "threads=1;off=;tiles=32x24",
        ] {
            let knob = CpuBackend::default().schedule(name).unwrap();
            let (got, names) = product_on(knob);
            assert!(names.iter().any(|n| n.starts_with("matmul")), "{names:?}");
            for (x, w) in got.iter().zip(&want) {
                assert!(
                    (x - w).abs() <= 1e-4 * w.abs().max(1.0),
                    "{name}: {x} vs {w}"
                );
            }
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
