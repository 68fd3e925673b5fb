//! Conv1d and Conv2d with PyTorch's defaults (stride 1, no padding, dilation 1, one group,
//! bias).

use crate::{join, Module};
use luminal::prelude::*;

/// The keyword arguments of `torch.nn.Conv1d`; `Default` is PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dOptions {
    pub stride: usize,
    /// Zeros added at both ends (PyTorch's integer `padding`).
    pub padding: usize,
    pub dilation: usize,
    /// The channels are split into `groups` (weight `[out, in / groups, kernel]`).
    pub groups: usize,
    pub bias: bool,
}

impl Default for Conv1dOptions {
    fn default() -> Self {
        Conv1dOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
            bias: true,
        }
    }
}

/// `torch.nn.Conv1d`: `{prefix}.weight: [out, in / groups, kernel]` and (with
/// `options.bias`) `{prefix}.bias: [out]`. Input `[N, C, L]` (or `[C, L]` unbatched, as
/// PyTorch accepts), output `[N, out, L_out]` with
/// `L_out = (L + 2·padding − dilation·(kernel − 1) − 1) / stride + 1`.
///
/// ```
/// # use luminal::prelude::*;
/// # use luminal_nn::{Conv1d, Conv1dOptions};
/// let cx = Graph::new();
/// // Whisper's second encoder convolution: 384 → 384 channels, kernel 3, stride 2, padding 1.
/// let conv = Conv1d::new(&cx, "conv2", 384, 384, 3, Conv1dOptions { stride: 2, padding: 1, ..Default::default() });
/// ```
pub struct Conv1d<'g> {
    pub weight: GraphTensor<'g>,
    pub bias: Option<GraphTensor<'g>>,
    pub options: Conv1dOptions,
}

impl<'g> Conv1d<'g> {
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        options: Conv1dOptions,
    ) -> Self {
        check_conv("Conv1d", in_channels, out_channels, kernel_size, options);
        let groups = options.groups;
        Conv1d {
            weight: cx.tensor(
                &join(prefix, "weight"),
                (out_channels, in_channels / groups, kernel_size),
            ),
            bias: options
                .bias
                .then(|| cx.tensor(&join(prefix, "bias"), out_channels)),
            options,
        }
    }
}

impl<'g> Module<'g> for Conv1d<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        if x.rank() == 2 {
            return self.forward(x.unsqueeze(0)).squeeze(0);
        }
        let o = self.options;
        let y = x.conv1d(
            self.weight.dequantize(),
            o.stride,
            o.padding,
            o.dilation,
            o.groups,
        );
        match self.bias {
            Some(b) => y + b.unsqueeze(1).expand_to(y.shape()),
            None => y,
        }
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        std::iter::once(self.weight).chain(self.bias).collect()
    }
}

/// The keyword arguments of `torch.nn.Conv2d` (one value for height and width, as an int
/// argument is there): the same fields and defaults as [`Conv1dOptions`].
pub type Conv2dOptions = Conv1dOptions;

fn check_conv(op: &str, in_channels: usize, out_channels: usize, kernel: usize, o: Conv1dOptions) {
    assert!(
        in_channels > 0 && out_channels > 0 && kernel > 0 && o.stride > 0 && o.dilation > 0,
        "{op}: channels, kernel size, stride and dilation must be positive, got in \
         {in_channels}, out {out_channels}, kernel {kernel}, {o:?}"
    );
    assert!(
        o.groups > 0
            && in_channels.is_multiple_of(o.groups)
            && out_channels.is_multiple_of(o.groups),
        "{op}: {} groups do not divide in {in_channels} and out {out_channels} channels",
        o.groups
    );
}

/// `torch.nn.Conv2d` with square kernels: `{prefix}.weight: [out, in / groups, k, k]` and
/// (with `options.bias`) `{prefix}.bias: [out]`. Input `[N, C, H, W]` (or `[C, H, W]`
/// unbatched), output `[N, out, H_out, W_out]`.
pub struct Conv2d<'g> {
    pub weight: GraphTensor<'g>,
    pub bias: Option<GraphTensor<'g>>,
    pub options: Conv2dOptions,
}

impl<'g> Conv2d<'g> {
    pub fn new(
        cx: &'g Graph,
        prefix: &str,
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        options: Conv2dOptions,
    ) -> Self {
        check_conv("Conv2d", in_channels, out_channels, kernel_size, options);
        Conv2d {
            weight: cx.tensor(
                &join(prefix, "weight"),
                (
                    out_channels,
                    in_channels / options.groups,
                    kernel_size,
                    kernel_size,
                ),
            ),
            bias: options
                .bias
                .then(|| cx.tensor(&join(prefix, "bias"), out_channels)),
            options,
        }
    }
}

impl<'g> Module<'g> for Conv2d<'g> {
    fn forward(&self, x: GraphTensor<'g>) -> GraphTensor<'g> {
        if x.rank() == 3 {
            return self.forward(x.unsqueeze(0)).squeeze(0);
        }
        let o = self.options;
        let two = |v| (v, v);
        let y = x.conv2d(
            self.weight.dequantize(),
            two(o.stride),
            two(o.padding),
            two(o.dilation),
            o.groups,
        );
        match self.bias {
            Some(b) => y + b.unsqueeze(1).unsqueeze(2).expand_to(y.shape()),
            None => y,
        }
    }
    fn parameters(&self) -> Vec<GraphTensor<'g>> {
        std::iter::once(self.weight).chain(self.bias).collect()
    }
}
