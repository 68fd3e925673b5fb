//! # luminal_search: search-based compilation
//!
//! A compiler over the graph that tries alternatives instead of trusting one lowering:
//!
//! 1. **Terms** ([`terms`]): the (generically optimised) primop graph becomes a hash-consed
//!    term DAG — primops over views, products recognised as `MatMul`, everything else kept
//!    opaque — and any extracted DAG is rebuilt into a graph.
//! 2. **Bounded saturation** ([`egraph`]): the terms seed an egglog e-graph; the rule files
//!    in `src/rules/*.egg` run in stages (`movement`, `algebra`, `reassociate`,
//!    `attention`: softmax·V reorganised into an online max/sum recurrence over tiles of
//!    keys with the scores inside, see [`attention`]), each until
//!    it saturates, the e-graph reaches [`SearchBudget::max_enodes`], or its share of the
//!    time runs out. An `indicatif` progress line shows the stage, e-nodes and candidates
//!    timed (on a terminal).
//! 3. **Extraction by measurement** ([`measure`]): a cost model picks the cheapest graph
//!    under a few weightings; each graph variant × each schedule the backend offers
//!    ([`luminal::Tunable`]: threads, which fusion passes run) is a candidate. Candidates
//!    are compiled on the backend (extracted terms the backend runs fused, such as
//!    `online_attention`, are handed to it as [`luminal::FusedTerm`]s through
//!    [`luminal::Tunable::compile_terms`]), run on random inputs of the real shapes and checked
//!    against the reference runtime (the op suite's tolerances); the ones that pass are
//!    timed, interleaved round by round, and the fastest median wins — the backend's own
//!    plan (candidate 0) unless another is at least 3% faster.
//! 4. **Cache** ([`cache`]): the choice is stored on disk under a key of graph, shape
//!    bucket, backend, ISA and crate version; the next compile of the same graph rebuilds
//!    it without searching.
//!
//! ```no_run
//! use luminal::prelude::*;
//! use luminal_search::Search;
//! # fn demo<B: luminal::Tunable>(cpu: B) -> luminal::Result<()> {
//! let cx = Graph::new();
//! let a = cx.tensor("a", (64, 64));
//! let b = cx.tensor("b", (64, 64));
//! let c = a.matmul(b).output();
//! let search = Search::new(cpu);
//! let report = search.report_handle();
//! let mut rt = cx.compile(search, CompileOptions::search(SearchBudget::default()))?;
//! println!("{}", report.lock().unwrap().as_ref().unwrap());
//! # Ok(()) }
//! ```
//!
//! `CompileOptions::default()` never searches (the wrapper then is the plain backend).
//! Set `LUMINAL_SEARCH_LOG=1` to print every search's report to stderr.

pub mod attention;
pub mod cache;
pub mod egraph;
pub mod fold;
pub mod measure;
pub mod terms;

use egraph::{CostWeights, Limits, StageReport};
use indicatif::{ProgressBar, ProgressStyle};
use luminal::{
    Backend, CompileOptions, FusedTerm, GraphData, LuminalError, Result, SearchBudget, Tunable,
};
use measure::{Candidate, CandidateReport, Outcome};
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much faster than the backend's own plan a candidate must be to replace it.
pub const MARGIN: f64 = 0.03;

/// Graphs whose cost (multiply-adds, roughly) is above this are checked against the
/// backend's own plan instead of the reference runtime (see [`SearchReport::checked_against`]).
pub const REFERENCE_LIMIT: f64 = 3e7;

/// The rulesets, in the order the stages run them.
pub const STAGES: &[&str] = &["movement", "algebra", "reassociate", "attention"];

