//! Simplification rules for the non-polynomial operations (`/`, `%`, `min`, `max`,
//! `<`, `==`). See the list in the `simplify` module docs.

use super::simplify::{
    add, bin, bounds, coef_gcd, div_coefs, exact_div, floor_div, gcd, konst, mono_div, nonneg,
    normalize, scale, single_atom, single_term, sub,
};
use super::symbolic::{Atom, Expression, Op, Term};

// ---------------------------------------------------------------- division / modulo

pub(crate) fn div(a: &Expression, b: &Expression) -> Expression {
    if let Some(c) = b.as_constant() {
        return div_const(a, c);
    }
    if a.is_zero() {
        return Expression::zero();
    }
    if a == b {
        return Expression::one();
    }
    if let Some(t) = single_term(b) {
        if t.coef < 0 && t.coef != i64::MIN {
            return div(&scale(a, -1), &scale(b, -1));
        }
    }
    let g = coef_gcd(&[a, b]);
    if g > 1 {
        return div(&div_coefs(a, g), &div_coefs(b, g));
    }
    if let Some(d) = single_term(b) {
        // (q*d + r) / d = q + r / d
        let (mut q, mut r) = (Vec::new(), Vec::new());
        for t in &a.terms {
            match mono_div(&t.atoms, &d.atoms) {
                Some(atoms) if t.coef.wrapping_rem(d.coef) == 0 => q.push(Term {
                    atoms,
                    coef: t.coef.wrapping_div(d.coef),
                }),
                _ => r.push(t.clone()),
            }
        }
        if !q.is_empty() {
            let q = Expression {
                terms: normalize(q),
            };
            return add(&q, &div(&Expression { terms: r }, b));
        }
        if let Some(Atom::Bin(Op::Mod, args)) = single_atom(a) {
            if args.1 == *b && nonneg(b) {
                return Expression::zero();
            }
        }
    } else if let Some(q) = exact_div(a, b) {
        return q;
    }
    let ((alo, ahi), (blo, _)) = (bounds(a), bounds(b));
    if let (Some(alo), Some(ahi), Some(blo)) = (alo, ahi, blo) {
        if alo >= 0 && ahi < blo {
            return Expression::zero();
        }
    }
    bin(Op::Div, a, b)
}

fn div_const(a: &Expression, c: i64) -> Expression {
    match c {
        0 => return bin(Op::Div, a, &Expression::zero()),
        1 => return a.clone(),
        -1 => return scale(a, -1),
        i64::MIN => return bin(Op::Div, a, &konst(c)),
        c if c < 0 => return div_const(&scale(a, -1), -c),
        _ => {}
    }
    if let Some(v) = a.as_constant() {
        return konst(floor_div(v, c).unwrap_or(0));
    }
    // Split off multiples of c: floor((c*q + r)/c) = q + floor(r/c), constant r in [0, c).
    let (mut q, mut r) = (Vec::new(), Vec::new());
    for t in &a.terms {
        if t.atoms.is_empty() {
            let (qq, rr) = (t.coef.div_euclid(c), t.coef.rem_euclid(c));
            if qq != 0 {
                q.push(Term {
                    atoms: Vec::new(),
                    coef: qq,
                });
            }
            if rr != 0 {
                r.push(Term {
                    atoms: Vec::new(),
                    coef: rr,
                });
            }
        } else if t.coef % c == 0 {
            q.push(Term {
                atoms: t.atoms.clone(),
                coef: t.coef / c,
            });
        } else {
            r.push(t.clone());
        }
    }
    let inner = div_rem_part(&Expression { terms: r }, c);
    add(&Expression { terms: q }, &inner)
}

/// `r / c` for `c >= 2`, where no term of `r` is a multiple of `c`.
fn div_rem_part(r: &Expression, c: i64) -> Expression {
    if let Some(v) = r.as_constant() {
        return konst(v.div_euclid(c));
    }
    if let (Some(lo), Some(hi)) = bounds(r) {
        if lo.div_euclid(c) == hi.div_euclid(c) {
            return konst(lo.div_euclid(c));
        }
    }
    let g = gcd(c as u64, coef_gcd(&[r]) as u64) as i64;
    if g > 1 {
        return div_const(&div_coefs(r, g), c / g);
    }
    if let Some(Atom::Bin(op, args)) = single_atom(r) {
        match (op, args.1.as_constant()) {
            // (x / c1) / c = x / (c1 * c)
            (Op::Div, Some(c1)) if c1 > 0 => {
                if let Some(m) = c1.checked_mul(c) {
                    return div_const(&args.0, m);
                }
            }
            // (x % (c*k)) / c = (x / c) % k
            (Op::Mod, Some(m)) if m > 0 && m % c == 0 => {
                return mod_const(&div_const(&args.0, c), m / c);
            }
            _ => {}
        }
    }
    bin(Op::Div, r, &konst(c))
}

