//! Property tests for the symbolic shape machinery: simplification never changes the
//! value of an expression, and view ops on a `ShapeTracker` agree with materialising
//! each op on a real buffer.

use luminal::shape::{Expression, ShapeTracker};
use proptest::prelude::*;
use std::collections::HashMap;

// ---------------------------------------------------------------- expressions

const NAMES: [&str; 4] = ["a", "b", "seq", "z"];

/// A raw (unsimplified) expression tree, evaluated naively.
#[derive(Debug, Clone)]
enum Raw {
    Const(i64),
    Var(usize),
    Neg(Box<Raw>),
    Bin(BinOp, Box<Raw>, Box<Raw>),
}

#[derive(Debug, Clone, Copy)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Min,
    Max,
    Lt,
    Eq,
}

fn raw_strategy() -> impl Strategy<Value = Raw> {
    let leaf = prop_oneof![
        2 => (-8i64..8).prop_map(Raw::Const),
        1 => (1i64..8).prop_map(Raw::Const),
        3 => (0usize..NAMES.len()).prop_map(Raw::Var),
    ];
    // Weights: add sub mul div mod min max lt eq.
    let op = prop_oneof![
        3 => Just(BinOp::Add), 2 => Just(BinOp::Sub), 3 => Just(BinOp::Mul),
        4 => Just(BinOp::Div), 4 => Just(BinOp::Mod), 1 => Just(BinOp::Min),
        1 => Just(BinOp::Max), 1 => Just(BinOp::Lt), 1 => Just(BinOp::Eq),
    ];
    leaf.prop_recursive(4, 16, 2, move |inner| {
        prop_oneof![
            1 => inner.clone().prop_map(|a| Raw::Neg(Box::new(a))),
            12 => (op.clone(), inner.clone(), inner)
                .prop_map(|(op, a, b)| Raw::Bin(op, Box::new(a), Box::new(b))),
        ]
    })
}

