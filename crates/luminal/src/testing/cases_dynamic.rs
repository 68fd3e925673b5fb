//! Dynamic dimensions: inputs declared with named dims (`seq`, `k`, `L`, ...) bound with
//! `set_dim` at run time; every case also reruns the same compiled runtime with other
//! bindings (including 1), so nothing may be specialised to the first value.

use super::{case, Case};
use crate::dtype::DType;
use crate::graph::GraphTensor;
use crate::shape::Expression;

pub(super) fn cases() -> Vec<Case> {
    vec![
        case("dyn_exp", |_, x| vec![x[0].exp()]),
        case("dyn_add_bcast", |_, x| vec![x[0] + x[1]]),
        case("dyn_sum_seq", |_, x| vec![x[0].sum(0)]),
        case("dyn_sum_static_axis", |_, x| vec![x[0].sum(1)]),
        case("dyn_mean_seq", |_, x| vec![x[0].mean(0)]),
        case("dyn_max_seq", |_, x| vec![x[0].max(-1)]),
        case("dyn_var_seq", |_, x| vec![x[0].var(-1, 1)]),
        case("dyn_softmax_seq", |_, x| vec![x[0].softmax(-1)]),
        case("dyn_layer_norm", |_, x| vec![x[0].layer_norm(-1, 1e-5)]),
        case("dyn_matmul_rows", |_, x| vec![x[0].matmul(x[1])]),
        case("dyn_matmul_inner", |_, x| vec![x[0].matmul(x[1])]),
        case("dyn_two_dims", |_, x| vec![x[0].sum([0, 1])]),
        case("dyn_concat", |_, x| vec![x[0].concat_along(x[1], 0)]),
        case("dyn_concat_two_dyn", |_, x| {
            vec![GraphTensor::concat(&[x[0], x[1]], 0)]
        }),
        case("dyn_slice_to_end", |_, x| {
            vec![x[0].slice(0, 1, Expression::var("seq"))]
        }),
        case("dyn_slice_static", |_, x| vec![x[0].slice(1, 1, 3)]),
        case("dyn_pad", |_, x| vec![x[0].pad(&[(1, 2)], 0.5)]),
        case("dyn_permute", |_, x| vec![x[0].permute(&[1, 0])]),
        case("dyn_argmax", |_, x| vec![x[0].argmax(-1)]),
        case("dyn_cumsum", |_, x| vec![x[0].cumsum(0)]),
        case("dyn_expand_to", |_, x| vec![x[0].expand_to(("seq", 5))]),
        case("dyn_reshape", |_, x| vec![x[0].reshape(("seq", 2, 2))]),
        case("dyn_embedding", |_, x| vec![x[0].embedding(x[1])]),
        case("dyn_arange", |cx, _| vec![cx.arange("n")]),
        case("dyn_conv1d", |_, x| vec![x[0].conv1d(x[1], 1, 1, 1, 1)]),
        case("dyn_attention", |_, x| {
            let (q, k, v) = (x[0], x[1], x[2]);
            vec![(q.matmul(k.transpose(0, 1)) * (1.0 / 8f32.sqrt()))
                .softmax(-1)
                .matmul(v)]
        }),
        case("dyn_constant_expr", |cx, x| {
            let n = Expression::var("n");
            vec![x[0] + cx.constant_expr(n * 2 + 1, DType::F32)]
        }),
        case("dyn_batched_matmul", |_, x| vec![x[0].matmul(x[1])]),
        case("rerun_static_new_data", |_, x| vec![x[0].exp() * x[1]]),
        case("dyn_f16_exp", |_, x| vec![x[0].exp()]),
    ]
}
