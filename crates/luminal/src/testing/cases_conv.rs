//! Convolutions (1-D and 2-D with stride, padding, dilation, groups), avg/max pooling
//! (avg counts the padding, max pads with -inf) and nearest upsampling.

use super::{case, Case};

pub(super) fn cases() -> Vec<Case> {
    vec![
        // conv1d(w, stride, padding, dilation, groups)
        case("conv1d_basic", |_, x| vec![x[0].conv1d(x[1], 1, 0, 1, 1)]),
        case("conv1d_stride2", |_, x| vec![x[0].conv1d(x[1], 2, 0, 1, 1)]),
        case("conv1d_pad2", |_, x| vec![x[0].conv1d(x[1], 1, 2, 1, 1)]),
        case("conv1d_dil2", |_, x| vec![x[0].conv1d(x[1], 1, 0, 2, 1)]),
        case("conv1d_groups2", |_, x| vec![x[0].conv1d(x[1], 1, 0, 1, 2)]),
        case("conv1d_depthwise", |_, x| {
            vec![x[0].conv1d(x[1], 1, 2, 1, 3)]
        }),
        case("conv1d_k1", |_, x| vec![x[0].conv1d(x[1], 1, 0, 1, 1)]),
        case("conv1d_all", |_, x| vec![x[0].conv1d(x[1], 2, 1, 2, 2)]),
        case("conv1d_l257", |_, x| vec![x[0].conv1d(x[1], 3, 0, 1, 1)]),
        case("conv1d_l1", |_, x| vec![x[0].conv1d(x[1], 1, 0, 1, 1)]),
        case("conv1d_kernel_eq_len", |_, x| {
            vec![x[0].conv1d(x[1], 1, 0, 1, 1)]
        }),
        case("conv1d_stride_gt_kernel", |_, x| {
            vec![x[0].conv1d(x[1], 3, 1, 1, 1)]
        }),
        case("conv1d_permuted_input", |_, x| {
            vec![x[0].permute(&[0, 2, 1]).conv1d(x[1], 1, 1, 1, 1)]
        }),
        // conv2d(w, stride, padding, dilation, groups)
        case("conv2d_basic", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (0, 0), (1, 1), 1)]
        }),
        case("conv2d_stride", |_, x| {
            vec![x[0].conv2d(x[1], (2, 1), (0, 0), (1, 1), 1)]
        }),
        case("conv2d_pad", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (1, 2), (1, 1), 1)]
        }),
        case("conv2d_dil", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (0, 0), (2, 2), 1)]
        }),
        case("conv2d_groups", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (0, 0), (1, 1), 2)]
        }),
        case("conv2d_depthwise", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (1, 1), (1, 1), 3)]
        }),
        case("conv2d_1x1", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (0, 0), (1, 1), 1)]
        }),
        case("conv2d_rect_kernel", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (0, 0), (1, 1), 1)]
        }),
        case("conv2d_all", |_, x| {
            vec![x[0].conv2d(x[1], (2, 3), (1, 2), (2, 1), 2)]
        }),
        case("conv2d_h1", |_, x| {
            vec![x[0].conv2d(x[1], (1, 1), (0, 0), (1, 1), 1)]
        }),
        case("conv2d_nhwc_permuted", |_, x| {
            vec![x[0]
                .permute(&[0, 3, 1, 2])
                .conv2d(x[1], (1, 1), (1, 1), (1, 1), 1)]
        }),
        // pooling (kernel, stride, padding)
        case("avg_pool1d_k2s2", |_, x| vec![x[0].avg_pool1d(2, 2, 0)]),
        case("avg_pool1d_k3s1p1", |_, x| vec![x[0].avg_pool1d(3, 1, 1)]),
        case("avg_pool1d_k3s2p1", |_, x| vec![x[0].avg_pool1d(3, 2, 1)]),
        case("avg_pool1d_l257", |_, x| vec![x[0].avg_pool1d(4, 4, 0)]),
        case("max_pool1d_k2s2", |_, x| vec![x[0].max_pool1d(2, 2, 0)]),
        case("max_pool1d_k3s1p1_neg", |_, x| {
            vec![x[0].max_pool1d(3, 1, 1)]
        }),
        case("max_pool1d_k3s2p1_neg", |_, x| {
            vec![x[0].max_pool1d(3, 2, 1)]
        }),
        case("max_pool1d_k5s3", |_, x| vec![x[0].max_pool1d(5, 3, 0)]),
        case("avg_pool2d_2x2", |_, x| {
            vec![x[0].avg_pool2d((2, 2), (2, 2), (0, 0))]
        }),
        case("avg_pool2d_3x3_s2_p1", |_, x| {
            vec![x[0].avg_pool2d((3, 3), (2, 2), (1, 1))]
        }),
        case("avg_pool2d_rect", |_, x| {
            vec![x[0].avg_pool2d((2, 3), (1, 2), (0, 1))]
        }),
        case("max_pool2d_2x2", |_, x| {
            vec![x[0].max_pool2d((2, 2), (2, 2), (0, 0))]
        }),
        case("max_pool2d_3x3_s2_p1_neg", |_, x| {
            vec![x[0].max_pool2d((3, 3), (2, 2), (1, 1))]
        }),
        case("max_pool2d_rect", |_, x| {
            vec![x[0].max_pool2d((2, 3), (1, 2), (0, 1))]
        }),
        // nearest upsampling
        case("upsample_nearest1d_2", |_, x| {
            vec![x[0].upsample_nearest1d(2)]
        }),
        case("upsample_nearest1d_3", |_, x| {
            vec![x[0].upsample_nearest1d(3)]
        }),
        case("upsample_nearest1d_1", |_, x| {
            vec![x[0].upsample_nearest1d(1)]
        }),
        case("upsample_nearest2d_2", |_, x| {
            vec![x[0].upsample_nearest2d(2)]
        }),
        case("upsample_nearest2d_3", |_, x| {
            vec![x[0].upsample_nearest2d(3)]
        }),
        // a small conv net
        case("conv_relu_pool", |_, x| {
            vec![x[0]
                .conv2d(x[1], (1, 1), (1, 1), (1, 1), 1)
                .relu()
                .max_pool2d((2, 2), (2, 2), (0, 0))]
        }),
    ]
}