fn floor_div(a: i64, b: i64) -> i64 {
    let q = a / b;
    if a % b != 0 && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn floor_mod(a: i64, b: i64) -> i64 {
    a - b * floor_div(a, b)
}

/// Naive evaluation; `None` on division by zero or when values get huge.
fn eval_raw(r: &Raw, vals: &[i64]) -> Option<i64> {
    let v = match r {
        Raw::Const(c) => *c,
        Raw::Var(i) => vals[*i],
        Raw::Neg(a) => -eval_raw(a, vals)?,
        Raw::Bin(op, a, b) => {
            let (a, b) = (eval_raw(a, vals)?, eval_raw(b, vals)?);
            match op {
                BinOp::Add => a + b,
                BinOp::Sub => a - b,
                BinOp::Mul => a.checked_mul(b)?,
                BinOp::Div if b == 0 => return None,
                BinOp::Div => floor_div(a, b),
                BinOp::Mod if b == 0 => return None,
                BinOp::Mod => floor_mod(a, b),
                BinOp::Min => a.min(b),
                BinOp::Max => a.max(b),
                BinOp::Lt => (a < b) as i64,
                BinOp::Eq => (a == b) as i64,
            }
        }
    };
    (v.abs() < 1 << 40).then_some(v)
}

fn build(r: &Raw) -> Expression {
    match r {
        Raw::Const(c) => Expression::constant(*c),
        Raw::Var(i) => Expression::var(NAMES[*i]),
        Raw::Neg(a) => -build(a),
        Raw::Bin(op, a, b) => {
            let (a, b) = (build(a), build(b));
            match op {
                BinOp::Add => a + b,
                BinOp::Sub => a - &b,
                BinOp::Mul => &a * b,
                BinOp::Div => a / b,
                BinOp::Mod => a % b,
                BinOp::Min => Expression::min(&a, b),
                BinOp::Max => Expression::max(&a, b),
                BinOp::Lt => a.lt(b),
                BinOp::Eq => a.equals(b),
            }
        }
    }
}

/// Index-like expressions: sums of ((v / c) % m) * s plus raw pieces.
fn index_strategy() -> impl Strategy<Value = Raw> {
    let piece = (
        0usize..NAMES.len(),
        1i64..6,
        1i64..6,
        -3i64..7,
        any::<bool>(),
    )
        .prop_map(|(v, c, m, s, with_mod)| {
            let div = Raw::Bin(BinOp::Div, Box::new(Raw::Var(v)), Box::new(Raw::Const(c)));
            let inner = if with_mod {
                Raw::Bin(BinOp::Mod, Box::new(div), Box::new(Raw::Const(m)))
            } else {
                div
            };
            Raw::Bin(BinOp::Mul, Box::new(inner), Box::new(Raw::Const(s)))
        });
    let modp = (0usize..NAMES.len(), 1i64..13, -3i64..7).prop_map(|(v, c, s)| {
        let m = Raw::Bin(BinOp::Mod, Box::new(Raw::Var(v)), Box::new(Raw::Const(c)));
        Raw::Bin(BinOp::Mul, Box::new(m), Box::new(Raw::Const(s)))
    });
    // ((v % m) / c), ((v % m) % c), ((v / c1) / c2)
    let nested = (0usize..NAMES.len(), 1i64..5, 1i64..5, 0usize..3).prop_map(|(v, k, c, kind)| {
        let (outer, inner, m) = match kind {
            0 => (BinOp::Div, BinOp::Mod, k * c),
            1 => (BinOp::Mod, BinOp::Mod, k * c),
            _ => (BinOp::Div, BinOp::Div, k),
        };
        let i = Raw::Bin(inner, Box::new(Raw::Var(v)), Box::new(Raw::Const(m)));
        Raw::Bin(outer, Box::new(i), Box::new(Raw::Const(c)))
    });
    // Linear forms compared / divided: (c1*v1 + c2*v2 + k1) op (c3*v1 + c4*v3 + k2)
    let lin = || {
        (
            0usize..NAMES.len(),
            0usize..NAMES.len(),
            -4i64..5,
            -4i64..5,
            -9i64..10,
        )
            .prop_map(|(v1, v2, c1, c2, k)| {
                let t = |v: usize, c: i64| {
                    Raw::Bin(BinOp::Mul, Box::new(Raw::Var(v)), Box::new(Raw::Const(c)))
                };
                let s = Raw::Bin(BinOp::Add, Box::new(t(v1, c1)), Box::new(t(v2, c2)));
                Raw::Bin(BinOp::Add, Box::new(s), Box::new(Raw::Const(k)))
            })
    };
    let cmp_ops = prop_oneof![
        Just(BinOp::Lt),
        Just(BinOp::Eq),
        Just(BinOp::Min),
        Just(BinOp::Max),
        Just(BinOp::Div),
        Just(BinOp::Mod),
    ];
    let cmp = (
        cmp_ops,
        lin(),
        prop_oneof![lin(), (-9i64..10).prop_map(Raw::Const)],
    )
        .prop_map(|(op, a, b)| Raw::Bin(op, Box::new(a), Box::new(b)));
    let part = prop_oneof![3 => piece, 2 => modp, 2 => nested, 2 => cmp, 1 => raw_strategy()];
    let scaled = (part, -2i64..4)
        .prop_map(|(p, s)| Raw::Bin(BinOp::Mul, Box::new(p), Box::new(Raw::Const(s))));
    prop::collection::vec(scaled, 1..6).prop_map(|parts| {
        parts
            .into_iter()
            .reduce(|a, b| Raw::Bin(BinOp::Add, Box::new(a), Box::new(b)))
            .expect("non-empty")
    })
}

fn check_expr(raw: &Raw, bindings: &[[i64; 4]]) -> Result<(), TestCaseError> {
    let e = build(raw);
    let compiled = e.compile(&NAMES).expect("all variables are listed");
    for vals in bindings {
        let Some(expected) = eval_raw(raw, vals) else {
            continue;
        };
        let map: HashMap<String, i64> = NAMES
            .iter()
            .zip(vals)
            .map(|(n, v)| (n.to_string(), *v))
            .collect();
        prop_assert_eq!(
            e.exec(&map),
            Ok(expected),
            "expr {} raw {:?} vals {:?}",
            e,
            raw,
            vals
        );
        prop_assert_eq!(compiled.eval(vals), Ok(expected), "compiled {}", e);
        let (lo, hi) = e.bounds();
        prop_assert!(
            lo.is_none_or(|l| l <= expected),
            "lo bound {:?} of {}",
            lo,
            e
        );
        prop_assert!(
            hi.is_none_or(|h| h >= expected),
            "hi bound {:?} of {}",
            hi,
            e
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2500))]

    #[test]
    fn simplify_preserves_value(
        raw in raw_strategy(),
        bindings in prop::collection::vec(prop::array::uniform4(0i64..40), 6),
    ) {
        check_expr(&raw, &bindings)?;
    }

    #[test]
    fn simplify_preserves_value_index_like(
        raw in index_strategy(),
        bindings in prop::collection::vec(prop::array::uniform4(0i64..40), 6),
    ) {
        check_expr(&raw, &bindings)?;
    }
}

