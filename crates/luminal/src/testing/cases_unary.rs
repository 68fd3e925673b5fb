//! Unary elementwise ops: the primops (exp2, log2, sin, sqrt, recip) on odd sizes and ranks,
//! every composite unary hl_op, non-finite inputs, and inputs read through views.

use super::{case, Case};

pub(super) fn cases() -> Vec<Case> {
    let mut v = vec![];
    // The primops on [3, 17], [1], [257], [] and [2, 3, 1, 5].
    for name in [
        "exp2_3x17",
        "exp2_1",
        "exp2_257",
        "exp2_scalar",
        "exp2_2x3x1x5",
    ] {
        v.push(case(name, |_, x| vec![x[0].exp2()]));
    }
    for name in [
        "log2_3x17",
        "log2_1",
        "log2_257",
        "log2_scalar",
        "log2_2x3x1x5",
    ] {
        v.push(case(name, |_, x| vec![x[0].log2()]));
    }
    for name in ["sin_3x17", "sin_1", "sin_257", "sin_scalar", "sin_2x3x1x5"] {
        v.push(case(name, |_, x| vec![x[0].sin()]));
    }
    for name in [
        "sqrt_3x17",
        "sqrt_1",
        "sqrt_257",
        "sqrt_scalar",
        "sqrt_2x3x1x5",
    ] {
        v.push(case(name, |_, x| vec![x[0].sqrt()]));
    }
    for name in [
        "recip_3x17",
        "recip_1",
        "recip_257",
        "recip_scalar",
        "recip_2x3x1x5",
    ] {
        v.push(case(name, |_, x| vec![x[0].recip()]));
    }

    // Composite unary ops.
    v.extend([
        case("exp_3x17", |_, x| vec![x[0].exp()]),
        case("exp_257", |_, x| vec![x[0].exp()]),
        case("log_3x17", |_, x| vec![x[0].log()]),
        case("ln_17", |_, x| vec![x[0].ln()]),
        case("cos_3x17", |_, x| vec![x[0].cos()]),
        case("tan_3x17", |_, x| vec![x[0].tan()]),
        case("tanh_3x17", |_, x| vec![x[0].tanh()]),
        case("tanh_257", |_, x| vec![x[0].tanh()]),
        case("abs_3x17", |_, x| vec![x[0].abs()]),
        case("sign_3x17", |_, x| vec![x[0].sign()]),
        case("square_3x17", |_, x| vec![x[0].square()]),
        case("neg_3x17", |_, x| vec![-x[0]]),
        case("relu_3x17", |_, x| vec![x[0].relu()]),
        case("relu_257", |_, x| vec![x[0].relu()]),
        case("leaky_relu_0p1", |_, x| vec![x[0].leaky_relu(0.1)]),
        case("leaky_relu_0p01", |_, x| vec![x[0].leaky_relu(0.01)]),
        case("sigmoid_3x17", |_, x| vec![x[0].sigmoid()]),
        case("sigmoid_257", |_, x| vec![x[0].sigmoid()]),
        case("silu_3x17", |_, x| vec![x[0].silu()]),
        case("swish_17", |_, x| vec![x[0].swish()]),
        case("gelu_3x17", |_, x| vec![x[0].gelu()]),
        case("gelu_257", |_, x| vec![x[0].gelu()]),
        case("gelu_tanh_3x17", |_, x| vec![x[0].gelu_tanh()]),
        case("softplus_3x17", |_, x| vec![x[0].softplus()]),
        case("erf_3x17", |_, x| vec![x[0].erf()]),
        case("floor_3x17", |_, x| vec![x[0].floor()]),
        case("floor_exact", |_, x| vec![x[0].floor()]),
        case("pow_2", |_, x| vec![x[0].pow(2.0)]),
        case("pow_3_negative_base", |_, x| vec![x[0].pow(3.0)]),
        case("pow_neg1", |_, x| vec![x[0].pow(-1.0)]),
        case("pow_0", |_, x| vec![x[0].pow(0.0)]),
        case("pow_half", |_, x| vec![x[0].pow(0.5)]),
        case("pow_1p7", |_, x| vec![x[0].pow(1.7)]),
        case("pow_neg2p5", |_, x| vec![x[0].pow(-2.5)]),
    ]);

    // Non-finite inputs.
    v.extend([
        case("relu_nonfinite", |_, x| vec![x[0].relu()]),
        case("exp_nonfinite", |_, x| vec![x[0].exp()]),
        case("exp2_nonfinite", |_, x| vec![x[0].exp2()]),
        case("log_nonfinite", |_, x| vec![x[0].log()]),
        case("log2_nonfinite", |_, x| vec![x[0].log2()]),
        case("sqrt_nonfinite", |_, x| vec![x[0].sqrt()]),
        case("recip_nonfinite", |_, x| vec![x[0].recip()]),
        case("sin_nonfinite", |_, x| vec![x[0].sin()]),
        case("sigmoid_nonfinite", |_, x| vec![x[0].sigmoid()]),
        case("tanh_saturation", |_, x| vec![x[0].tanh()]),
        case("abs_nonfinite", |_, x| vec![x[0].abs()]),
        case("neg_nonfinite", |_, x| vec![-x[0]]),
        case("square_nonfinite", |_, x| vec![x[0].square()]),
        case("softplus_extreme", |_, x| vec![x[0].softplus()]),
        case("sign_nonfinite", |_, x| vec![x[0].sign()]),
    ]);

    // Inputs read through non-contiguous views.
    v.extend([
        case("exp_permuted", |_, x| vec![x[0].permute(&[1, 0]).exp()]),
        case("log2_permuted_3d", |_, x| {
            vec![x[0].permute(&[2, 0, 1]).log2()]
        }),
        case("sin_sliced", |_, x| vec![x[0].slice(1, 2, 19).sin()]),
        case("sqrt_padded", |_, x| {
            vec![x[0].pad(&[(1, 0), (2, 1)], 4.0).sqrt()]
        }),
        case("recip_expanded", |_, x| vec![x[0].expand(0, 4).recip()]),
        case("relu_sliced_padded", |_, x| {
            vec![x[0].slice(0, 1, 4).pad(&[(0, 0), (2, 2)], -1.0).relu()]
        }),
        case("exp2_expand_to", |_, x| {
            vec![x[0].expand_to((3, 17)).exp2()]
        }),
        case("tanh_transposed", |_, x| vec![x[0].transpose(0, 2).tanh()]),
    ]);
    v
}