/// A search-based compile's account of itself.
#[derive(Clone, Debug, Default)]
pub struct SearchReport {
    pub cache_key: String,
    pub cache_path: Option<PathBuf>,
    /// The plan came from the cache: nothing was searched.
    pub from_cache: bool,
    pub stages: Vec<StageReport>,
    /// Identical segments folded before seeding (see [`fold`]): instances, terms per
    /// segment, and the terms of the whole graph and of what was seeded.
    pub folded: Option<FoldReport>,
    /// E-classes and e-nodes of the saturated e-graph.
    pub eclasses: usize,
    pub enodes: usize,
    pub candidates: Vec<CandidateReport>,
    /// Index into `candidates` of the winner (`None` from the cache).
    pub chosen: Option<usize>,
    pub schedule: String,
    pub variant: String,
    /// The fused terms of the chosen plan (e.g. `online_attention`), one entry per node.
    pub fused: Vec<String>,
    /// What candidates' outputs were compared with.
    pub checked_against: String,
    pub total: Duration,
}

impl SearchReport {
    fn median(&self, i: usize) -> Option<Duration> {
        match self.candidates.get(i)?.outcome {
            Outcome::Timed { median, .. } => Some(median),
            _ => None,
        }
    }
    /// Median time of the backend's own plan and of the chosen one.
    pub fn baseline_time(&self) -> Option<Duration> {
        self.median(0)
    }
    pub fn chosen_time(&self) -> Option<Duration> {
        self.median(self.chosen?)
    }
    /// Baseline time over chosen time (> 1: the search found something faster).
    pub fn speedup(&self) -> Option<f64> {
        Some(self.baseline_time()?.as_secs_f64() / self.chosen_time()?.as_secs_f64())
    }
}

impl fmt::Display for SearchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "luminal_search: key {} ({}), {:.2} s",
            self.cache_key,
            if self.from_cache {
                "from the cache"
            } else {
                "searched"
            },
            self.total.as_secs_f64()
        )?;
        for s in &self.stages {
            writeln!(
                f,
                "  stage {:<12} {:>3} iterations, {:>7} e-nodes, {:?} after {:.3} s",
                s.name,
                s.iterations,
                s.enodes,
                s.stopped,
                s.elapsed.as_secs_f64()
            )?;
        }
        if let Some(fr) = &self.folded {
            writeln!(
                f,
                "  folded: {} identical segments of {} terms searched once ({} of {} terms seeded)",
                fr.instances, fr.period, fr.seeded_terms, fr.source_terms
            )?;
        }
        if !self.stages.is_empty() {
            writeln!(
                f,
                "  e-graph: {} e-classes, {} e-nodes",
                self.eclasses, self.enodes
            )?;
            writeln!(f, "  outputs checked against {}", self.checked_against)?;
        }
        for (i, c) in self.candidates.iter().enumerate() {
            let what = match &c.outcome {
                Outcome::Timed { median, runs } => format!(
                    "{:>10.3} ms median of {runs}{}",
                    median.as_secs_f64() * 1e3,
                    match c.confirmed {
                        Some(true) => ", confirmed head to head",
                        Some(false) => ", lost head to head",
                        None => "",
                    }
                ),
                Outcome::Rejected(why) => format!("rejected: {why}"),
                Outcome::NotTried => "not tried (budget)".to_string(),
            };
            writeln!(
                f,
                "  {} {:<2} {:<20} {:<26} cost {:>12.0}  err {:>9}  {what}",
                if Some(i) == self.chosen { "*" } else { " " },
                i,
                c.variant,
                c.schedule,
                c.cost,
                c.error.map_or("-".to_string(), |e| format!("{e:.2e}")),
            )?;
        }
        write!(f, "  chosen: {} with {}", self.variant, self.schedule)?;
        if !self.fused.is_empty() {
            let mut names: Vec<&String> = self.fused.iter().collect();
            names.sort();
            names.dedup();
            let counted: Vec<String> = names
                .iter()
                .map(|n| format!("{n} ×{}", self.fused.iter().filter(|f| f == n).count()))
                .collect();
            write!(f, ", fused terms: {}", counted.join(", "))?;
        }
        if let Some(s) = self.speedup() {
            write!(f, " ({s:.2}× the backend's own plan)")?;
        }
        Ok(())
    }
}

/// What [`fold`] did to a search's graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldReport {
    pub instances: usize,
    pub period: usize,
    pub source_terms: usize,
    pub seeded_terms: usize,
}

/// Where a [`Search`] leaves the report of its last compile.
pub type ReportHandle = Arc<Mutex<Option<SearchReport>>>;

