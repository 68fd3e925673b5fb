//! The canonicalising algebra behind [`Expression`]: every function here takes
//! canonical expressions and returns a canonical expression. This file holds the
//! polynomial core and the div/mod recombination; the rules for `/`, `%`, `min`,
//! `max`, `<`, `==` are in `rules.rs` and the interval analysis in `bounds.rs`.
//!
//! Rules (floor division / floor modulo, variables >= 0, divisors non-zero):
//! * `+`, `*`: polynomial arithmetic (like-term collection, constant folding, `x+0`,
//!   `x*1`, `x*0`), `b*b = b` for boolean (`<`, `==`) atoms.
//! * After `+`/`*`, [`recombine`] applies the identities `d*(x/d) + x%d = x` and
//!   `d*((x/d)%m) + x%d = x%(d*m)` whenever that makes the expression smaller, e.g.
//!   `(x/c)*c + x%c -> x`, `x - (x/c)*c -> x%c`, `c*((x/c)%m) + x%c -> x%(c*m)`.
//! * `/` by a constant: folding, splitting off multiples (`(c*q + r)/c = q + r/c`),
//!   common factors, `(x/a)/b -> x/(a*b)`, `(x%(c*k))/c -> (x/c)%k`, bounds.
//! * `/` by an expression: `a/a = 1`, splitting off multiples of a monomial divisor,
//!   exact polynomial quotients (`(a*b)/b = a`), common constant factors.
//! * `%`: folding, reducing coefficients modulo the divisor, common factors,
//!   `(x%m)%c -> x%c` when `c | m`, bounds (`r%c -> r` when `0 <= r < c`), `a%a = 0`.
//! * `min`/`max`/`<`/`==`: decided by the bounds of the difference when possible,
//!   otherwise a canonically ordered atom.

use std::cmp::Ordering;
use std::sync::Arc;

use super::symbolic::{Atom, Expression, Op, Term};

pub(crate) use super::bounds::{bounds, nonneg};
pub(crate) use super::rules::{div, eq, lt, max, min, modulo};

// ---------------------------------------------------------------- integer helpers

/// Floor division; `None` on a zero divisor. Wraps on overflow.
pub(crate) fn floor_div(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    let (q, r) = (a.wrapping_div(b), a.wrapping_rem(b));
    Some(if r != 0 && ((r < 0) != (b < 0)) {
        q.wrapping_sub(1)
    } else {
        q
    })
}

/// Floor modulo (result has the sign of the divisor); `None` on a zero divisor.
pub(crate) fn floor_mod(a: i64, b: i64) -> Option<i64> {
    if b == 0 {
        return None;
    }
    let r = a.wrapping_rem(b);
    Some(if r != 0 && ((r < 0) != (b < 0)) {
        r.wrapping_add(b)
    } else {
        r
    })
}

pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// gcd of all coefficients of all given expressions (0 if all are zero).
pub(crate) fn coef_gcd(es: &[&Expression]) -> i64 {
    let mut g = 0u64;
    for e in es {
        for t in &e.terms {
            g = gcd(g, t.coef.unsigned_abs());
            if g == 1 {
                return 1;
            }
        }
    }
    i64::try_from(g).unwrap_or(1)
}

/// Divide every coefficient by `g` (which must divide them all).
pub(crate) fn div_coefs(e: &Expression, g: i64) -> Expression {
    Expression {
        terms: e
            .terms
            .iter()
            .map(|t| Term {
                atoms: t.atoms.clone(),
                coef: t.coef / g,
            })
            .collect(),
    }
}

pub(crate) fn konst(c: i64) -> Expression {
    Expression::constant(c)
}

fn atom_expr(a: Atom) -> Expression {
    Expression {
        terms: vec![Term {
            atoms: vec![a],
            coef: 1,
        }],
    }
}

pub(crate) fn bin_atom(op: Op, a: &Expression, b: &Expression) -> Atom {
    Atom::Bin(op, Arc::new((a.clone(), b.clone())))
}

pub(crate) fn bin(op: Op, a: &Expression, b: &Expression) -> Expression {
    atom_expr(bin_atom(op, a, b))
}