// ---------------------------------------------------------------- shape trackers

/// A materialised row-major tensor.
#[derive(Debug, Clone)]
struct Tensor {
    dims: Vec<usize>,
    data: Vec<i64>,
}

/// Row-major multi-index of flat index `z`.
fn unflatten(mut z: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        idx[i] = z % dims[i];
        z /= dims[i];
    }
    idx
}

fn flat(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (i, d)| acc * d + i)
}

impl Tensor {
    /// Build a tensor of shape `dims` whose element `o` is `self[src(o)]`, or 0 when
    /// `src` returns `None` (padding).
    fn gather(&self, dims: Vec<usize>, src: impl Fn(&[usize]) -> Option<Vec<usize>>) -> Tensor {
        let n: usize = dims.iter().product();
        let data = (0..n)
            .map(|z| match src(&unflatten(z, &dims)) {
                Some(s) => self.data[flat(&s, &self.dims)],
                None => 0,
            })
            .collect();
        Tensor { dims, data }
    }
}

#[derive(Debug, Clone)]
struct OpSeed {
    kind: u8,
    p: [usize; 4],
}

fn op_seed() -> impl Strategy<Value = OpSeed> {
    (0u8..11, prop::array::uniform4(0usize..1000)).prop_map(|(kind, p)| OpSeed { kind, p })
}

fn c(v: usize) -> Expression {
    Expression::from(v)
}

fn prime_factors(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut f = 2;
    while n > 1 {
        while n.is_multiple_of(f) {
            out.push(f);
            n /= f;
        }
        f += 1;
    }
    out
}

