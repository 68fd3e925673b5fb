//! State that persists across runs and is updated in place (KV caches).

use crate::graph::{normalize_axis, GraphTensor, IntoAxis, IntoDim};
use crate::op::Op;

impl<'g> GraphTensor<'g> {
    /// Writes `src` into this input at `start..start + len` along `axis` (`len` = `src`'s
    /// size there; every other dim must match) and returns the updated tensor. The input keeps
    /// the new contents after the run, so it is state: a KV cache written at the current
    /// position each step. Backends write in place (only `src` moves, no copy of the rest).
    ///
    /// The result (and the state input) are marked as outputs, so the write happens even if
    /// nothing reads it.
    /// Other readers of the input in the same run see its value from before the run (an
    /// optimizer step reads a weight and writes its update); read the new value through the
    /// returned tensor.
    /// `start + len` past the end is a run-time `IndexOutOfRange` error.
    pub fn write_slice(
        self,
        axis: impl IntoAxis,
        start: impl IntoDim,
        src: GraphTensor<'g>,
    ) -> GraphTensor<'g> {
        self.same_graph(&src, "write_slice");
        let (shape, src_shape) = (self.shape(), src.shape());
        let axis = normalize_axis(axis.into_axis(), self.rank(), "write_slice", &shape);
        let e = self.entry();
        let node_shape = self.graph.data().node(e.node).shape.clone();
        let is_input = matches!(self.graph.data().node(e.node).op, Op::Input { .. });
        assert!(
            is_input && e.view.is_contiguous() && e.view.dims() == node_shape,
            "write_slice: the destination must be a whole input tensor, got {} with shape {shape:?}",
            e.label
        );
        assert_eq!(
            self.dtype(),
            src.dtype(),
            "write_slice: dtypes differ (dest {} {shape:?}, src {} {src_shape:?})",
            self.dtype(),
            src.dtype()
        );
        assert!(
            src_shape.len() == shape.len()
                && (0..shape.len()).all(|d| d == axis || src_shape[d] == shape[d]),
            "write_slice: src shape {src_shape:?} must equal dest shape {shape:?} except along axis {axis}"
        );
        assert!(
            !self.dtype().is_quantized() || axis + 1 < shape.len(),
            "write_slice: a {} destination {shape:?} is written in whole blocks, along an axis \
             before the last",
            self.dtype()
        );
        let out = self.graph.add_op(
            Op::WriteSlice {
                axis,
                start: start.into_dim(),
            },
            vec![self.edge(), src.contiguous().edge()],
            self.dtype(),
            shape,
        );
        // Both the result and the state itself are readable after a run.
        let node = out.node();
        self.graph.data_mut().outputs.extend([node, e.node]);
        out
    }
}
