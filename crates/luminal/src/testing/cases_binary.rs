//! Binary elementwise ops: arithmetic, fmod, min/max/clamp, comparisons, logical ops and
//! select, with numpy broadcasting, scalars on either side, i32/f16/bf16 and views.

use super::{case, Case};

pub(super) fn cases() -> Vec<Case> {
    vec![
        // Same shape.
        case("add_3x17", |_, x| vec![x[0] + x[1]]),
        case("sub_3x17", |_, x| vec![x[0] - x[1]]),
        case("mul_3x17", |_, x| vec![x[0] * x[1]]),
        case("div_3x17", |_, x| vec![x[0] / x[1]]),
        case("mod_3x17", |_, x| vec![x[0] % x[1]]),
        case("maximum_3x17", |_, x| vec![x[0].maximum(x[1])]),
        case("minimum_3x17", |_, x| vec![x[0].minimum(x[1])]),
        case("add_257", |_, x| vec![x[0] + x[1]]),
        case("mul_1", |_, x| vec![x[0] * x[1]]),
        case("add_scalar_rank0", |_, x| vec![x[0] + x[1]]),
        case("mul_4d", |_, x| vec![x[0] * x[1]]),
        // Broadcasting.
        case("add_bcast_row", |_, x| vec![x[0] + x[1]]),
        case("add_bcast_col_row", |_, x| vec![x[0] + x[1]]),
        case("mul_bcast_3d", |_, x| vec![x[0] * x[1]]),
        case("sub_bcast_rank0", |_, x| vec![x[0] - x[1]]),
        case("sub_bcast_rank0_lhs", |_, x| vec![x[0] - x[1]]),
        case("div_bcast_1", |_, x| vec![x[0] / x[1]]),
        case("maximum_bcast", |_, x| vec![x[0].maximum(x[1])]),
        case("minimum_bcast_rank", |_, x| vec![x[0].minimum(x[1])]),
        case("mod_bcast", |_, x| vec![x[0] % x[1]]),
        case("add_bcast_4d", |_, x| vec![x[0] + x[1]]),
        // Scalars on either side.
        case("add_f32_rhs", |_, x| vec![x[0] + 2.5f32]),
        case("add_f32_lhs", |_, x| vec![2.5f32 + x[0]]),
        case("sub_f32_rhs", |_, x| vec![x[0] - 1.5f32]),
        case("sub_f32_lhs", |_, x| vec![2.0f32 - x[0]]),
        case("mul_f32_rhs", |_, x| vec![x[0] * 3.0f32]),
        case("mul_f32_lhs", |_, x| vec![3.0f32 * x[0]]),
        case("div_f32_rhs", |_, x| vec![x[0] / 4.0f32]),
        case("div_f32_lhs", |_, x| vec![1.0f32 / x[0]]),
        case("mod_f32_rhs", |_, x| vec![x[0] % 2.5f32]),
        case("mod_f32_lhs", |_, x| vec![7.5f32 % x[0]]),
        case("mod_signs", |_, x| vec![x[0] % x[1]]),
        case("mod_large_quotient", |_, x| vec![x[0] % x[1]]),
        case("mod_inf_divisor", |_, x| vec![x[0] % x[1]]),
        case("clamp_3x17", |_, x| vec![x[0].clamp(-0.5, 0.8)]),
        case("clamp_257", |_, x| vec![x[0].clamp(-1.0, 2.0)]),
        case("clamp_inf", |_, x| vec![x[0].clamp(-0.5, 0.5)]),
        case("maximum_f32", |_, x| vec![x[0].maximum(0.25f32)]),
        case("minimum_f32", |_, x| vec![x[0].minimum(-0.25f32)]),
        // Comparisons.
        case("lt_tensor", |_, x| vec![x[0].lt(x[1])]),
        case("lt_f32", |_, x| vec![x[0].lt(0.5f32)]),
        case("gt_tensor", |_, x| vec![x[0].gt(x[1])]),
        case("gt_f32", |_, x| vec![x[0].gt(0.5f32)]),
        case("le_tensor", |_, x| vec![x[0].le(x[1])]),
        case("le_f32", |_, x| vec![x[0].le(0.5f32)]),
        case("ge_tensor", |_, x| vec![x[0].ge(x[1])]),
        case("ge_f32", |_, x| vec![x[0].ge(0.5f32)]),
        case("eq_tensor", |_, x| vec![x[0].eq(x[1])]),
        case("eq_f32", |_, x| vec![x[0].eq(0.5f32)]),
        case("ne_tensor", |_, x| vec![x[0].ne(x[1])]),
        case("ne_f32", |_, x| vec![x[0].ne(0.5f32)]),
        case("lt_bcast", |_, x| vec![x[0].lt(x[1])]),
        case("eq_bcast_rank0", |_, x| vec![x[0].eq(x[1])]),
        case("lt_inf", |_, x| vec![x[0].lt(x[1])]),
        case("lt_nan", |_, x| vec![x[0].lt(x[1])]),
        case("eq_signed_zero", |_, x| vec![x[0].eq(x[1])]),
        case("not_nan_mixed", |_, x| vec![x[0].not_nan()]),
        case("lt_permuted", |_, x| vec![x[0].permute(&[1, 0]).lt(x[1])]),
        // Logical ops.
        case("not_bool", |_, x| vec![x[0].not()]),
        case("and_bool", |_, x| vec![x[0].and(x[1])]),
        case("or_bool", |_, x| vec![x[0].or(x[1])]),
        case("and_bcast", |_, x| vec![x[0].and(x[1])]),
        // Select.
        case("select_from_gt", |_, x| {
            vec![x[0].gt(x[1]).select(x[0], x[1])]
        }),
        case("select_scalars", |_, x| {
            vec![x[0].gt(0.0f32).select(1.0f32, -1.0f32)]
        }),
        case("select_bool_input", |_, x| vec![x[0].select(x[1], x[2])]),
        case("select_tensor_scalar", |_, x| {
            vec![x[0].select(x[1], 0.0f32)]
        }),
        case("select_scalar_tensor", |_, x| {
            vec![x[0].select(-2.0f32, x[1])]
        }),
        case("select_bcast", |_, x| vec![x[0].select(x[1], x[2])]),
        case("select_neg_inf_mask", |_, x| {
            vec![x[0].select(x[1], f32::NEG_INFINITY)]
        }),
        case("select_inf_other_branch", |_, x| {
            vec![x[0].select(x[1], x[2])]
        }),
        case("select_i32", |_, x| vec![x[0].select(x[1], x[2])]),
        // i32 arithmetic.
        case("add_i32", |_, x| vec![x[0] + x[1]]),
        case("sub_i32", |_, x| vec![x[0] - x[1]]),
        case("mul_i32", |_, x| vec![x[0] * x[1]]),
        case("mod_i32", |_, x| vec![x[0] % x[1]]),
        case("maximum_i32", |_, x| vec![x[0].maximum(x[1])]),
        case("minimum_i32", |_, x| vec![x[0].minimum(x[1])]),
        case("lt_i32", |_, x| vec![x[0].lt(x[1])]),
        case("eq_i32", |_, x| vec![x[0].eq(x[1])]),
        case("add_i32_bcast", |_, x| vec![x[0] + x[1]]),
        case("add_i32_scalar", |_, x| vec![x[0] + 7i32]),
        case("mul_i32_scalar", |_, x| vec![x[0] * -3i32]),
        case("neg_i32", |_, x| vec![-x[0]]),
        // f16 / bf16.
        case("add_f16", |_, x| vec![x[0] + x[1]]),
        case("mul_f16", |_, x| vec![x[0] * x[1]]),
        case("div_f16", |_, x| vec![x[0] / x[1]]),
        case("sub_f16_bcast", |_, x| vec![x[0] - x[1]]),
        case("mul_f16_scalar", |_, x| vec![x[0] * 3.0f32]),
        case("lt_f16", |_, x| vec![x[0].lt(x[1])]),
        case("add_bf16", |_, x| vec![x[0] + x[1]]),
        case("mul_bf16", |_, x| vec![x[0] * x[1]]),
        case("maximum_bf16", |_, x| vec![x[0].maximum(x[1])]),
        case("mod_bf16", |_, x| vec![x[0] % x[1]]),
        case("select_f16", |_, x| vec![x[0].select(x[1], x[2])]),
        case("select_inf_nan_branches", |_, x| {
            vec![x[0].select(x[1], x[2])]
        }),
        // Non-contiguous operands.
        case("add_permuted_lhs", |_, x| {
            vec![x[0].permute(&[1, 0]) + x[1]]
        }),
        case("mul_both_permuted", |_, x| {
            vec![x[0].permute(&[2, 0, 1]) * x[1].permute(&[0, 1, 2])]
        }),
        case("add_sliced_both", |_, x| {
            vec![x[0].slice(0, 1, 4) + x[1].slice(0, 0, 3).slice(1, 3, 12)]
        }),
        case("sub_padded", |_, x| {
            vec![x[0].pad(&[(0, 0), (1, 1)], 0.5) - x[1]]
        }),
        case("add_expanded", |_, x| vec![x[0].expand(1, 17) + x[1]]),
        case("add_self_transposed", |_, x| {
            vec![x[0] + x[0].transpose(0, 1)]
        }),
        case("mul_expand_to", |_, x| vec![x[0].expand_to((3, 17)) * x[1]]),
        case("div_transposed_3d", |_, x| {
            vec![x[0] / x[1].permute(&[2, 1, 0])]
        }),
        // Short chains.
        case("chain_fma", |_, x| vec![x[0] * x[1] + x[2]]),
        case("chain_affine", |_, x| {
            vec![(x[0] + 1.0f32) * (x[1] - 2.0f32) / 3.0f32]
        }),
        case("chain_exp_log", |_, x| vec![x[0].exp().log()]),
        case("chain_shared_input", |_, x| {
            vec![(x[0] * x[0]) - (x[0] + x[0])]
        }),
        // NaN semantics.
        case("cmp_nan", |_, x| {
            let (a, b) = (x[0], x[1]);
            vec![a.eq(b), a.ne(b), a.le(b), a.ge(b), a.gt(b)]
        }),
        case("maximum_nan", |_, x| {
            vec![x[0].maximum(x[1]), x[0].minimum(x[1])]
        }),
    ]
}