/// Apply one op (chosen from `seed`) to both the tracker and the materialised tensor.
/// Returns a description of what was done, or `None` if the op was skipped.
fn apply_op(st: &mut ShapeTracker, t: &mut Tensor, seed: &OpSeed) -> Option<String> {
    const MAX_ELEMS: usize = 2048;
    let r = t.dims.len();
    let p = seed.p;
    let n: usize = t.dims.iter().product();
    let dims = t.dims.clone();
    match seed.kind {
        0 if r > 0 => {
            let mut perm: Vec<usize> = (0..r).collect();
            let mut s = p[0];
            for i in (1..r).rev() {
                perm.swap(i, s % (i + 1));
                s /= i + 1;
            }
            st.permute(&perm);
            let inv_dims = perm.iter().map(|&a| dims[a]).collect();
            *t = t.gather(inv_dims, |o| {
                let mut src = vec![0; r];
                for (k, &a) in perm.iter().enumerate() {
                    src[a] = o[k];
                }
                Some(src)
            });
            Some(format!("permute {perm:?}"))
        }
        1 if r > 0 => {
            let (a, b) = (p[0] % r, p[1] % r);
            st.transpose(a, b);
            let mut nd = dims.clone();
            nd.swap(a, b);
            *t = t.gather(nd, |o| {
                let mut s = o.to_vec();
                s.swap(a, b);
                Some(s)
            });
            Some(format!("transpose {a} {b}"))
        }
        2 if r > 0 => {
            let axis = p[0] % r;
            let d = dims[axis];
            let (start, end) = if d == 0 || p[3].is_multiple_of(13) {
                let s = p[1] % (d + 1);
                (s, s)
            } else {
                let s = p[1] % d;
                (s, s + 1 + p[2] % (d - s))
            };
            // Sometimes ask for an end past the dim: it is clamped.
            let asked_end = if p[3].is_multiple_of(5) { end + 2 } else { end };
            st.slice(axis, c(start), c(asked_end));
            let end = asked_end.min(d);
            let mut nd = dims.clone();
            nd[axis] = end - start;
            *t = t.gather(nd, |o| {
                let mut s = o.to_vec();
                s[axis] += start;
                Some(s)
            });
            Some(format!("slice {axis} {start}..{asked_end}"))
        }
        3 if r > 0 => {
            let axis = p[0] % r;
            let (before, after) = (p[1] % 3, p[2] % 3);
            let d = dims[axis];
            if n / d.max(1) * (d + before + after) > MAX_ELEMS {
                return None;
            }
            st.pad(axis, c(before), c(after));
            let mut nd = dims.clone();
            nd[axis] = d + before + after;
            *t = t.gather(nd, |o| {
                let i = o[axis].checked_sub(before).filter(|&i| i < d)?;
                let mut s = o.to_vec();
                s[axis] = i;
                Some(s)
            });
            Some(format!("pad {axis} {before} {after}"))
        }
        4 => {
            let axis = p[0] % (r + 1);
            let size = 1 + p[1] % 3;
            if n * size > MAX_ELEMS {
                return None;
            }
            st.expand(axis, c(size));
            let mut nd = dims.clone();
            nd.insert(axis, size);
            *t = t.gather(nd, |o| {
                let mut s = o.to_vec();
                s.remove(axis);
                Some(s)
            });
            Some(format!("expand {axis} {size}"))
        }
        5 => {
            let ones: Vec<usize> = (0..r).filter(|&i| dims[i] == 1).collect();
            if ones.is_empty() {
                return None;
            }
            let axis = ones[p[0] % ones.len()];
            let size = 1 + p[1] % 3;
            if n * size > MAX_ELEMS {
                return None;
            }
            st.broadcast_dim(axis, c(size));
            let mut nd = dims.clone();
            nd[axis] = size;
            *t = t.gather(nd, |o| {
                let mut s = o.to_vec();
                s[axis] = 0;
                Some(s)
            });
            Some(format!("broadcast_dim {axis} {size}"))
        }
        6 => {
            let axis = p[0] % (r + 1);
            st.unsqueeze(axis);
            let mut nd = dims.clone();
            nd.insert(axis, 1);
            *t = t.gather(nd, |o| {
                let mut s = o.to_vec();
                s.remove(axis);
                Some(s)
            });
            Some(format!("unsqueeze {axis}"))
        }
        7 => {
            let ones: Vec<usize> = (0..r).filter(|&i| dims[i] == 1).collect();
            if ones.is_empty() {
                return None;
            }
            let axis = ones[p[0] % ones.len()];
            st.squeeze(axis);
            let mut nd = dims.clone();
            nd.remove(axis);
            *t = t.gather(nd, |o| {
                let mut s = o.to_vec();
                s.insert(axis, 0);
                Some(s)
            });
            Some(format!("squeeze {axis}"))
        }
        8 if n > 0 => {
            // A random factorisation of n into 1..=4 dims, plus maybe a unit dim.
            let mut f = prime_factors(n);
            let mut s = p[0];
            for i in (1..f.len()).rev() {
                f.swap(i, s % (i + 1));
                s /= i + 1;
            }
            let groups = 1 + p[1] % 4;
            let mut nd = vec![1usize; groups];
            for (i, x) in f.iter().enumerate() {
                nd[(i * 7 + p[2]) % groups] *= x;
            }
            if p[3].is_multiple_of(3) {
                nd.insert(p[3] % (groups + 1), 1);
            }
            let before = st.clone();
            if st.reshape(nd.iter().map(|&d| c(d)).collect()) {
                t.dims = nd.clone();
                Some(format!("reshape {nd:?}"))
            } else {
                assert_eq!(
                    *st, before,
                    "failed reshape must leave the tracker unchanged"
                );
                None
            }
        }
        9 if r > 0 => {
            let start = p[0] % r;
            let end = start + p[1] % (r - start);
            let before = st.clone();
            if st.flatten(start, end) {
                let mut nd = dims[..start].to_vec();
                nd.push(dims[start..=end].iter().product());
                nd.extend_from_slice(&dims[end + 1..]);
                t.dims = nd;
                Some(format!("flatten {start} {end}"))
            } else {
                assert_eq!(
                    *st, before,
                    "failed flatten must leave the tracker unchanged"
                );
                None
            }
        }
        10 if r > 0 => {
            let axis = p[0] % r;
            let d = dims[axis];
            if d == 0 {
                return None;
            }
            let dil = 1 + p[1] % 2;
            let size = 1 + p[2] % ((d - 1) / dil + 1);
            let step = 1 + p[3] % 3;
            let windows = (d - dil * (size - 1) - 1) / step + 1;
            if n / d * windows * size > MAX_ELEMS {
                return None;
            }
            let before = st.clone();
            if !st.unfold(axis, c(size), c(step), c(dil)) {
                assert_eq!(
                    *st, before,
                    "failed unfold must leave the tracker unchanged"
                );
                return None;
            }
            let mut nd = dims.clone();
            nd[axis] = windows;
            nd.push(size);
            *t = t.gather(nd, |o| {
                let mut s = o[..r].to_vec();
                s[axis] = o[axis] * step + o[r] * dil;
                Some(s)
            });
            Some(format!("unfold {axis} size {size} step {step} dil {dil}"))
        }
        _ => None,
    }
}

