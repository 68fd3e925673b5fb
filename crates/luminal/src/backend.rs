//! The narrow interface between the graph and a device: a `Backend` compiles a graph into
//! a `Runtime`, which holds buffers and runs the plan.

use crate::dtype::{Element, HostData};
use crate::error::{LuminalError, Result};
use crate::graph::{GraphData, GraphTensor};

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
pub trait Runtime {
    /// Sets the data of an input tensor (dtype and length are checked).
    fn set_data(&mut self, tensor: GraphTensor, data: HostData) -> Result<()>;
    /// Binds a dynamic dimension for the following runs.
    fn set_dim(&mut self, name: &str, value: usize);
    /// Executes the graph.
    fn run(&mut self) -> Result<()>;
    /// Reads an output tensor computed by the last `run()`.
    fn get_data(&self, tensor: GraphTensor) -> Result<HostData>;

    fn set<T: Element>(&mut self, tensor: GraphTensor, data: &[T]) -> Result<()>
    where
        Self: Sized,
    {
        self.set_data(tensor, T::to_host(data))
    }

    fn get<T: Element>(&self, tensor: GraphTensor) -> Result<Vec<T>>
    where
        Self: Sized,
    {
        let data = self.get_data(tensor)?;
        let got = data.dtype();
        T::from_host(data).ok_or_else(|| LuminalError::WrongDType {
            tensor: tensor.entry().label,
            expected: got,
            got: T::DTYPE,
        })
    }

    /// Reads an output as `f32` whatever its dtype.
    fn get_f32(&self, tensor: GraphTensor) -> Result<Vec<f32>>
    where
        Self: Sized,
    {
        Ok(self.get_data(tensor)?.to_f32())
    }
}
