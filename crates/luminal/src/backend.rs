//! The narrow interface between the graph and a device: a `Backend` compiles a graph into
//! a `Runtime`, which holds buffers and runs the plan.

use crate::dtype::{Element, HostData};
use crate::error::{LuminalError, Result};
use crate::graph::{Edge, GraphData, NodeId, TensorRef};
use std::time::Duration;

/// Options common to every backend.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Run the generic passes (CSE, dead nodes, simplification, constant folding).
    pub optimize: bool,
    /// Search for a faster plan within this budget. The core cannot search (the search
    /// depends on the core, not the reverse): a backend honours this only when it is wrapped
    /// by `luminal_search::Search` (which needs the backend to be [`Tunable`]); a plain
    /// backend ignores it. `None` (the default) never searches.
    pub search: Option<SearchBudget>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            optimize: true,
            search: None,
        }
    }
}

impl CompileOptions {
    /// The default options plus a search within `budget`.
    pub fn search(budget: SearchBudget) -> CompileOptions {
        CompileOptions {
            search: Some(budget),
            ..CompileOptions::default()
        }
    }
}

/// Limits of a search-based compile (see `luminal_search`).
#[derive(Clone, Debug, PartialEq)]
pub struct SearchBudget {
    /// Wall time for the whole search: saturation, then timing candidates. Saturation stops
    /// at half of it; timing stops when it is spent (the best plan found so far wins).
    pub time: Duration,
    /// Saturation stops once the e-graph holds this many e-nodes (checked per iteration).
    pub max_enodes: usize,
    /// At most this many candidate plans are compiled and timed.
    pub max_candidates: usize,
    /// Timed runs per candidate (after one warm-up run); the median is compared.
    pub repeats: usize,
    /// Values of the dynamic dims for the timing runs (`("seq", 128)`); every dynamic dim
    /// of the graph needs one.
    pub dims: Vec<(String, usize)>,
    /// Read and write the on-disk cache of search results.
    pub use_cache: bool,
}

impl Default for SearchBudget {
    fn default() -> Self {
        SearchBudget {
            time: Duration::from_secs(20),
            max_enodes: 200_000,
            max_candidates: 16,
            repeats: 7,
            dims: vec![],
            use_cache: true,
        }
    }
}

impl SearchBudget {
    /// This budget with dynamic dim `name` bound to `value` for timing.
    pub fn dim(mut self, name: &str, value: usize) -> SearchBudget {
        self.dims.retain(|(n, _)| n != name);
        self.dims.push((name.to_string(), value));
        self
    }
}

/// A backend whose compile has choices a search may make (threads, which fusions run, …).
///
/// Choices are named by strings the backend parses back (`schedule`), so a search result
/// can be cached on disk and reapplied. `schedules()[0]` must be the backend as it is.
pub trait Tunable: Backend + Clone {
    /// What a cached result depends on besides the graph: backend, instruction set,
    /// thread count, the backend's own version.
    fn tuning_id(&self) -> String;
    /// The schedule choices worth timing for this graph, the backend's current setting first.
    fn schedules(&self, graph: &GraphData) -> Vec<String>;
    /// This backend with the named schedule applied (`None`: not a schedule of this backend).
    fn schedule(&self, name: &str) -> Option<Self>;
    /// Whether the backend runs a kind of fused term the search may produce (e.g.
    /// `"matmul"`); terms it cannot run are never extracted.
    fn supports(&self, term: &str) -> bool;
    /// Compiles `graph`, computing each node of `terms` with the named fused term (one the
    /// backend [`supports`](Tunable::supports)) from the term's operands. The node's own
    /// primop subgraph stays in `graph` as the term's reference semantics; a backend may
    /// fall back to it. The default knows no terms and compiles the graph as it is.
    fn compile_terms(
        &self,
        graph: GraphData,
        terms: &[FusedTerm],
        options: &CompileOptions,
    ) -> Result<Self::Runtime> {
        let _ = terms;
        self.compile(graph, options)
    }
    /// The backend a search checks candidates' outputs on, where it differs from this one:
    /// the same plans with exact arithmetic in place of lossy fast paths (e.g. activations
    /// rounded to int8), so that the check measures a rewrite's own error and not the fast
    /// path's rounding, which any change of summation order can flip and a deep model
    /// amplifies. Candidates that pass are timed on this backend. `None` (the default):
    /// this backend is exact enough to check on.
    fn checking(&self) -> Option<Self> {
        None
    }
}

/// A node that a search asks a [`Tunable`] backend to compute with one of its fused terms
/// (see [`Tunable::compile_terms`]), e.g. `"online_attention"` with inputs `[q, k, v, bias]`
/// read through the views the term's primop subgraph reads them with, and `params`
/// `[scale]`.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedTerm {
    pub term: String,
    pub node: NodeId,
    pub inputs: Vec<Edge>,
    pub params: Vec<f64>,
}

pub trait Backend {
    type Runtime: Runtime;
    /// Lowers an (already generically optimised) graph into an executable runtime.
    fn compile(&self, graph: GraphData, options: &CompileOptions) -> Result<Self::Runtime>;
}

/// A compiled graph with its buffers. Inputs set once stay until set again.
///
/// Tensors are named by a `GraphTensor` or its lifetime-free `TensorRef` (`t.handle()`).
pub trait Runtime {
    /// Sets the data of an input tensor (dtype and length are checked).
    fn set_data(&mut self, tensor: impl Into<TensorRef>, data: HostData) -> Result<()>;
    /// Binds a dynamic dimension for the following runs.
    fn set_dim(&mut self, name: &str, value: usize);
    /// Executes the graph.
    fn run(&mut self) -> Result<()>;
    /// Reads an output tensor computed by the last `run()`.
    fn get_data(&self, tensor: impl Into<TensorRef>) -> Result<HostData>;
    /// The graph the runtime was compiled from (after the generic passes).
    fn graph_data(&self) -> &GraphData;

    fn set<T: Element>(&mut self, tensor: impl Into<TensorRef>, data: &[T]) -> Result<()>
    where
        Self: Sized,
    {
        self.set_data(tensor, T::to_host(data))
    }

    fn get<T: Element>(&self, tensor: impl Into<TensorRef>) -> Result<Vec<T>>
    where
        Self: Sized,
    {
        let tensor: TensorRef = tensor.into();
        let data = self.get_data(tensor)?;
        let got = data.dtype();
        T::from_host(data).ok_or_else(|| LuminalError::WrongDType {
            tensor: self.graph_data().describe_tensor(tensor),
            expected: got,
            got: T::DTYPE,
            access: crate::error::DataAccess::Get,
        })
    }

    /// [`Runtime::get`] into `out` (replacing its contents). Runtimes that can copy from
    /// their own buffers make no allocation once `out` has the capacity (decode loops).
    fn get_into<T: Element>(&self, tensor: impl Into<TensorRef>, out: &mut Vec<T>) -> Result<()>
    where
        Self: Sized,
    {
        *out = self.get(tensor)?;
        Ok(())
    }

    /// Reads an output as `f32` whatever its dtype.
    fn get_f32(&self, tensor: impl Into<TensorRef>) -> Result<Vec<f32>>
    where
        Self: Sized,
    {
        Ok(self.get_data(tensor)?.to_f32())
    }
}