pub(crate) fn single_term(e: &Expression) -> Option<&Term> {
    match e.terms.as_slice() {
        [t] => Some(t),
        _ => None,
    }
}

pub(crate) fn single_atom(e: &Expression) -> Option<&Atom> {
    match e.terms.as_slice() {
        [t] if t.coef == 1 && t.atoms.len() == 1 => Some(&t.atoms[0]),
        _ => None,
    }
}

fn is_bool(a: &Atom) -> bool {
    matches!(a, Atom::Bin(Op::Lt | Op::Eq, _))
}

// ---------------------------------------------------------------- polynomial core

/// Multiply two monomials (sorted merge); boolean atoms are idempotent.
fn merge_atoms(a: &[Atom], b: &[Atom]) -> Vec<Atom> {
    let mut out: Vec<Atom> = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = if j >= b.len() || (i < a.len() && a[i] <= b[j]) {
            i += 1;
            &a[i - 1]
        } else {
            j += 1;
            &b[j - 1]
        };
        if is_bool(next) && out.last() == Some(next) {
            continue;
        }
        out.push(next.clone());
    }
    out
}

/// Monomial division: `Some(t / d)` if the multiset `d` is contained in `t`.
pub(crate) fn mono_div(t: &[Atom], d: &[Atom]) -> Option<Vec<Atom>> {
    let mut out = Vec::with_capacity(t.len().saturating_sub(d.len()));
    let mut j = 0;
    for a in t {
        if j < d.len() && *a == d[j] {
            j += 1;
        } else {
            if j < d.len() && d[j] < *a {
                return None;
            }
            out.push(a.clone());
        }
    }
    (j == d.len()).then_some(out)
}

/// Sort terms, merge like terms, drop zero coefficients.
pub(crate) fn normalize(mut terms: Vec<Term>) -> Vec<Term> {
    terms.sort_by(|a, b| a.atoms.cmp(&b.atoms));
    let mut out: Vec<Term> = Vec::with_capacity(terms.len());
    for t in terms {
        if let Some(last) = out.last_mut() {
            if last.atoms == t.atoms {
                last.coef = last.coef.wrapping_add(t.coef);
                continue;
            }
        }
        out.push(t);
    }
    out.retain(|t| t.coef != 0);
    out
}