/// A backend that searches when [`CompileOptions::search`] is set (and is the plain
/// backend otherwise).
#[derive(Clone, Debug)]
pub struct Search<B> {
    pub backend: B,
    /// Cache directory (default: [`cache::default_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// Search every compile with this budget, even with `CompileOptions::default()` (for
    /// code that compiles internally, such as a model loader).
    pub always: Option<SearchBudget>,
    report: ReportHandle,
}

impl<B: Tunable> Search<B> {
    pub fn new(backend: B) -> Search<B> {
        Search {
            backend,
            cache_dir: None,
            always: None,
            report: Arc::new(Mutex::new(None)),
        }
    }
    /// This search with its cache in `dir`.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Search<B> {
        self.cache_dir = Some(dir.into());
        self
    }
    /// This search applied to every compile, whatever the options say (see [`Search::always`]).
    pub fn with_budget(mut self, budget: SearchBudget) -> Search<B> {
        self.always = Some(budget);
        self
    }
    /// A handle that holds the report of the last search-based compile (kept after the
    /// `Search` is moved into `Graph::compile`).
    pub fn report_handle(&self) -> ReportHandle {
        self.report.clone()
    }
}

impl<B: Tunable> Backend for Search<B> {
    type Runtime = B::Runtime;
    fn compile(&self, graph: GraphData, options: &CompileOptions) -> Result<B::Runtime> {
        let Some(budget) = options.search.as_ref().or(self.always.as_ref()) else {
            return self.backend.compile(graph, options);
        };
        let dir = self.cache_dir.clone().unwrap_or_else(cache::default_dir);
        let plan = search(&self.backend, graph, budget, &dir)?;
        let backend = self.backend.schedule(&plan.schedule).ok_or_else(|| {
            LuminalError::Backend(format!(
                "search chose an unknown schedule {}",
                plan.schedule
            ))
        })?;
        *self.report.lock().unwrap_or_else(|e| e.into_inner()) = Some(plan.report);
        backend.compile_terms(plan.graph, &plan.terms, options)
    }
}

/// The result of [`search`]: the graph and schedule to compile, and how they were found.
#[derive(Clone, Debug)]
pub struct Plan {
    pub graph: GraphData,
    /// Nodes of `graph` the backend computes with its fused terms.
    pub terms: Vec<FusedTerm>,
    pub schedule: String,
    pub report: SearchReport,
}

fn err(msg: impl fmt::Display) -> LuminalError {
    LuminalError::Backend(format!("search: {msg}"))
}

fn progress() -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} luminal_search {msg} [{elapsed}]") {
        pb.set_style(style);
    }
    pb
}

/// A graph variant: name, graph, fused terms, cost, terms.
type Variant = (String, GraphData, Vec<FusedTerm>, f64, terms::TermDag);