pub(crate) fn modulo(a: &Expression, b: &Expression) -> Expression {
    if let Some(c) = b.as_constant() {
        return mod_const(a, c);
    }
    if a.is_zero() || a == b {
        return Expression::zero();
    }
    if let Some(t) = single_term(b) {
        if t.coef < 0 && t.coef != i64::MIN {
            return scale(&modulo(&scale(a, -1), &scale(b, -1)), -1);
        }
    }
    let g = coef_gcd(&[a, b]);
    if g > 1 {
        return scale(&modulo(&div_coefs(a, g), &div_coefs(b, g)), g);
    }
    if let Some(d) = single_term(b) {
        // Reduce the coefficients of multiples of the monomial modulo cd.
        let mut changed = false;
        let mut r = Vec::with_capacity(a.terms.len());
        for t in &a.terms {
            if d.coef > 0 && mono_div(&t.atoms, &d.atoms).is_some() {
                let c = t.coef.rem_euclid(d.coef);
                changed |= c != t.coef;
                if c != 0 {
                    r.push(Term {
                        atoms: t.atoms.clone(),
                        coef: c,
                    });
                }
            } else {
                r.push(t.clone());
            }
        }
        if changed {
            return modulo(&Expression { terms: r }, b);
        }
        if let Some(Atom::Bin(Op::Mod, args)) = single_atom(a) {
            if args.1 == *b {
                return a.clone();
            }
        }
    } else if exact_div(a, b).is_some() {
        return Expression::zero();
    }
    let ((alo, ahi), (blo, _)) = (bounds(a), bounds(b));
    if let (Some(alo), Some(ahi), Some(blo)) = (alo, ahi, blo) {
        if alo >= 0 && ahi < blo {
            return a.clone();
        }
    }
    bin(Op::Mod, a, b)
}

fn mod_const(a: &Expression, c: i64) -> Expression {
    match c {
        0 => return bin(Op::Mod, a, &Expression::zero()),
        1 | -1 => return Expression::zero(),
        i64::MIN => return bin(Op::Mod, a, &konst(c)),
        c if c < 0 => return scale(&mod_const(&scale(a, -1), -c), -1),
        _ => {}
    }
    if let Some(v) = a.as_constant() {
        return konst(v.rem_euclid(c));
    }
    let r = Expression {
        terms: a
            .terms
            .iter()
            .filter_map(|t| {
                let coef = t.coef.rem_euclid(c);
                (coef != 0).then(|| Term {
                    atoms: t.atoms.clone(),
                    coef,
                })
            })
            .collect(),
    };
    if r.is_zero() {
        return r;
    }
    let g = gcd(c as u64, coef_gcd(&[&r]) as u64) as i64;
    if g > 1 {
        return scale(&mod_const(&div_coefs(&r, g), c / g), g);
    }
    if let (Some(lo), Some(hi)) = bounds(&r) {
        let k = lo.div_euclid(c);
        if k == hi.div_euclid(c) {
            return add(&r, &konst(k.wrapping_mul(c).wrapping_neg()));
        }
    }
    // (x % m) % c = x % c when c | m
    if let Some(Atom::Bin(Op::Mod, args)) = single_atom(&r) {
        if let Some(m) = args.1.as_constant() {
            if m > 0 && m % c == 0 {
                return mod_const(&args.0, c);
            }
        }
    }
    bin(Op::Mod, &r, &konst(c))
}

// ---------------------------------------------------------------- comparisons

pub(crate) fn min(a: &Expression, b: &Expression) -> Expression {
    min_max(a, b, true)
}

pub(crate) fn max(a: &Expression, b: &Expression) -> Expression {
    min_max(a, b, false)
}

fn min_max(a: &Expression, b: &Expression, is_min: bool) -> Expression {
    if a == b {
        return a.clone();
    }
    let (lo, hi) = bounds(&sub(a, b));
    if hi.is_some_and(|h| h <= 0) {
        return if is_min { a.clone() } else { b.clone() };
    }
    if lo.is_some_and(|l| l >= 0) {
        return if is_min { b.clone() } else { a.clone() };
    }
    let (x, y) = if a <= b { (a, b) } else { (b, a) };
    bin(if is_min { Op::Min } else { Op::Max }, x, y)
}

/// Split `d` into (positive part, negated negative part), dividing the non-constant
/// coefficients by `g` and replacing the constant term by `constant`.
fn split_diff(d: &Expression, g: i64, constant: i64) -> (Expression, Expression) {
    let (mut p, mut n) = (Vec::new(), Vec::new());
    for t in &d.terms {
        let coef = if t.atoms.is_empty() {
            constant
        } else {
            t.coef / g
        };
        if coef > 0 {
            p.push(Term {
                atoms: t.atoms.clone(),
                coef,
            });
        } else if coef < 0 {
            n.push(Term {
                atoms: t.atoms.clone(),
                coef: coef.wrapping_neg(),
            });
        }
    }
    (Expression { terms: p }, Expression { terms: n })
}