pub(crate) fn add_raw(a: &Expression, b: &Expression) -> Expression {
    let mut out = Vec::with_capacity(a.terms.len() + b.terms.len());
    let (mut i, mut j) = (0, 0);
    while i < a.terms.len() && j < b.terms.len() {
        let (x, y) = (&a.terms[i], &b.terms[j]);
        match x.atoms.cmp(&y.atoms) {
            Ordering::Less => {
                out.push(x.clone());
                i += 1;
            }
            Ordering::Greater => {
                out.push(y.clone());
                j += 1;
            }
            Ordering::Equal => {
                let c = x.coef.wrapping_add(y.coef);
                if c != 0 {
                    out.push(Term {
                        atoms: x.atoms.clone(),
                        coef: c,
                    });
                }
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a.terms[i..]);
    out.extend_from_slice(&b.terms[j..]);
    Expression { terms: out }
}

pub(crate) fn mul_raw(a: &Expression, b: &Expression) -> Expression {
    if let Some(c) = a.as_constant() {
        return scale(b, c);
    }
    if let Some(c) = b.as_constant() {
        return scale(a, c);
    }
    let mut terms = Vec::with_capacity(a.terms.len() * b.terms.len());
    for x in &a.terms {
        for y in &b.terms {
            terms.push(Term {
                atoms: merge_atoms(&x.atoms, &y.atoms),
                coef: x.coef.wrapping_mul(y.coef),
            });
        }
    }
    Expression {
        terms: normalize(terms),
    }
}

/// `k * a`.
pub(crate) fn scale(a: &Expression, k: i64) -> Expression {
    match k {
        0 => Expression::zero(),
        1 => a.clone(),
        _ => Expression {
            terms: a
                .terms
                .iter()
                .filter_map(|t| {
                    let coef = t.coef.wrapping_mul(k);
                    (coef != 0).then(|| Term {
                        atoms: t.atoms.clone(),
                        coef,
                    })
                })
                .collect(),
        },
    }
}

pub(crate) fn add(a: &Expression, b: &Expression) -> Expression {
    if a.is_zero() {
        return b.clone();
    }
    if b.is_zero() {
        return a.clone();
    }
    recombine(add_raw(a, b))
}

pub(crate) fn sub(a: &Expression, b: &Expression) -> Expression {
    add(a, &scale(b, -1))
}

pub(crate) fn mul(a: &Expression, b: &Expression) -> Expression {
    if a.is_constant() || b.is_constant() {
        return mul_raw(a, b);
    }
    recombine(mul_raw(a, b))
}

pub(crate) fn apply_op(op: Op, a: &Expression, b: &Expression) -> Expression {
    match op {
        Op::Div => div(a, b),
        Op::Mod => modulo(a, b),
        Op::Min => min(a, b),
        Op::Max => max(a, b),
        Op::Lt => lt(a, b),
        Op::Eq => eq(a, b),
    }
}

/// Exact polynomial quotient `a / b`, if there is one.
pub(crate) fn exact_div(a: &Expression, b: &Expression) -> Option<Expression> {
    if b.is_zero() {
        return None;
    }
    if a.is_zero() {
        return Some(Expression::zero());
    }
    let div_term = |t: &Term, d: &Term| -> Option<Term> {
        let atoms = mono_div(&t.atoms, &d.atoms)?;
        if d.coef == -1 {
            return Some(Term {
                atoms,
                coef: t.coef.wrapping_neg(),
            });
        }
        if t.coef.wrapping_rem(d.coef) != 0 {
            return None;
        }
        Some(Term {
            atoms,
            coef: t.coef / d.coef,
        })
    };
    if let Some(d) = single_term(b) {
        let terms = a
            .terms
            .iter()
            .map(|t| div_term(t, d))
            .collect::<Option<Vec<_>>>()?;
        return Some(Expression {
            terms: normalize(terms),
        });
    }
    // Multivariate division by the leading term (graded order); exactness is checked
    // by the remainder reaching zero, so the order only affects success, not validity.
    let lead = |e: &Expression| -> Term {
        e.terms
            .iter()
            .max_by(|x, y| (x.atoms.len(), &x.atoms).cmp(&(y.atoms.len(), &y.atoms)))
            .cloned()
            .expect("lead of a non-zero expression")
    };
    let lead_b = lead(b);
    let mut rem = a.clone();
    let mut q = Vec::new();
    for _ in 0..(2 * a.terms.len() + 4) {
        if rem.is_zero() {
            return Some(Expression {
                terms: normalize(q),
            });
        }
        let t = div_term(&lead(&rem), &lead_b)?;
        let neg_t = Expression {
            terms: vec![Term {
                atoms: t.atoms.clone(),
                coef: t.coef.wrapping_neg(),
            }],
        };
        rem = add_raw(&rem, &mul_raw(&neg_t, b));
        q.push(t);
    }
    None
}

// ---------------------------------------------------------------- recombination

fn cost(e: &Expression) -> usize {
    e.terms
        .iter()
        .map(|t| 1 + t.atoms.iter().map(atom_cost).sum::<usize>())
        .sum()
}

fn atom_cost(a: &Atom) -> usize {
    match a {
        Atom::Var(_) => 1,
        Atom::Bin(_, args) => 1 + cost(&args.0) + cost(&args.1),
    }
}

fn coef_of(e: &Expression, atoms: &[Atom]) -> Option<i64> {
    e.terms
        .binary_search_by(|t| t.atoms.as_slice().cmp(atoms))
        .ok()
        .map(|i| e.terms[i].coef)
}

fn has_mono(e: &Expression, atoms: &[Atom]) -> bool {
    coef_of(e, atoms).is_some()
}

fn term_expr(atoms: Vec<Atom>, coef: i64) -> Expression {
    Expression {
        terms: vec![Term { atoms, coef }],
    }
}

/// `d*(x/d) + x%d - x` (identically zero for non-zero `d`).
fn identity_divmod(x: &Expression, d: &Expression) -> Expression {
    let dq = mul_raw(d, &div(x, d));
    add_raw(&add_raw(&dq, &modulo(x, d)), &scale(x, -1))
}

/// `d*((y/d)%m) + y%d - y%(d*m)` (identically zero for positive `d`, `m`).
fn identity_nested(y: &Expression, d: &Expression, m: &Expression) -> Expression {
    let inner = mul_raw(d, &modulo(&div(y, d), m));
    let outer = modulo(y, &mul(d, m));
    add_raw(&add_raw(&inner, &modulo(y, d)), &scale(&outer, -1))
}

/// Zero-valued expressions that could cancel the atom `t.atoms[ai]` of term `t` in `e`.
fn candidates(e: &Expression, t: &Term, ai: usize) -> Vec<Expression> {
    let mut rest = t.atoms.clone();
    let atom = rest.remove(ai);
    let mut out = Vec::new();
    let Atom::Bin(op, args) = &atom else {
        return out;
    };
    let (x, d) = (&args.0, &args.1);
    let x_terms_present = |w_atoms: &[Atom]| {
        x.terms
            .iter()
            .any(|xt| has_mono(e, &merge_atoms(w_atoms, &xt.atoms)))
    };
    match op {
        Op::Div => {
            // k*R*(x/d) with d = cd*D, D ⊆ R, cd | k: add w*(d*(x/d) + x%d - x), w = -k/cd * R/D
            let Some(dt) = single_term(d) else {
                return out;
            };
            if dt.coef <= 0 || t.coef.wrapping_rem(dt.coef) != 0 {
                return out;
            }
            let Some(w_atoms) = mono_div(&rest, &dt.atoms) else {
                return out;
            };
            let mod_mono = merge_atoms(&w_atoms, &[bin_atom(Op::Mod, x, d)]);
            if has_mono(e, &mod_mono) || x_terms_present(&w_atoms) {
                let w = term_expr(w_atoms, (t.coef / dt.coef).wrapping_neg());
                out.push(mul_raw(&w, &identity_divmod(x, d)));
            }
        }
        Op::Mod => {
            // k*R*(x%d): add w*(d*(x/d) + x%d - x), w = -k*R
            if let Some(dt) = single_term(d) {
                let div_mono =
                    merge_atoms(&merge_atoms(&rest, &dt.atoms), &[bin_atom(Op::Div, x, d)]);
                if has_mono(e, &div_mono) || x_terms_present(&rest) {
                    let w = term_expr(rest.clone(), t.coef.wrapping_neg());
                    out.push(mul_raw(&w, &identity_divmod(x, d)));
                }
            }
            // k*R*((y/d1)%m) with d1 = c1*D1: add w*(d1*((y/d1)%m) + y%d1 - y%(d1*m))
            if let Some(Atom::Bin(Op::Div, inner)) = single_atom(x) {
                let (y, d1) = (&inner.0, &inner.1);
                let Some(d1t) = single_term(d1) else {
                    return out;
                };
                if d1t.coef <= 0 || t.coef.wrapping_rem(d1t.coef) != 0 || !nonneg(d1) || !nonneg(d)
                {
                    return out;
                }
                let Some(w_atoms) = mono_div(&rest, &d1t.atoms) else {
                    return out;
                };
                // Only when the y%d1 term cancels exactly too (keeps results readable).
                let k = t.coef / d1t.coef;
                let mod_mono = merge_atoms(&w_atoms, &[bin_atom(Op::Mod, y, d1)]);
                if coef_of(e, &mod_mono) == Some(k) {
                    let w = term_expr(w_atoms, k.wrapping_neg());
                    out.push(mul_raw(&w, &identity_nested(y, d1, d)));
                }
            }
        }
        _ => {}
    }
    out
}

/// Apply div/mod recombination identities while they make the expression smaller.
fn recombine(mut e: Expression) -> Expression {
    for _ in 0..32 {
        if e.terms.len() < 2
            || !e.terms.iter().any(|t| {
                t.atoms
                    .iter()
                    .any(|a| matches!(a, Atom::Bin(Op::Div | Op::Mod, _)))
            })
        {
            return e;
        }
        let base = cost(&e);
        let mut next = None;
        'search: for t in &e.terms {
            for ai in 0..t.atoms.len() {
                for delta in candidates(&e, t, ai) {
                    let e2 = add_raw(&e, &delta);
                    if cost(&e2) < base {
                        next = Some(e2);
                        break 'search;
                    }
                }
            }
        }
        match next {
            Some(e2) => e = e2,
            None => return e,
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::super::symbolic::Expression as E;

    fn v(n: &str) -> E {
        E::var(n)
    }
    fn c(x: i64) -> E {
        E::constant(x)
    }

    #[test]
    fn constant_folding() {
        assert_eq!((c(3) + 4) * 2, c(14));
        assert_eq!(c(7) / 2, c(3));
        assert_eq!(c(-7) / 2, c(-4));
        assert_eq!(c(7) / -2, c(-4));
        assert_eq!(c(-7) % 3, c(2));
        assert_eq!(c(7) % -3, c(-2));
        assert_eq!(E::min(&c(3), 5), c(3));
        assert_eq!(E::max(&c(3), 5), c(5));
        assert_eq!(c(3).lt(5), c(1));
        assert_eq!(c(5).lt(5), c(0));
        assert_eq!(c(5).equals(5), c(1));
        assert_eq!(c(5).equals(4), c(0));
        assert_eq!(c(i64::MAX) + 1, c(i64::MIN)); // wraps, no panic
        assert_eq!(c(i64::MIN) / -1, c(i64::MIN));
    }

    #[test]
    fn identities() {
        let x = v("x");
        assert_eq!(&x + 0, x);
        assert_eq!(&x * 1, x);
        assert_eq!(&x * c(0), E::zero());
        assert_eq!(&x - &x, E::zero());
        assert_eq!(&x / 1, x);
        assert_eq!(&x % c(1), E::zero());
        assert_eq!(&x / &x, E::one());
        assert_eq!(&x % &x, E::zero());
        assert_eq!(E::min(&x, &x), x);
        assert_eq!(x.equals(&x), E::one());
        assert_eq!(x.lt(&x), E::zero());
    }

    #[test]
    fn like_terms() {
        let (x, y) = (v("x"), v("y"));
        assert_eq!(&x + &x, &x * 2);
        assert_eq!(&x * &y * 2 + &y * &x * 3, &x * &y * 5);
        assert_eq!(&x * &y - &y * &x, E::zero());
        assert_eq!((&x + 1) * (&x - 1), &x * &x - 1);
        assert_eq!((&x + &y) * 2 - &y * 2, &x * 2);
        assert_eq!(x.lt(&y) * x.lt(&y), x.lt(&y)); // booleans are idempotent
    }

    #[test]
    fn div_mod_recombination() {
        let (x, n) = (v("x"), v("n"));
        assert_eq!((&x / 4) * 4 + &x % 4, x);
        assert_eq!(((&x / 4) * 4 + &x % 4) * 3, &x * 3);
        assert_eq!((&x / &n) * &n + &x % &n, x);
        assert_eq!(&x - (&x / 4) * 4, &x % 4);
        let s = &x + v("y");
        assert_eq!((&s / 8) * 8 + &s % 8, s);
        // c*((x/c)%m) + x%c = x%(c*m)
        assert_eq!(((&x / 4) % 3) * 4 + &x % 4, &x % 12);
        assert_eq!((((&x / 4) % 3) * 4 + &x % 4) * 2 + 7, (&x % 12) * 2 + 7);
        // and the full row-major decomposition
        let z = v("z");
        let idx = (&z / 12) * 12 + ((&z / 4) % 3) * 4 + &z % 4;
        assert_eq!(idx, z);
    }

    #[test]
    fn substitution_resimplifies() {
        let (x, n) = (v("x"), v("n"));
        let e = (&x / &n) * &n + &x % 4;
        assert_eq!(e.substitute("n", &c(4)), x);
        let e2 = (&x % &n) / 4;
        assert_eq!(e2.substitute("n", &c(12)), (&x / 4) % 3);
        // Re-simplifying a canonical expression is a no-op.
        let e3 = ((&x / 4) % 3) * 7 + E::min(&x, &n) + x.lt(&n) + 2;
        assert_eq!(e3.substitute_all(&|_| None), e3);
    }
}
