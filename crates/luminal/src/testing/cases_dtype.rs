//! Dtypes: every cast (truncation toward zero, != 0 for bool, round-to-nearest-even and
//! overflow to inf for f16/bf16), and compute in f16/bf16 and mixed-dtype pipelines.

use super::{case, Case};
use crate::dtype::DType;

pub(super) fn cases() -> Vec<Case> {
    vec![
        // casts
        case("cast_f32_i32", |_, x| vec![x[0].cast(DType::I32)]),
        case("cast_f32_i32_edges", |_, x| vec![x[0].cast(DType::I32)]),
        case("cast_f32_bool", |_, x| vec![x[0].cast(DType::Bool)]),
        case("cast_i32_f32", |_, x| vec![x[0].cast(DType::F32)]),
        case("cast_i32_bool", |_, x| vec![x[0].cast(DType::Bool)]),
        case("cast_bool_f32", |_, x| vec![x[0].cast(DType::F32)]),
        case("cast_bool_i32", |_, x| vec![x[0].cast(DType::I32)]),
        case("cast_bool_f16", |_, x| vec![x[0].cast(DType::F16)]),
        case("cast_f32_f16", |_, x| vec![x[0].cast(DType::F16)]),
        case("cast_f32_f16_edges", |_, x| vec![x[0].cast(DType::F16)]),
        case("cast_f16_f32", |_, x| vec![x[0].cast(DType::F32)]),
        case("cast_f32_bf16", |_, x| vec![x[0].cast(DType::BF16)]),
        case("cast_f32_bf16_edges", |_, x| vec![x[0].cast(DType::BF16)]),
        case("cast_bf16_f32", |_, x| vec![x[0].cast(DType::F32)]),
        case("cast_f16_bf16", |_, x| vec![x[0].cast(DType::BF16)]),
        case("cast_bf16_f16", |_, x| vec![x[0].cast(DType::F16)]),
        case("cast_f16_i32", |_, x| vec![x[0].cast(DType::I32)]),
        case("cast_bf16_i32", |_, x| vec![x[0].cast(DType::I32)]),
        case("cast_i32_f16", |_, x| vec![x[0].cast(DType::F16)]),
        case("cast_i32_bf16", |_, x| vec![x[0].cast(DType::BF16)]),
        case("cast_f32_f16_f32", |_, x| {
            vec![x[0].cast(DType::F16).cast(DType::F32)]
        }),
        case("cast_same_dtype", |_, x| vec![x[0].cast(DType::F32)]),
        case("cast_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).cast(DType::I32)]
        }),
        case("count_true", |_, x| vec![x[0].cast(DType::F32).sum(1)]),
        case("count_lt_i32", |_, x| {
            vec![x[0].lt(0.0f32).cast(DType::I32).sum(1)]
        }),
        // f16 compute
        case("exp2_f16", |_, x| vec![x[0].exp2()]),
        case("log2_f16", |_, x| vec![x[0].log2()]),
        case("sin_f16", |_, x| vec![x[0].sin()]),
        case("sqrt_f16", |_, x| vec![x[0].sqrt()]),
        case("recip_f16", |_, x| vec![x[0].recip()]),
        case("exp_f16", |_, x| vec![x[0].exp()]),
        case("relu_f16", |_, x| vec![x[0].relu()]),
        case("exp_f16_overflow", |_, x| vec![x[0].exp()]),
        case("gelu_f16", |_, x| vec![x[0].gelu()]),
        case("softmax_f16", |_, x| vec![x[0].softmax(-1)]),
        case("layer_norm_f16", |_, x| vec![x[0].layer_norm(-1, 1e-5)]),
        case("sum_f16_257", |_, x| vec![x[0].sum(0)]),
        // bf16 compute
        case("exp_bf16", |_, x| vec![x[0].exp()]),
        case("sigmoid_bf16", |_, x| vec![x[0].sigmoid()]),
        case("silu_bf16", |_, x| vec![x[0].silu()]),
        case("sqrt_bf16", |_, x| vec![x[0].sqrt()]),
        case("softmax_bf16", |_, x| vec![x[0].softmax(-1)]),
        case("rms_norm_bf16", |_, x| vec![x[0].rms_norm(-1, 1e-5)]),
        case("exp_bf16_overflow", |_, x| vec![x[0].exp()]),
        // mixed-dtype pipelines
        case("f16_to_f32_mul", |_, x| vec![x[0].cast(DType::F32) * x[1]]),
        case("f32_compute_to_bf16", |_, x| {
            vec![x[0].exp().cast(DType::BF16)]
        }),
        case("i32_ids_to_f32_math", |_, x| {
            vec![x[0].cast(DType::F32) * 0.5f32]
        }),
    ]
}
