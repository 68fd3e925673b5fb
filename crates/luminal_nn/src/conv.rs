//! Convolution layers (PyTorch's `nn.Conv1d` / `nn.Conv2d` layouts, with bias).

use crate::{join, Module};
use luminal::prelude::*;

/// `nn.Conv2d`: weight `[out, in/groups, kH, kW]`, optional bias `[out]`.
pub struct Conv2d<'g> {
    pub weight: GraphTensor<'g>,
    pub bias: Option<GraphTensor<'g>>,
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
}

impl<'g> Conv2d<'g> {
    /// A square-kernel convolution with `stride` and `padding` on both axes, no dilation,
    /// one group (PyTorch's positional arguments, in order).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    ) -> Self {
        Conv2d {
            weight: cx.tensor(
                &join(prefix, "weight"),
                (out_channels, in_channels, kernel, kernel),
            ),
            bias: bias.then(|| cx.tensor(&join(prefix, "bias"), out_channels)),
            stride: (stride, stride),
            padding: (padding, padding),
            dilation: (1, 1),
            groups: 1,
        }
    }
}

impl<'g> Module<'g> for Conv2d<'g> {
    /// `[N, C, H, W]` → `[N, O, H_out, W_out]`.
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let y = x.conv2d(
            self.weight.dequantize(),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        );
        match self.bias {
            Some(b) => {
                let o = b.shape()[0].clone();
                y + b
                    .reshape(vec![Expression::from(1), o, 1.into(), 1.into()])
                    .expand_to(y.shape())
            }
            None => y,
        }
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        std::iter::once(self.weight).chain(self.bias).collect()
    }
}

/// `nn.Conv1d`: weight `[out, in/groups, k]`, optional bias `[out]`.
pub struct Conv1d<'g> {
    pub weight: GraphTensor<'g>,
    pub bias: Option<GraphTensor<'g>>,
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl<'g> Conv1d<'g> {
    /// A convolution with `stride` and `padding`, no dilation, one group (PyTorch's
    /// positional arguments, in order).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    ) -> Self {
        Conv1d {
            weight: cx.tensor(&join(prefix, "weight"), (out_channels, in_channels, kernel)),
            bias: bias.then(|| cx.tensor(&join(prefix, "bias"), out_channels)),
            stride,
            padding,
            dilation: 1,
            groups: 1,
        }
    }
}

impl<'g> Module<'g> for Conv1d<'g> {
    /// `[N, C, L]` → `[N, O, L_out]`.
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        let y = x.conv1d(
            self.weight.dequantize(),
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        );
        match self.bias {
            Some(b) => {
                let o = b.shape()[0].clone();
                y + b
                    .reshape(vec![Expression::from(1), o, 1.into()])
                    .expand_to(y.shape())
            }
            None => y,
        }
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        std::iter::once(self.weight).chain(self.bias).collect()
    }
}
