//! Indexing and creation ops: gather, index_select, embedding (the Gather primop), one_hot,
//! iota (with index expressions), arange, constants and full/zeros/ones.

use super::{case, Case};
use crate::dtype::DType;
use crate::shape::Expression;

fn z() -> Expression {
    Expression::var("z")
}

pub(super) fn cases() -> Vec<Case> {
    vec![
        // gather
        case("gather_axis0", |_, x| vec![x[0].gather(0, x[1])]),
        case("gather_axis1", |_, x| vec![x[0].gather(1, x[1])]),
        case("gather_neg_axis_3d", |_, x| vec![x[0].gather(-1, x[1])]),
        case("gather_axis1_3d", |_, x| vec![x[0].gather(1, x[1])]),
        case("gather_1d", |_, x| vec![x[0].gather(0, x[1])]),
        case("gather_i32_data", |_, x| vec![x[0].gather(1, x[1])]),
        case("gather_permuted_data", |_, x| {
            vec![x[0].permute(&[1, 0]).gather(1, x[1])]
        }),
        // index_select
        case(
            "index_select_axis0",
            |_, x| vec![x[0].index_select(0, x[1])],
        ),
        case(
            "index_select_axis1",
            |_, x| vec![x[0].index_select(1, x[1])],
        ),
        case("index_select_3d_last", |_, x| {
            vec![x[0].index_select(-1, x[1])]
        }),
        case("index_select_single", |_, x| {
            vec![x[0].index_select(0, x[1])]
        }),
        case("index_select_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).index_select(1, x[1])]
        }),
        case("index_select_f16", |_, x| vec![x[0].index_select(0, x[1])]),
        // embedding
        case("embedding_1d", |_, x| vec![x[0].embedding(x[1])]),
        case("embedding_2d_ids", |_, x| vec![x[0].embedding(x[1])]),
        case("embedding_257_rows", |_, x| vec![x[0].embedding(x[1])]),
        case("embedding_scalar_id", |_, x| vec![x[0].embedding(x[1])]),
        case("embedding_repeated", |_, x| vec![x[0].embedding(x[1])]),
        case("embedding_bf16", |_, x| vec![x[0].embedding(x[1])]),
        case("embedding_i32_table", |_, x| vec![x[0].embedding(x[1])]),
        case("embedding_sliced_table", |_, x| {
            vec![x[0].slice(1, 2, 5).embedding(x[1])]
        }),
        case("embedding_bool_table", |_, x| vec![x[0].embedding(x[1])]),
        // one_hot
        case("one_hot_basic", |_, x| vec![x[0].one_hot(4)]),
        case("one_hot_2d", |_, x| vec![x[0].one_hot(7)]),
        case("one_hot_c1", |_, x| vec![x[0].one_hot(1)]),
        case("one_hot_257", |_, x| vec![x[0].one_hot(257)]),
        // creation ops
        case("iota_z", |cx, _| vec![cx.iota(z(), 17)]),
        case("iota_mul2", |cx, _| vec![cx.iota(z() * 2, 5)]),
        case("iota_plus3_len1", |cx, _| vec![cx.iota(z() + 3, 1)]),
        case("iota_257", |cx, _| vec![cx.iota(z(), 257)]),
        case("iota_mod3", |cx, _| vec![cx.iota(z() % 3, 10)]),
        case("iota_div2", |cx, _| vec![cx.iota(z() / 2, 9)]),
        case("iota_affine", |cx, _| vec![cx.iota(z() * 3 + 1, 6)]),
        case("arange_17", |cx, _| vec![cx.arange(17)]),
        case("arange_1", |cx, _| vec![cx.arange(1)]),
        case("arange_257", |cx, _| vec![cx.arange(257)]),
        case("constant_scalar", |cx, _| vec![cx.constant(1.5)]),
        case(
            "constant_i32",
            |cx, _| vec![cx.constant_of(2.0, DType::I32)],
        ),
        case("constant_of_f16", |cx, _| {
            vec![cx.constant_of(0.1, DType::F16)]
        }),
        case("full_2x3", |cx, _| vec![cx.full((2, 3), 0.5)]),
        case("constant_expr_static", |cx, _| {
            vec![cx.constant_expr(7, DType::I32)]
        }),
        case("zeros_3x4", |cx, _| vec![cx.zeros((3, 4))]),
        case("ones_17", |cx, _| vec![cx.ones([17])]),
        case("constant_plus_input", |cx, x| vec![cx.constant(2.0) + x[0]]),
        case("arange_times_input", |cx, x| vec![cx.arange(17) * x[0]]),
        case("full_minus_input", |cx, x| {
            vec![cx.full((2, 3), 0.5) - x[0]]
        }),
        case("iota_as_index", |cx, x| {
            vec![x[0].index_select(0, cx.iota(z() * 2, 4))]
        }),
        case("iota_cast_f32", |cx, _| {
            vec![cx.iota(z() * 2, 7).cast(DType::F32)]
        }),
    ]
}