/// Searches for a faster plan of `g` (already through the generic passes) on `backend`
/// within `budget`, reading and writing the cache in `cache_dir` when the budget allows.
pub fn search<B: Tunable>(
    backend: &B,
    g: GraphData,
    budget: &SearchBudget,
    cache_dir: &std::path::Path,
) -> Result<Plan> {
    let start = Instant::now();
    let deadline = start + budget.time;
    let dims: HashMap<String, i64> = budget
        .dims
        .iter()
        .map(|(k, v)| (k.clone(), *v as i64))
        .collect();
    if let Some(d) = g.dynamic_dims().into_iter().find(|d| !dims.contains_key(d)) {
        return Err(err(format!(
            "dynamic dim '{d}' needs a value for timing: SearchBudget::default().dim(\"{d}\", n)"
        )));
    }
    let mut enc = terms::encode(&g, backend.supports("matmul"));
    enc.online_attention = backend.supports("online_attention");
    let key = cache::key(&enc, &g, &dims, &backend.tuning_id());
    let log = std::env::var("LUMINAL_SEARCH_LOG").is_ok_and(|v| !v.is_empty() && v != "0");
    let mut report = SearchReport {
        cache_key: key.clone(),
        ..SearchReport::default()
    };

    if budget.use_cache {
        if let Some(entry) = cache::load(cache_dir, &key) {
            if let (Some((graph, fused)), Some(_)) = (
                terms::rebuild_with_terms(&g, &enc, &entry.dag),
                backend.schedule(&entry.schedule),
            ) {
                report.from_cache = true;
                report.cache_path = Some(cache::path(cache_dir, &key));
                report.schedule = entry.schedule.clone();
                report.variant = "cached".into();
                report.fused = fused.iter().map(|t| t.term.clone()).collect();
                report.total = start.elapsed();
                if log {
                    eprintln!("{report}");
                }
                return Ok(Plan {
                    graph,
                    terms: fused,
                    schedule: entry.schedule,
                    report,
                });
            }
        }
    }

    let pb = progress();
    // Identical segments (a model's layers) are seeded once.
    let folding = if fold::enabled() {
        fold::find(&enc, &g)
    } else {
        None
    };
    if let Some(fd) = &folding {
        let (source_terms, seeded_terms) = fd.sizes(&enc);
        report.folded = Some(FoldReport {
            instances: fd.count,
            period: fd.period,
            source_terms,
            seeded_terms,
        });
    }
    let seeded = folding.as_ref().map_or(&enc, |fd| &fd.reduced);
    // Saturation gets half of the time; timing the rest.
    let mut eg = egraph::seed(
        seeded,
        &egraph::RULE_FILES.iter().map(|r| r.1).collect::<String>(),
    )
    .map_err(err)?;
    let limits = Limits {
        max_enodes: budget.max_enodes,
        time: budget.time / 2,
        max_iterations: 64,
    };
    report.stages = egraph::saturate(&mut eg, STAGES, &limits, &mut |stage, n| {
        pb.set_message(format!("stage {stage}: {n} e-nodes"));
        pb.tick();
    })
    .map_err(err)?;
    let classes = egraph::read_classes(&eg, seeded, &g).map_err(err)?;
    drop(eg);
    report.eclasses = classes.nodes.len();
    report.enodes = classes.enode_count();

    // Graph variants: the source, then the cost model's picks under each weighting.
    let source_cost = egraph::dag_cost(&enc.dag, &enc, &g, &CostWeights::DEFAULT, &dims);
    let mut variants: Vec<Variant> = vec![(
        "source".into(),
        g.clone(),
        vec![],
        source_cost,
        enc.dag.clone(),
    )];
    for (name, w) in [
        ("extracted", CostWeights::DEFAULT),
        ("extracted-compute", CostWeights::COMPUTE_BOUND),
    ] {
        let dag = egraph::extract(&classes, seeded, &g, &w, &dims).map_err(err)?;
        let dag = match &folding {
            Some(fd) => fd
                .expand(&dag)
                .ok_or_else(|| err("a folded extraction does not expand"))?,
            None => dag,
        };
        if variants.iter().any(|v| v.4.signature() == dag.signature()) {
            continue;
        }
        let (graph, fused) = terms::rebuild_with_terms(&g, &enc, &dag)
            .ok_or_else(|| err("an extracted term does not rebuild"))?;
        let cost = egraph::dag_cost(&dag, &enc, &g, &CostWeights::DEFAULT, &dims);
        variants.push((name.into(), graph, fused, cost, dag));
    }
    // Cheapest rewritten variant first after the source.
    variants[1..].sort_by(|a, b| a.3.total_cmp(&b.3));
    let schedules = backend.schedules(&g);
    let mut order: Vec<(usize, usize)> = vec![];
    let mut push = |v: usize, s: usize| {
        if !order.contains(&(v, s)) {
            order.push((v, s));
        }
    };
    for v in 0..variants.len() {
        push(v, 0);
    }
    let best = if variants.len() > 1 { 1 } else { 0 };
    for s in 1..schedules.len() {
        push(best, s);
    }
    for s in 1..schedules.len() {
        for v in 0..variants.len() {
            push(v, s);
        }
    }
    let candidates: Vec<Candidate> = order
        .iter()
        .map(|&(v, s)| Candidate {
            variant: variants[v].0.clone(),
            graph: variants[v].1.clone(),
            terms: variants[v].2.clone(),
            schedule: schedules[s].clone(),
            cost: variants[v].3,
        })
        .collect();

    let inputs = measure::make_inputs(&g, &dims).map_err(err)?;
    let outputs = measure::output_handles(&g);
    // The reference runtime is the judge; past REFERENCE_LIMIT (it evaluates in f64, one
    // element at a time: seconds for a large model) the backend's own plan, itself checked
    // against the reference by the op suite, stands in for it (the report says which).
    let mac_cost = egraph::dag_cost(&enc.dag, &enc, &g, &CostWeights::COMPUTE_BOUND, &dims);
    let (reference, baseline) = if mac_cost <= REFERENCE_LIMIT {
        report.checked_against = "reference runtime".into();
        let r = measure::reference_outputs(&g, &inputs, &dims, &outputs).map_err(err)?;
        (r, None)
    } else {
        report.checked_against =
            "the backend's own plan (graph too large for the reference runtime)".into();
        let b0 = backend
            .schedule(&schedules[0])
            .ok_or_else(|| err("the backend's first schedule does not parse"))?;
        // The reference is this plan's outputs on the backend's exact variant where it has
        // one (see `Tunable::checking`). Candidate 0 is this plan (the source graph on the
        // first schedule): its runtime, run once, is reused rather than compiled and run
        // again.
        let exact = match b0.checking() {
            Some(exact) => {
                report.checked_against = "the backend's own plan on its exact variant \
                                          (graph too large for the reference runtime)"
                    .into();
                Some(
                    measure::run_once(&exact, &g, &inputs, &dims, &outputs)
                        .map_err(err)?
                        .1,
                )
            }
            None => None,
        };
        let t0 = Instant::now();
        let (rt, outs) = measure::run_once(&b0, &g, &inputs, &dims, &outputs).map_err(err)?;
        let outs = exact.unwrap_or(outs);
        let reuse = candidates.first().is_some_and(|c| {
            c.variant == "source" && c.schedule == schedules[0] && c.terms.is_empty()
        });
        (outs, reuse.then(|| (rt, t0.elapsed().as_secs_f64())))
    };
    let n = candidates.len().min(budget.max_candidates.max(1));
    pb.set_message(format!("timing 0/{n} candidates"));
    report.candidates = measure::measure_from(
        &|s: &str| backend.schedule(s),
        &candidates,
        &inputs,
        &dims,
        &reference,
        &outputs,
        budget.max_candidates,
        budget.repeats,
        MARGIN,
        deadline,
        &mut |k| {
            pb.set_message(format!("timing {k}/{n} candidates"));
            pb.tick();
        },
        baseline,
    );
    pb.finish_and_clear();
    let chosen = measure::pick(&report.candidates, MARGIN).ok_or_else(|| {
        err(format!(
            "no candidate passed the reference check:\n{report}"
        ))
    })?;
    report.chosen = Some(chosen);
    let c = &candidates[chosen];
    report.schedule = c.schedule.clone();
    report.variant = c.variant.clone();
    report.fused = c.terms.iter().map(|t| t.term.clone()).collect();
    let dag = &variants[order[chosen].0].4;
    if budget.use_cache {
        let entry = cache::Entry {
            schedule: c.schedule.clone(),
            dag: dag.clone(),
            notes: report.to_string(),
        };
        // A cache that cannot be written costs the next compile a search, nothing more.
        report.cache_path = cache::store(cache_dir, &key, &entry).ok();
    }
    report.total = start.elapsed();
    if log {
        eprintln!("{report}");
    }
    Ok(Plan {
        graph: c.graph.clone(),
        terms: c.terms.clone(),
        schedule: c.schedule.clone(),
        report,
    })
}

/// Compiles `graph` like `Graph::compile` (generic passes, then `backend`), searching when
/// `options.search` is set; returns the runtime and the search's report.
pub fn compile<B: Tunable>(
    graph: &luminal::Graph,
    backend: B,
    options: CompileOptions,
) -> Result<(B::Runtime, Option<SearchReport>)> {
    let search = Search::new(backend);
    let handle = search.report_handle();
    let rt = graph.compile(search, options)?;
    let report = handle.lock().unwrap_or_else(|e| e.into_inner()).take();
    Ok((rt, report))
}
