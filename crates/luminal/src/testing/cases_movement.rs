//! Movement ops (views and copies): permute/transpose/reshape/slice/pad/expand/squeeze/
//! unsqueeze/flatten/unfold, concat/split/chunk/stack, and chains of views. Outputs that are
//! views are read back through `.output()` (which materialises them).

use super::{case, Case};
use crate::graph::GraphTensor;

pub(super) fn cases() -> Vec<Case> {
    vec![
        case("contiguous_identity", |_, x| vec![x[0].contiguous()]),
        case("contiguous_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).contiguous()]
        }),
        case("permute_2d", |_, x| vec![x[0].permute(&[1, 0])]),
        case("permute_3d", |_, x| vec![x[0].permute(&[2, 0, 1])]),
        case("permute_4d", |_, x| vec![x[0].permute(&[3, 1, 0, 2])]),
        case("permute_identity", |_, x| vec![x[0].permute(&[0, 1, 2])]),
        case("permute_twice", |_, x| {
            vec![x[0].permute(&[2, 0, 1]).permute(&[2, 0, 1])]
        }),
        case("transpose_0_2", |_, x| vec![x[0].transpose(0, 2)]),
        case("transpose_neg", |_, x| vec![x[0].transpose(-1, -2)]),
        case("transpose_257", |_, x| vec![x[0].transpose(0, 1)]),
        case("reshape_flat", |_, x| vec![x[0].reshape([51])]),
        case("reshape_unflat", |_, x| vec![x[0].reshape((3, 17))]),
        case("reshape_3d", |_, x| vec![x[0].reshape((4, 6))]),
        case("reshape_add_ones", |_, x| vec![x[0].reshape((1, 17, 1))]),
        case("reshape_after_permute", |_, x| {
            vec![x[0].permute(&[1, 0]).reshape([12])]
        }),
        case("reshape_after_permute_3d", |_, x| {
            vec![x[0].permute(&[1, 0, 2]).reshape((3, 8))]
        }),
        case("reshape_after_slice", |_, x| {
            vec![x[0].slice(1, 1, 5).reshape((2, 8))]
        }),
        case("reshape_to_scalar", |_, x| vec![x[0].reshape(())]),
        case("reshape_from_scalar", |_, x| vec![x[0].reshape((1, 1))]),
        // slice
        case("slice_axis0", |_, x| vec![x[0].slice(0, 1, 4)]),
        case("slice_axis1", |_, x| vec![x[0].slice(1, 2, 7)]),
        case("slice_neg_axis", |_, x| vec![x[0].slice(-1, 0, 3)]),
        case("slice_full", |_, x| vec![x[0].slice(0, 0, 5)]),
        case("slice_single", |_, x| vec![x[0].slice(0, 2, 3)]),
        case("slice_3d_middle", |_, x| vec![x[0].slice(1, 2, 5)]),
        case("slice_257", |_, x| vec![x[0].slice(0, 100, 257)]),
        case("slice_twice", |_, x| {
            vec![x[0].slice(0, 2, 8).slice(0, 1, 4)]
        }),
        case("slice_both_axes", |_, x| {
            vec![x[0].slice(0, 1, 5).slice(1, 3, 6)]
        }),
        // other dtypes through views and copies
        case("permute_f16", |_, x| vec![x[0].permute(&[1, 0])]),
        case("slice_bf16", |_, x| vec![x[0].slice(1, 2, 7)]),
        case("pad_f16_value", |_, x| {
            vec![x[0].pad(&[(1, 0), (0, 2)], 1.5)]
        }),
        case("pad_i32_value", |_, x| {
            vec![x[0].pad(&[(0, 1), (2, 0)], 3.0)]
        }),
        case("transpose_i32", |_, x| vec![x[0].transpose(0, 2)]),
        case("concat_i32", |_, x| vec![x[0].concat_along(x[1], 0)]),
        case("permute_bool", |_, x| vec![x[0].permute(&[1, 0])]),
        case("concat_bool", |_, x| vec![x[0].concat_along(x[1], 1)]),
        case("expand_bool", |_, x| vec![x[0].expand(0, 4)]),
        case("pad_bool", |_, x| vec![x[0].pad(&[(1, 0), (0, 1)], 0.0)]),
        case("stack_f16", |_, x| {
            vec![GraphTensor::stack(&[x[0], x[1]], 1)]
        }),
        case("permute_6d", |_, x| vec![x[0].permute(&[5, 2, 0, 4, 1, 3])]),
        case("sum_6d_axes", |_, x| vec![x[0].sum([1, 2, 5])]),
        // outputs: an input, the same tensor twice, an intermediate
        case("input_as_output", |_, x| vec![x[0]]),
        case("input_and_result_outputs", |_, x| vec![x[0], x[0] * 2.0f32]),
        case("duplicate_outputs", |_, x| {
            let e = x[0].exp();
            vec![e, e]
        }),
        case("intermediate_output", |_, x| {
            let a = x[0] + 1.0f32;
            vec![a, a.exp()]
        }),
        case("view_and_base_outputs", |_, x| {
            vec![x[0].permute(&[1, 0]), x[0].slice(1, 1, 3), x[0].sum(0)]
        }),
        case("slice_negative_bounds", |_, x| vec![x[0].slice(1, -4, -1)]),
        case("slice_end_past_dim", |_, x| vec![x[0].slice(0, 2, 100)]),
        case("slice_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).slice(0, 2, 7)]
        }),
        // pad
        case("pad_1d", |_, x| vec![x[0].pad(&[(2, 3)], 0.0)]),
        case(
            "pad_2d_value",
            |_, x| vec![x[0].pad(&[(1, 0), (0, 2)], 1.5)],
        ),
        case("pad_3d", |_, x| {
            vec![x[0].pad(&[(0, 1), (1, 1), (2, 0)], -0.5)]
        }),
        case("pad_zero_amounts", |_, x| {
            vec![x[0].pad(&[(0, 0), (0, 0)], 7.0)]
        }),
        case("pad_neg_inf", |_, x| {
            vec![x[0].pad(&[(0, 0), (1, 1)], f32::NEG_INFINITY)]
        }),
        case("pad_then_slice", |_, x| {
            vec![x[0].pad(&[(0, 0), (3, 3)], 2.0).slice(1, 1, 8)]
        }),
        case("slice_then_pad", |_, x| {
            vec![x[0].slice(1, 2, 5).pad(&[(1, 1), (1, 2)], 0.0)]
        }),
        case("pad_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).pad(&[(1, 0), (0, 1)], 3.0)]
        }),
        case("permute_padded", |_, x| {
            vec![x[0].pad(&[(1, 0), (0, 1)], 3.0).permute(&[1, 0])]
        }),
        case("pad_twice", |_, x| {
            vec![x[0].pad(&[(1, 1)], 1.0).pad(&[(2, 0)], 2.0)]
        }),
        case("pad_size1", |_, x| vec![x[0].pad(&[(4, 4)], 0.25)]),
        case("pad_axis", |_, x| vec![x[0].pad_axis(1, 2, 1)]),
        // expand / squeeze / unsqueeze / flatten
        case("expand_axis0", |_, x| vec![x[0].expand(0, 3)]),
        case("expand_axis1", |_, x| vec![x[0].expand(1, 4)]),
        case("expand_last", |_, x| vec![x[0].expand(2, 2)]),
        case("expand_neg_axis", |_, x| vec![x[0].expand(-1, 2)]),
        case("expand_to_basic", |_, x| vec![x[0].expand_to((3, 17))]),
        case("expand_to_rank_up", |_, x| vec![x[0].expand_to((2, 3, 4))]),
        case("expand_to_middle", |_, x| vec![x[0].expand_to((3, 5, 2))]),
        case("expand_to_scalar", |_, x| vec![x[0].expand_to((2, 3))]),
        case("slice_of_expanded", |_, x| {
            vec![x[0].expand(0, 5).slice(0, 1, 3)]
        }),
        case("expanded_permuted", |_, x| {
            vec![x[0].expand(1, 4).permute(&[1, 0])]
        }),
        case("squeeze_0", |_, x| vec![x[0].squeeze(0)]),
        case("squeeze_neg", |_, x| vec![x[0].squeeze(-1)]),
        case("squeeze_middle", |_, x| vec![x[0].squeeze(1)]),
        case("unsqueeze_0", |_, x| vec![x[0].unsqueeze(0)]),
        case("unsqueeze_2", |_, x| vec![x[0].unsqueeze(2)]),
        case("unsqueeze_middle", |_, x| vec![x[0].unsqueeze(1)]),
        case("flatten_all", |_, x| vec![x[0].flatten(0, 2)]),
        case("flatten_mid", |_, x| vec![x[0].flatten(1, 2)]),
        case("flatten_neg_end", |_, x| vec![x[0].flatten(1, -1)]),
        case("flatten_permuted", |_, x| {
            vec![x[0].permute(&[2, 1, 0]).flatten(1, 2)]
        }),
        // unfold
        case("unfold_1d", |_, x| vec![x[0].unfold(0, 4, 2)]),
        case("unfold_2d_last", |_, x| vec![x[0].unfold(1, 3, 1)]),
        case("unfold_axis0", |_, x| vec![x[0].unfold(0, 3, 2)]),
        case("unfold_step_gt_size", |_, x| vec![x[0].unfold(0, 2, 3)]),
        case("unfold_neg_axis", |_, x| vec![x[0].unfold(-1, 5, 4)]),
        case("unfold_full", |_, x| vec![x[0].unfold(0, 5, 1)]),
        // concat / split / chunk / stack
        case("concat_axis0", |_, x| {
            vec![GraphTensor::concat(&[x[0], x[1]], 0)]
        }),
        case("concat_axis1_three", |_, x| {
            vec![GraphTensor::concat(&[x[0], x[1], x[2]], 1)]
        }),
        case("concat_neg_axis", |_, x| {
            vec![GraphTensor::concat(&[x[0], x[1]], -1)]
        }),
        case("concat_along", |_, x| vec![x[0].concat_along(x[1], 0)]),
        case("concat_3d_mid", |_, x| vec![x[0].concat_along(x[1], 1)]),
        case("concat_ones", |_, x| {
            vec![GraphTensor::concat(&[x[0], x[1], x[2]], 0)]
        }),
        case("concat_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).concat_along(x[1], 1)]
        }),
        case("concat_same_twice", |_, x| vec![x[0].concat_along(x[0], 0)]),
        case("split_axis0", |_, x| x[0].split(&[1, 3, 13], 0)),
        case("split_axis1", |_, x| x[0].split(&[2, 5], 1)),
        case("split_neg_axis", |_, x| x[0].split(&[3, 3], -1)),
        case("chunk_17_by_3", |_, x| x[0].chunk(3, 0)),
        case("chunk_even", |_, x| x[0].chunk(4, 1)),
        case("chunk_one", |_, x| x[0].chunk(1, 0)),
        case("stack_axis0", |_, x| {
            vec![GraphTensor::stack(&[x[0], x[1]], 0)]
        }),
        case("stack_last", |_, x| {
            vec![GraphTensor::stack(&[x[0], x[1], x[2]], 2)]
        }),
        case("stack_neg", |_, x| {
            vec![GraphTensor::stack(&[x[0], x[1]], -1)]
        }),
        case("stack_scalars", |_, x| {
            vec![GraphTensor::stack(&[x[0], x[1], x[2]], 0)]
        }),
        // chains of views
        case("permute_slice_pad", |_, x| {
            vec![x[0]
                .permute(&[1, 0])
                .slice(0, 1, 5)
                .pad(&[(0, 1), (2, 0)], -1.0)]
        }),
        case("expand_permute_slice", |_, x| {
            vec![x[0].expand(0, 2).permute(&[2, 0, 1]).slice(2, 1, 3)]
        }),
        case("pad_expand", |_, x| {
            vec![x[0].pad(&[(1, 1)], 9.0).expand(0, 2)]
        }),
        case("reshape_expand", |_, x| {
            vec![x[0].reshape((2, 1, 3)).expand_to((2, 4, 3))]
        }),
        case("unfold_of_padded", |_, x| {
            vec![x[0].pad(&[(0, 0), (1, 1)], 0.0).unfold(1, 3, 2)]
        }),
        case("concat_of_views", |_, x| {
            let parts = [
                x[0].slice(1, 1, 3),
                x[1].permute(&[1, 0]),
                x[0].pad(&[(0, 0), (1, 0)], 0.0),
            ];
            vec![GraphTensor::concat(&parts, 1)]
        }),
    ]
}