/// Read every logical element of `st` from `buf` and compare with `t`.
fn check_view(
    st: &ShapeTracker,
    t: &Tensor,
    buf: &[i64],
    log: &[String],
) -> Result<(), TestCaseError> {
    let dims: Vec<Expression> = t.dims.iter().map(|&d| c(d)).collect();
    prop_assert_eq!(st.dims(), dims, "dims after {:?}", log);
    let n = t.data.len();
    prop_assert_eq!(st.n_elements().as_constant(), Some(n as i64));
    let index = st.index_expression();
    let valid = st.valid_expression();
    let ci = index.compile(&["z"]).expect("index only uses z");
    let cv = valid.compile(&["z"]).expect("validity only uses z");
    for z in 0..n {
        let v = cv.eval(&[z as i64]).expect("valid evaluates");
        prop_assert!(v == 0 || v == 1, "valid {} at z={} for {}", v, z, st);
        let got = if v == 1 {
            let i = ci.eval(&[z as i64]).expect("index evaluates");
            prop_assert!(
                i >= 0 && (i as usize) < buf.len(),
                "index {} out of range at z={} for {} after {:?}",
                i,
                z,
                st,
                log
            );
            buf[i as usize]
        } else {
            0
        };
        prop_assert_eq!(
            got,
            t.data[z],
            "z={} view {} index {} valid {} after {:?}",
            z,
            st,
            index,
            valid,
            log
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn view_chains_match_materialised(
        dims in prop::collection::vec(1usize..=5, 1..=4),
        ops in prop::collection::vec(op_seed(), 1..8),
    ) {
        let n: usize = dims.iter().product();
        let buf: Vec<i64> = (1..=n as i64).collect();
        let mut t = Tensor { dims: dims.clone(), data: buf.clone() };
        let mut st = ShapeTracker::new(dims.iter().map(|&d| c(d)).collect());
        prop_assert!(st.is_contiguous());
        let mut log = Vec::new();
        for seed in &ops {
            if let Some(desc) = apply_op(&mut st, &mut t, seed) {
                log.push(desc);
                check_view(&st, &t, &buf, &log)?;
            }
        }
    }
}

/// Apply the same op to a constant-shaped tracker and to a symbolic-shaped twin
/// (symbolic sizes are variables bound in `env`). Returns false to end the chain.
fn apply_twin(
    st: &mut ShapeTracker,
    sy: &mut ShapeTracker,
    env: &mut HashMap<String, i64>,
    seed: &OpSeed,
) -> bool {
    let dims: Vec<usize> = st
        .dims()
        .iter()
        .map(|d| d.as_constant().expect("constant dims") as usize)
        .collect();
    let r = dims.len();
    let p = seed.p;
    let n: usize = dims.iter().product();
    let mut fresh = |v: usize| {
        let name = format!("s{}", env.len());
        env.insert(name.clone(), v as i64);
        Expression::var(&name)
    };
    match seed.kind {
        0 | 1 if r > 0 => {
            let (a, b) = (p[0] % r, p[1] % r);
            st.transpose(a, b);
            sy.transpose(a, b);
        }
        2 if r > 0 => {
            let axis = p[0] % r;
            let d = dims[axis];
            let start = p[1] % d;
            let end = if p[2].is_multiple_of(2) {
                d
            } else {
                start + 1 + p[3] % (d - start)
            };
            st.slice(axis, c(start), c(end));
            let sym_end = if end == d {
                sy.dims()[axis].clone()
            } else {
                c(end)
            };
            let sym_start = if p[3].is_multiple_of(2) {
                fresh(start)
            } else {
                c(start)
            };
            sy.slice(axis, sym_start, sym_end);
        }
        3 if r > 0 => {
            let axis = p[0] % r;
            let (before, after) = (p[1] % 3, p[2] % 3);
            if n / dims[axis] * (dims[axis] + before + after) > 2048 {
                return true;
            }
            st.pad(axis, c(before), c(after));
            let (b, a) = (fresh(before), fresh(after));
            sy.pad(axis, b, a);
        }
        4 | 5 => {
            let axis = p[0] % (r + 1);
            let size = 1 + p[1] % 3;
            if n * size > 2048 {
                return true;
            }
            st.expand(axis, c(size));
            let s = fresh(size);
            sy.expand(axis, s);
        }
        6 => {
            let axis = p[0] % (r + 1);
            st.unsqueeze(axis);
            sy.unsqueeze(axis);
        }
        7 => {
            let ones: Vec<usize> = (0..r)
                .filter(|&i| sy.dims()[i].as_constant() == Some(1))
                .collect();
            if let Some(&axis) = ones.get(p[0] % ones.len().max(1)) {
                st.squeeze(axis);
                sy.squeeze(axis);
            }
        }
        8 | 9 if r > 0 => {
            let start = p[0] % r;
            let end = start + p[1] % (r - start);
            let (a, b) = (
                st.clone().flatten(start, end),
                sy.clone().flatten(start, end),
            );
            if !b {
                return false;
            }
            assert!(
                a,
                "symbolic flatten succeeded where the constant one failed"
            );
            st.flatten(start, end);
            sy.flatten(start, end);
        }
        10 if r > 0 => {
            let axis = p[0] % r;
            let d = dims[axis];
            let dil = 1 + p[1] % 2;
            let size = 1 + p[2] % ((d - 1) / dil + 1);
            let step = 1 + p[3] % 3;
            let windows = (d - dil * (size - 1) - 1) / step + 1;
            if n / d * windows * size > 2048 {
                return true;
            }
            // A symbolic pad of 0 is still a (possible) mask, so the twin may refuse.
            if sy.is_masked() {
                return false;
            }
            assert!(st.unfold(axis, c(size), c(step), c(dil)));
            assert!(sy.unfold(axis, c(size), c(step), c(dil)));
        }
        _ => {}
    }
    true
}

fn check_twin(
    st: &ShapeTracker,
    sy: &ShapeTracker,
    env: &HashMap<String, i64>,
) -> Result<(), TestCaseError> {
    let n = st.n_elements().as_constant().expect("constant") as usize;
    prop_assert_eq!(sy.n_elements().exec(env), Ok(n as i64));
    let (i0, v0) = (st.index_expression(), st.valid_expression());
    let (i1, v1) = (sy.index_expression(), sy.valid_expression());
    for z in 0..n {
        let mut env = env.clone();
        env.insert("z".into(), z as i64);
        let valid = v0.exec(&env).expect("valid");
        prop_assert_eq!(v1.exec(&env), Ok(valid), "valid z={} {} vs {}", z, st, sy);
        if valid == 1 {
            prop_assert_eq!(
                i1.exec(&env),
                i0.exec(&env),
                "index z={} {} vs {}",
                z,
                st,
                sy
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn symbolic_views_match_constant_views(
        dims in prop::collection::vec(1usize..=5, 1..=4),
        ops in prop::collection::vec(op_seed(), 1..8),
    ) {
        let mut env = HashMap::new();
        let sym_dims: Vec<Expression> = dims
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                env.insert(format!("d{i}"), d as i64);
                Expression::var(&format!("d{i}"))
            })
            .collect();
        let mut st = ShapeTracker::new(dims.iter().map(|&d| c(d)).collect());
        let mut sy = ShapeTracker::new(sym_dims);
        for seed in &ops {
            if !apply_twin(&mut st, &mut sy, &mut env, seed) {
                break;
            }
            check_twin(&st, &sy, &env)?;
        }
    }
}
