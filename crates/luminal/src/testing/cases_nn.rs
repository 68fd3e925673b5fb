//! Neural-network building blocks: softmax/log_softmax, layer_norm/rms_norm, matmul (1-D to
//! 5-D, broadcasting, views, i32/f16/bf16), dot, tril/triu, cumulative ops, and small models.

use super::{case, Case};

pub(super) fn cases() -> Vec<Case> {
    vec![
        // softmax / log_softmax
        case("softmax_last", |_, x| vec![x[0].softmax(-1)]),
        case("softmax_axis0", |_, x| vec![x[0].softmax(0)]),
        case("softmax_257", |_, x| vec![x[0].softmax(-1)]),
        case("softmax_3d_mid", |_, x| vec![x[0].softmax(1)]),
        case("softmax_size1", |_, x| vec![x[0].softmax(-1)]),
        case("softmax_large_logits", |_, x| vec![x[0].softmax(-1)]),
        case("softmax_masked_neg_inf", |_, x| vec![x[0].softmax(-1)]),
        case("softmax_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).softmax(-1)]
        }),
        case("log_softmax_last", |_, x| vec![x[0].log_softmax(-1)]),
        case("log_softmax_axis0", |_, x| vec![x[0].log_softmax(0)]),
        case(
            "log_softmax_large_logits",
            |_, x| vec![x[0].log_softmax(-1)],
        ),
        // layer_norm / rms_norm
        case("layer_norm_last", |_, x| vec![x[0].layer_norm(-1, 1e-5)]),
        case("layer_norm_2axes", |_, x| {
            vec![x[0].layer_norm([-2, -1], 1e-5)]
        }),
        case("layer_norm_axis0", |_, x| vec![x[0].layer_norm(0, 1e-5)]),
        case("layer_norm_257", |_, x| vec![x[0].layer_norm(-1, 1e-6)]),
        case(
            "layer_norm_eps_large",
            |_, x| vec![x[0].layer_norm(-1, 0.1)],
        ),
        case("layer_norm_constant_row", |_, x| {
            vec![x[0].layer_norm(-1, 1e-5)]
        }),
        case("rms_norm_last", |_, x| vec![x[0].rms_norm(-1, 1e-6)]),
        case("rms_norm_axes", |_, x| vec![x[0].rms_norm([1, 2], 1e-5)]),
        case("rms_norm_257", |_, x| vec![x[0].rms_norm(-1, 1e-5)]),
        case(
            "rms_norm_eps_dominates",
            |_, x| vec![x[0].rms_norm(-1, 1.0)],
        ),
        // matmul / dot
        case("matmul_2d", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_k257", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_n257", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_1x1", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_k1", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_vec_mat", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_mat_vec", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_vec_vec", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_batched", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_bcast_batch", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_batched_mat", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_mat_batched", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_5d", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_batched_vec", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_vec_batched", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_transposed_rhs", |_, x| {
            vec![x[0].matmul(x[1].permute(&[1, 0]))]
        }),
        case("matmul_transposed_lhs", |_, x| {
            vec![x[0].transpose(0, 1).matmul(x[1])]
        }),
        case("matmul_sliced", |_, x| {
            vec![x[0].slice(1, 1, 9).matmul(x[1])]
        }),
        case("matmul_expanded_rhs", |_, x| {
            vec![x[0].matmul(x[1].expand(0, 2))]
        }),
        case("matmul_padded", |_, x| {
            vec![x[0].pad(&[(0, 0), (1, 1)], 0.5).matmul(x[1])]
        }),
        case("matmul_i32", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_f16", |_, x| vec![x[0].matmul(x[1])]),
        case("matmul_bf16", |_, x| vec![x[0].matmul(x[1])]),
        case("dot_17", |_, x| vec![x[0].dot(x[1])]),
        case("dot_257", |_, x| vec![x[0].dot(x[1])]),
        case("dot_1", |_, x| vec![x[0].dot(x[1])]),
        case("dot_sliced", |_, x| {
            vec![x[0].slice(0, 3, 20).dot(x[1].slice(0, 1, 2).squeeze(0))]
        }),
        // tril / triu
        case("tril_0", |_, x| vec![x[0].tril(0)]),
        case("triu_0", |_, x| vec![x[0].triu(0)]),
        case("tril_neg1", |_, x| vec![x[0].tril(-1)]),
        case("triu_neg1", |_, x| vec![x[0].triu(-1)]),
        case("tril_2", |_, x| vec![x[0].tril(2)]),
        case("triu_2", |_, x| vec![x[0].triu(2)]),
        case("tril_batched", |_, x| vec![x[0].tril(0)]),
        case("triu_batched_1", |_, x| vec![x[0].triu(1)]),
        case("tril_tall", |_, x| vec![x[0].tril(-2)]),
        // cumulative ops
        case("cumsum_axis0", |_, x| vec![x[0].cumsum(0)]),
        case("cumsum_last", |_, x| vec![x[0].cumsum(-1)]),
        case("cumsum_257", |_, x| vec![x[0].cumsum(0)]),
        case("cumsum_3d_mid", |_, x| vec![x[0].cumsum(1)]),
        case("cumprod_last", |_, x| vec![x[0].cumprod(-1)]),
        case("cumprod_axis0", |_, x| vec![x[0].cumprod(0)]),
        case("cumprod_with_zero", |_, x| vec![x[0].cumprod(0)]),
        case("cummax_last", |_, x| vec![x[0].cummax(-1)]),
        case("cummax_axis0", |_, x| vec![x[0].cummax(0)]),
        case("cummax_negative", |_, x| vec![x[0].cummax(0)]),
        case("cumsum_i32", |_, x| vec![x[0].cumsum(1)]),
        case("cumsum_permuted", |_, x| {
            vec![x[0].permute(&[1, 0]).cumsum(-1)]
        }),
        // small models
        case("mlp_gelu", |_, x| {
            vec![x[0].matmul(x[1]).gelu().matmul(x[2])]
        }),
        case("attention", |_, x| {
            let (q, k, v) = (x[0], x[1], x[2]);
            vec![(q.matmul(k.transpose(0, 1)) * (1.0 / 8f32.sqrt()))
                .softmax(-1)
                .matmul(v)]
        }),
        case("attention_batched", |_, x| {
            let (q, k, v) = (x[0], x[1], x[2]);
            vec![(q.matmul(k.transpose(-1, -2)) * (1.0 / 8f32.sqrt()))
                .softmax(-1)
                .matmul(v)]
        }),
        case("causal_attention", |cx, x| {
            let (q, k, v) = (x[0], x[1], x[2]);
            let scores = q.matmul(k.transpose(0, 1)) * (1.0 / 8f32.sqrt());
            // Above the diagonal: masked with -inf.
            let masked = cx
                .ones((5, 5))
                .tril(0)
                .lt(0.5f32)
                .select(f32::NEG_INFINITY, scores);
            vec![masked.softmax(-1).matmul(v)]
        }),
        case("residual_layer_norm", |_, x| {
            vec![(x[0] + x[0].matmul(x[1]).relu()).layer_norm(-1, 1e-5)]
        }),
        case("swiglu", |_, x| {
            let a = x[0].matmul(x[1]);
            vec![a.silu() * x[0].matmul(x[2])]
        }),
    ]
}
