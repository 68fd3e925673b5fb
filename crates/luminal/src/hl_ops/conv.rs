//! Convolutions (unfold windows + matmul), pooling and nearest upsampling.

use crate::graph::GraphTensor;
use crate::shape::Expression;

fn e(v: usize) -> Expression {
    Expression::from(v)
}

/// The keyword arguments of PyTorch's `F.conv1d` / `F.conv2d` (the same value for every
/// spatial dim, as an int argument is there); `Default` is PyTorch's defaults: stride 1, no
/// padding, dilation 1, one group. For per-dim values use the positional `conv2d`.
///
/// ```
/// # use luminal::prelude::*;
/// # use luminal::hl_ops::ConvOptions;
/// let cx = Graph::new();
/// let x = cx.tensor("x", (1, 4, 16));
/// let w = cx.tensor("w", (8, 4, 3));
/// let y = x.conv1d_with(w, ConvOptions { stride: 2, padding: 1, ..Default::default() });
/// assert_eq!(y.shape()[2].as_constant(), Some(8));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// The keyword arguments of PyTorch's pooling functions; `Default` is PyTorch's: the
/// stride equals the kernel size (`stride: None`) and no padding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolOptions {
    /// `None`: the kernel size.
    pub stride: Option<usize>,
    pub padding: usize,
}

impl<'g> GraphTensor<'g> {
    fn expect_rank(&self, rank: usize, op: &str, layout: &str) {
        assert_eq!(
            self.rank(),
            rank,
            "{op}: input must be {layout}, got shape {:?}",
            self.shape()
        );
    }