fn nonconst_gcd(d: &Expression) -> (i64, i64) {
    let mut g = 0u64;
    let mut k = 0;
    for t in &d.terms {
        if t.atoms.is_empty() {
            k = t.coef;
        } else {
            g = gcd(g, t.coef.unsigned_abs());
        }
    }
    (i64::try_from(g).unwrap_or(1).max(1), k)
}

pub(crate) fn lt(a: &Expression, b: &Expression) -> Expression {
    let d = sub(a, b);
    let (lo, hi) = bounds(&d);
    if hi.is_some_and(|h| h < 0) {
        return Expression::one();
    }
    if lo.is_some_and(|l| l >= 0) {
        return Expression::zero();
    }
    // g*d' + k < 0  <=>  d' + floor(k/g) < 0
    let (g, k) = nonconst_gcd(&d);
    let (p, n) = split_diff(&d, g, k.div_euclid(g));
    bin(Op::Lt, &p, &n)
}

pub(crate) fn eq(a: &Expression, b: &Expression) -> Expression {
    if a == b {
        return Expression::one();
    }
    let d = sub(a, b);
    let (lo, hi) = bounds(&d);
    if d.is_zero() {
        return Expression::one();
    }
    if lo.is_some_and(|l| l > 0) || hi.is_some_and(|h| h < 0) {
        return Expression::zero();
    }
    let (g, k) = nonconst_gcd(&d);
    if k % g != 0 {
        return Expression::zero();
    }
    let (p, n) = split_diff(&d, g, k / g);
    let (x, y) = if p <= n { (p, n) } else { (n, p) };
    bin(Op::Eq, &x, &y)
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
    fn product_over_divisor() {
        let (a, b) = (v("a"), v("b"));
        assert_eq!((&a * &b) / &b, a);
        assert_eq!((&a * &b * 6) / (&b * 3), &a * 2);
        assert_eq!((&a * &b + v("c")) / &b, &a + v("c") / &b);
        assert_eq!((&a * (&b + 1)) / (&b + 1), a);
        assert_eq!(((&a + 2) * (&b + 1)) / (&b + 1), &a + 2);
        assert_eq!((&a * &b) % &b, E::zero());
        assert_eq!((&a * &b + 5) % &b, c(5) % &b);
        assert_eq!((&a * 4 + 6) / 2, &a * 2 + 3);
        assert_eq!((&a * 2) / (&b * 2), &a / &b);
    }

    #[test]
    fn nested_div_mod_constants() {
        let x = v("x");
        assert_eq!((&x / 2) / 3, &x / 6);
        assert_eq!((&x % 12) / 4, (&x / 4) % 3);
        assert_eq!((&x % 12) % 4, &x % 4);
        assert_eq!((&x % 4) % 12, &x % 4);
        assert_eq!((&x % 4) / 4, E::zero());
        assert_eq!((&x * 4 + 3) / 4, x);
        assert_eq!((&x * 4 + 7) / 4, &x + 1);
        assert_eq!((&x * 4 + 7) % 4, c(3));
        assert_eq!((&x + 5) % 4, (&x + 1) % 4);
        assert_eq!((&x * 5) % 4, &x % 4);
        assert_eq!((&x * 2 + 2) / 4, (&x + 1) / 2);
        assert_eq!((&x * 2) % 4, (&x % 2) * 2);
        assert_eq!(((&x % 4) + 4 * v("y")) / 4, v("y"));
        assert_eq!(&x / -2, (-&x) / 2);
        assert_eq!(&x % -2, -((-&x) % 2));
        assert_eq!((&x % 6).bounds(), (Some(0), Some(5)));
        assert_eq!(((&x % 6) / 2).bounds(), (Some(0), Some(2)));
    }

    #[test]
    fn division_by_zero_is_kept() {
        let x = v("x");
        let d = &x / 0;
        assert_eq!(d.to_string(), "x / 0");
        assert!((&x % 0).variables().contains("x"));
        assert_eq!((c(3) / 0).as_constant(), None);
    }

    #[test]
    fn comparisons_are_canonical() {
        let (x, y) = (v("x"), v("y"));
        assert_eq!((&x + 1).lt(&y + 1), x.lt(&y));
        assert_eq!((&x * 2).lt(&y * 2 + 1), x.lt(&y + 1));
        assert_eq!(x.equals(&y), y.equals(&x));
        assert_eq!((&x * 3).equals(&y * 3), x.equals(&y));
        assert_eq!(E::min(&x, &y), E::min(&y, &x));
        assert_eq!(E::max(&x, &y), E::max(&y, &x));
    }
}
