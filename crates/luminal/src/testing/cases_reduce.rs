//! Reductions: sum/max/min/mean/prod/var/std (+ keepdim), argmax/argmin, over single and
//! multiple (negative) axes, odd sizes, non-finite values, i32/f16/bf16 and views.

use super::{case, Case};

pub(super) fn cases() -> Vec<Case> {
    vec![
        // sum
        case("sum_axis0", |_, x| vec![x[0].sum(0)]),
        case("sum_axis1", |_, x| vec![x[0].sum(1)]),
        case("sum_axis_neg1_3d", |_, x| vec![x[0].sum(-1)]),
        case("sum_axis_neg2_3d", |_, x| vec![x[0].sum(-2)]),
        case("sum_axes_0_2", |_, x| vec![x[0].sum([0, 2])]),
        case("sum_axes_neg", |_, x| vec![x[0].sum([-1, -3])]),
        case("sum_all", |_, x| vec![x[0].sum([0, 1])]),
        case("sum_257", |_, x| vec![x[0].sum(0)]),
        case("sum_3x257_axis1", |_, x| vec![x[0].sum(1)]),
        case("sum_257x3_axis0", |_, x| vec![x[0].sum(0)]),
        case("sum_size1_axis", |_, x| vec![x[0].sum(1)]),
        case("sum_1x1", |_, x| vec![x[0].sum([0, 1])]),
        case("sum_keepdim_axis1", |_, x| vec![x[0].sum_keepdim(1)]),
        case("sum_keepdim_axes_neg", |_, x| {
            vec![x[0].sum_keepdim([-1, -3])]
        }),
        case("sum_keepdim_all", |_, x| vec![x[0].sum_keepdim([0, 1])]),
        case("sum_nonfinite", |_, x| vec![x[0].sum(1)]),
        // max / min
        case("max_axis0", |_, x| vec![x[0].max(0)]),
        case("max_axis_neg1_257", |_, x| vec![x[0].max(-1)]),
        case("max_keepdim", |_, x| vec![x[0].max_keepdim(1)]),
        case("max_all", |_, x| vec![x[0].max([0, 1, 2])]),
        case("max_axes_0_2", |_, x| vec![x[0].max([0, 2])]),
        case("max_all_negative", |_, x| vec![x[0].max(1)]),
        case("max_with_neg_inf", |_, x| vec![x[0].max(1)]),
        case("max_nan_propagates", |_, x| vec![x[0].max(1)]),
        case("min_axis1", |_, x| vec![x[0].min(1)]),
        case("min_all_positive", |_, x| vec![x[0].min(0)]),
        case("min_keepdim", |_, x| vec![x[0].min_keepdim(-2)]),
        case("min_all", |_, x| vec![x[0].min(0)]),
        case("min_with_inf", |_, x| vec![x[0].min(1)]),
        // mean
        case("mean_axis1", |_, x| vec![x[0].mean(1)]),
        case("mean_axes_1_2", |_, x| vec![x[0].mean([1, 2])]),
        case("mean_keepdim", |_, x| vec![x[0].mean_keepdim(0)]),
        case("mean_257", |_, x| vec![x[0].mean(0)]),
        case("mean_all_4d", |_, x| vec![x[0].mean([0, 1, 2, 3])]),
        // prod
        case("prod_axis1", |_, x| vec![x[0].prod(1)]),
        case("prod_keepdim", |_, x| vec![x[0].prod_keepdim(0)]),
        case("prod_with_zero", |_, x| vec![x[0].prod(1)]),
        case("prod_negative", |_, x| vec![x[0].prod(1)]),
        case("prod_axes", |_, x| vec![x[0].prod([0, 2])]),
        // var / std
        case("var_c0", |_, x| vec![x[0].var(-1, 0)]),
        case("var_c1", |_, x| vec![x[0].var(-1, 1)]),
        case("var_c1_keepdim", |_, x| vec![x[0].var_keepdim(0, 1)]),
        case("var_axes_c1", |_, x| vec![x[0].var([0, 2], 1)]),
        case("var_offset_257", |_, x| vec![x[0].var(0, 0)]),
        case("std_c0", |_, x| vec![x[0].std(1, 0)]),
        case("std_c1", |_, x| vec![x[0].std(1, 1)]),
        case("std_keepdim", |_, x| vec![x[0].std_keepdim([1, 2], 1)]),
        // argmax / argmin
        case("argmax_axis1", |_, x| vec![x[0].argmax(1)]),
        case("argmax_axis0", |_, x| vec![x[0].argmax(0)]),
        case("argmax_neg1_3d", |_, x| vec![x[0].argmax(-1)]),
        case("argmax_ties", |_, x| vec![x[0].argmax(1)]),
        case("argmax_257", |_, x| vec![x[0].argmax(1)]),
        case("argmax_with_neg_inf", |_, x| vec![x[0].argmax(1)]),
        case("argmin_axis1", |_, x| vec![x[0].argmin(1)]),
        case("argmin_ties", |_, x| vec![x[0].argmin(0)]),
        case("argmin_neg2", |_, x| vec![x[0].argmin(-2)]),
        case("argmax_size1", |_, x| vec![x[0].argmax(1)]),
        // i32 / f16 / bf16
        case("sum_i32", |_, x| vec![x[0].sum(1)]),
        case("max_i32", |_, x| vec![x[0].max(0)]),
        case("max_i32_all_negative", |_, x| vec![x[0].max(1)]),
        case("min_i32", |_, x| vec![x[0].min(1)]),
        case("argmax_i32", |_, x| vec![x[0].argmax(1)]),
        case("sum_f16", |_, x| vec![x[0].sum(1)]),
        case("mean_f16", |_, x| vec![x[0].mean(1)]),
        case("max_f16", |_, x| vec![x[0].max(0)]),
        case("sum_bf16", |_, x| vec![x[0].sum(1)]),
        case("max_bf16", |_, x| vec![x[0].max(1)]),
        case("argmax_f16", |_, x| vec![x[0].argmax(1)]),
        // reductions of views
        case("sum_permuted", |_, x| vec![x[0].permute(&[1, 0]).sum(0)]),
        case("sum_permuted_3d", |_, x| {
            vec![x[0].permute(&[1, 2, 0]).sum([0, 2])]
        }),
        case("max_sliced", |_, x| vec![x[0].slice(1, 3, 17).max(1)]),
        case("sum_padded", |_, x| {
            vec![x[0].pad(&[(1, 1), (0, 2)], 1.0).sum(1)]
        }),
        case("min_padded_value", |_, x| {
            vec![x[0].pad(&[(0, 0), (1, 0)], -5.0).min(1)]
        }),
        case("max_padded_neg", |_, x| {
            vec![x[0].pad(&[(0, 0), (2, 2)], 0.0).max(1)]
        }),
        case("mean_expanded", |_, x| vec![x[0].expand(0, 4).mean(0)]),
        case("sum_expanded_other", |_, x| vec![x[0].expand(1, 5).sum(0)]),
        case("argmax_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).argmax(1)]
        }),
        case("var_permuted", |_, x| vec![x[0].permute(&[1, 0]).var(1, 1)]),
        case("sum_of_product", |_, x| vec![(x[0] * x[1]).sum(1)]),
        case("sum_then_max", |_, x| vec![x[0].sum(2).max(1)]),
    ]
}