    /// 1-D convolution (cross-correlation, like PyTorch): `self [N, C, L]`, `weight
    /// [O, C/groups, K]` → `[N, O, L_out]`. No bias (add it afterwards).
    pub fn conv1d(
        self,
        weight: GraphTensor<'g>,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> GraphTensor<'g> {
        self.expect_rank(3, "conv1d", "[N, C, L]");
        let (xs, ws) = (self.shape(), weight.shape());
        assert!(
            ws.len() == 3 && groups > 0 && check_groups(&xs[1], &ws[0], &ws[1], groups),
            "conv1d: weight shape {ws:?} does not fit input shape {xs:?} with {groups} groups"
        );
        let (n, c, o, k) = (xs[0].clone(), xs[1].clone(), ws[0].clone(), ws[2].clone());
        let (g, cg) = (e(groups), c.clone() / groups as i64);
        let win =
            self.pad_axis(2, padding, padding)
                .unfold_dilated(2, k.clone(), e(stride), e(dilation)); // [N, C, Lo, K]
        let lo = win.shape()[2].clone();
        let win = win
            .reshape(vec![
                n.clone(),
                g.clone(),
                cg.clone(),
                lo.clone(),
                k.clone(),
            ])
            .permute(&[0, 1, 3, 2, 4])
            .reshape(vec![
                n.clone(),
                g.clone(),
                lo.clone(),
                cg.clone() * k.clone(),
            ]);
        let w = weight
            .reshape(vec![g, o.clone() / groups as i64, cg * k])
            .transpose(1, 2);
        win.matmul(w).permute(&[0, 1, 3, 2]).reshape(vec![n, o, lo])
    }

    /// [`conv1d`](Self::conv1d) with PyTorch-style keyword options (`Default`: stride 1,
    /// padding 0, dilation 1, groups 1).
    pub fn conv1d_with(self, weight: GraphTensor<'g>, o: ConvOptions) -> GraphTensor<'g> {
        self.conv1d(weight, o.stride, o.padding, o.dilation, o.groups)
    }

    /// [`conv2d`](Self::conv2d) with PyTorch-style keyword options, the same for height and
    /// width.
    pub fn conv2d_with(self, weight: GraphTensor<'g>, o: ConvOptions) -> GraphTensor<'g> {
        let two = |v| (v, v);
        self.conv2d(
            weight,
            two(o.stride),
            two(o.padding),
            two(o.dilation),
            o.groups,
        )
    }

    /// `F.max_pool1d(x, kernel, stride=kernel, padding=0)` by default.
    pub fn max_pool1d_with(self, kernel: usize, o: PoolOptions) -> GraphTensor<'g> {
        self.max_pool1d(kernel, o.stride.unwrap_or(kernel), o.padding)
    }
    /// `F.avg_pool1d(x, kernel, stride=kernel, padding=0)` by default.
    pub fn avg_pool1d_with(self, kernel: usize, o: PoolOptions) -> GraphTensor<'g> {
        self.avg_pool1d(kernel, o.stride.unwrap_or(kernel), o.padding)
    }
    /// `F.max_pool2d(x, kernel, stride=kernel, padding=0)` by default (square windows).
    pub fn max_pool2d_with(self, kernel: usize, o: PoolOptions) -> GraphTensor<'g> {
        let s = o.stride.unwrap_or(kernel);
        self.max_pool2d((kernel, kernel), (s, s), (o.padding, o.padding))
    }
    /// `F.avg_pool2d(x, kernel, stride=kernel, padding=0)` by default (square windows).
    pub fn avg_pool2d_with(self, kernel: usize, o: PoolOptions) -> GraphTensor<'g> {
        let s = o.stride.unwrap_or(kernel);
        self.avg_pool2d((kernel, kernel), (s, s), (o.padding, o.padding))
    }

    /// 2-D convolution: `self [N, C, H, W]`, `weight [O, C/groups, kH, kW]` → `[N, O, H_out, W_out]`.
    pub fn conv2d(
        self,
        weight: GraphTensor<'g>,
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
        groups: usize,
    ) -> GraphTensor<'g> {
        self.expect_rank(4, "conv2d", "[N, C, H, W]");
        let (xs, ws) = (self.shape(), weight.shape());
        assert!(
            ws.len() == 4 && groups > 0 && check_groups(&xs[1], &ws[0], &ws[1], groups),
            "conv2d: weight shape {ws:?} does not fit input shape {xs:?} with {groups} groups"
        );
        let (n, c, o, kh, kw) = (
            xs[0].clone(),
            xs[1].clone(),
            ws[0].clone(),
            ws[2].clone(),
            ws[3].clone(),
        );
        let (g, cg) = (e(groups), c.clone() / groups as i64);
        let win = self
            .pad_axis(2, padding.0, padding.0)
            .pad_axis(3, padding.1, padding.1)
            .unfold_dilated(2, kh.clone(), e(stride.0), e(dilation.0))
            .unfold_dilated(3, kw.clone(), e(stride.1), e(dilation.1)); // [N, C, Ho, Wo, kH, kW]
        let (ho, wo) = (win.shape()[2].clone(), win.shape()[3].clone());
        let patch = cg.clone() * kh * kw;
        let win = win
            .reshape(vec![
                n.clone(),
                g.clone(),
                cg,
                ho.clone(),
                wo.clone(),
                ws[2].clone(),
                ws[3].clone(),
            ])
            .permute(&[0, 1, 3, 4, 2, 5, 6])
            .reshape(vec![
                n.clone(),
                g.clone(),
                ho.clone() * wo.clone(),
                patch.clone(),
            ]);
        let w = weight
            .reshape(vec![g, o.clone() / groups as i64, patch])
            .transpose(1, 2);
        win.matmul(w)
            .permute(&[0, 1, 3, 2])
            .reshape(vec![n, o, ho, wo])
    }

    /// Average pooling over `[N, C, L]`; padding counts as zeros (count_include_pad).
    pub fn avg_pool1d(self, kernel: usize, stride: usize, padding: usize) -> GraphTensor<'g> {
        self.expect_rank(3, "avg_pool1d", "[N, C, L]");
        self.pad_axis(2, padding, padding)
            .unfold(2, kernel, stride)
            .mean(-1)
    }
    /// Max pooling over `[N, C, L]`; padding is -inf.
    pub fn max_pool1d(self, kernel: usize, stride: usize, padding: usize) -> GraphTensor<'g> {
        self.expect_rank(3, "max_pool1d", "[N, C, L]");
        self.pad(&[(0, 0), (0, 0), (padding, padding)], f32::NEG_INFINITY)
            .unfold(2, kernel, stride)
            .max(-1)
    }
    /// Average pooling over `[N, C, H, W]` (count_include_pad).
    pub fn avg_pool2d(
        self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> GraphTensor<'g> {
        self.expect_rank(4, "avg_pool2d", "[N, C, H, W]");
        self.pad_axis(2, padding.0, padding.0)
            .pad_axis(3, padding.1, padding.1)
            .unfold(2, kernel.0, stride.0)
            .unfold(3, kernel.1, stride.1)
            .mean([-2, -1])
    }
    /// Max pooling over `[N, C, H, W]`; padding is -inf.
    pub fn max_pool2d(
        self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> GraphTensor<'g> {
        self.expect_rank(4, "max_pool2d", "[N, C, H, W]");
        self.pad(
            &[
                (0, 0),
                (0, 0),
                (padding.0, padding.0),
                (padding.1, padding.1),
            ],
            f32::NEG_INFINITY,
        )
        .unfold(2, kernel.0, stride.0)
        .unfold(3, kernel.1, stride.1)
        .max([-2, -1])
    }
    /// Nearest-neighbour upsampling of `[N, C, L]` by an integer factor.
    pub fn upsample_nearest1d(self, scale: usize) -> GraphTensor<'g> {
        self.expect_rank(3, "upsample_nearest1d", "[N, C, L]");
        let s = self.shape();
        self.unsqueeze(3)
            .expand_to(vec![s[0].clone(), s[1].clone(), s[2].clone(), e(scale)])
            .reshape(vec![
                s[0].clone(),
                s[1].clone(),
                s[2].clone() * scale as i64,
            ])
    }
    /// Nearest-neighbour upsampling of `[N, C, H, W]` by an integer factor.
    pub fn upsample_nearest2d(self, scale: usize) -> GraphTensor<'g> {
        self.expect_rank(4, "upsample_nearest2d", "[N, C, H, W]");
        let s = self.shape();
        let sc = e(scale);
        self.unsqueeze(3)
            .unsqueeze(5)
            .expand_to(vec![
                s[0].clone(),
                s[1].clone(),
                s[2].clone(),
                sc.clone(),
                s[3].clone(),
                sc,
            ])
            .reshape(vec![
                s[0].clone(),
                s[1].clone(),
                s[2].clone() * scale as i64,
                s[3].clone() * scale as i64,
            ])
    }
}

/// `C` and `O` divisible by `groups` and the weight's in-channels equal `C / groups`
/// (checked when the dims are constants).
fn check_groups(c: &Expression, o: &Expression, wc: &Expression, groups: usize) -> bool {
    match (c.as_constant(), o.as_constant(), wc.as_constant()) {
        (Some(c), Some(o), Some(wc)) => {
            let g = groups as i64;
            c % g == 0 && o % g == 0 && wc == c / g
        }
        _ => true,
    }
}
