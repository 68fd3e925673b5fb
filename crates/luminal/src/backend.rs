//! The narrow interface between the graph and a device: a `Backend` compiles a graph into
//! a `Runtime`, which holds buffers and runs the plan.

use crate::dtype::{Element, HostData};
use crate::error::{LuminalError, Result};
use crate::graph::{GraphData, TensorRef};

/// Options common to every backend.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Run the generic passes (CSE, dead nodes, simplification, constant folding).
    pub optimize: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { optimize: true }
    }
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
