//! Conservative interval bounds of [`Expression`]s, used by the simplifier and by
//! code generation. Variables are in `[0, inf)`; a divisor that is provably
//! non-negative is treated as `>= 1` (a zero divisor makes the expression undefined).

use super::symbolic::{Atom, Expression, Op};

/// Extended integer: `NegInf < Fin(_) < PosInf`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum X {
    NegInf,
    Fin(i128),
    PosInf,
}

#[derive(Clone, Copy, Debug)]
struct Iv {
    lo: X,
    hi: X,
}

const FULL: Iv = Iv {
    lo: X::NegInf,
    hi: X::PosInf,
};

fn fin(lo: i128, hi: i128) -> Iv {
    Iv {
        lo: X::Fin(lo),
        hi: X::Fin(hi),
    }
}

fn xsign(x: X) -> i32 {
    match x {
        X::NegInf => -1,
        X::PosInf => 1,
        X::Fin(v) => v.signum() as i32,
    }
}

fn xmul(a: X, b: X) -> X {
    match (a, b) {
        (X::Fin(0), _) | (_, X::Fin(0)) => X::Fin(0),
        (X::Fin(x), X::Fin(y)) => x
            .checked_mul(y)
            .map(X::Fin)
            .unwrap_or(if (x < 0) != (y < 0) {
                X::NegInf
            } else {
                X::PosInf
            }),
        _ if xsign(a) * xsign(b) > 0 => X::PosInf,
        _ => X::NegInf,
    }
}

fn iv_add(a: Iv, b: Iv) -> Iv {
    let lo = match (a.lo, b.lo) {
        (X::Fin(x), X::Fin(y)) => x.checked_add(y).map(X::Fin).unwrap_or(X::NegInf),
        _ => X::NegInf,
    };
    let hi = match (a.hi, b.hi) {
        (X::Fin(x), X::Fin(y)) => x.checked_add(y).map(X::Fin).unwrap_or(X::PosInf),
        _ => X::PosInf,
    };
    Iv { lo, hi }
}

fn iv_mul(a: Iv, b: Iv) -> Iv {
    let c = [
        xmul(a.lo, b.lo),
        xmul(a.lo, b.hi),
        xmul(a.hi, b.lo),
        xmul(a.hi, b.hi),
    ];
    Iv {
        lo: c.iter().copied().min().unwrap_or(X::NegInf),
        hi: c.iter().copied().max().unwrap_or(X::PosInf),
    }
}

fn iv_neg(a: Iv) -> Iv {
    iv_mul(a, fin(-1, -1))
}

fn fdiv(a: i128, b: i128) -> i128 {
    let (q, r) = (a / b, a % b);
    if r != 0 && ((r < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn iv_div(a: Iv, b: Iv) -> Iv {
    if b.lo >= X::Fin(0) {
        // A non-negative divisor is >= 1 wherever the division is defined.
        let blo = match b.lo.max(X::Fin(1)) {
            X::Fin(v) => v,
            _ => return FULL,
        };
        if b.hi < X::Fin(1) {
            return FULL;
        }
        let lo = match a.lo {
            X::Fin(x) if x >= 0 => match b.hi {
                X::Fin(h) => X::Fin(fdiv(x, h)),
                _ => X::Fin(0),
            },
            X::Fin(x) => X::Fin(fdiv(x, blo)),
            other => other,
        };
        let hi = match a.hi {
            X::Fin(x) if x >= 0 => X::Fin(fdiv(x, blo)),
            X::Fin(x) => match b.hi {
                X::Fin(h) => X::Fin(fdiv(x, h)),
                _ => X::Fin(-1),
            },
            other => other,
        };
        Iv { lo, hi }
    } else if b.hi <= X::Fin(0) {
        iv_div(iv_neg(a), iv_neg(b))
    } else {
        match (a.lo, a.hi) {
            (X::Fin(l), X::Fin(h)) => {
                let m = l.abs().max(h.abs());
                fin(-m, m)
            }
            _ => FULL,
        }
    }
}

fn iv_mod(a: Iv, b: Iv) -> Iv {
    if b.lo >= X::Fin(0) {
        let mut hi = match b.hi {
            X::Fin(h) => X::Fin(h - 1),
            other => other,
        };
        if a.lo >= X::Fin(0) {
            hi = hi.min(a.hi);
        }
        Iv { lo: X::Fin(0), hi }
    } else if b.hi <= X::Fin(0) {
        let mut lo = match b.lo {
            X::Fin(l) => X::Fin(l + 1),
            other => other,
        };
        if a.hi <= X::Fin(0) {
            lo = lo.max(a.lo);
        }
        Iv { lo, hi: X::Fin(0) }
    } else {
        match (b.lo, b.hi) {
            (X::Fin(l), X::Fin(h)) => {
                let m = l.abs().max(h.abs()) - 1;
                fin(-m, m)
            }
            _ => FULL,
        }
    }
}

fn iv_expr(e: &Expression) -> Iv {
    let mut total = fin(0, 0);
    for t in &e.terms {
        let c = t.coef as i128;
        let mut iv = fin(c, c);
        for a in &t.atoms {
            iv = iv_mul(iv, iv_atom(a));
        }
        total = iv_add(total, iv);
    }
    total
}

fn iv_atom(a: &Atom) -> Iv {
    match a {
        Atom::Var(_) => Iv {
            lo: X::Fin(0),
            hi: X::PosInf,
        },
        Atom::Bin(op, args) => {
            let (x, y) = (iv_expr(&args.0), iv_expr(&args.1));
            match op {
                Op::Lt | Op::Eq => fin(0, 1),
                Op::Min => Iv {
                    lo: x.lo.min(y.lo),
                    hi: x.hi.min(y.hi),
                },
                Op::Max => Iv {
                    lo: x.lo.max(y.lo),
                    hi: x.hi.max(y.hi),
                },
                Op::Div => iv_div(x, y),
                Op::Mod => iv_mod(x, y),
            }
        }
    }
}

/// Conservative bounds of `e` (`None` = unbounded on that side).
pub(crate) fn bounds(e: &Expression) -> (Option<i64>, Option<i64>) {
    let iv = iv_expr(e);
    let conv = |x: X| match x {
        X::Fin(v) => i64::try_from(v).ok(),
        _ => None,
    };
    (conv(iv.lo), conv(iv.hi))
}

pub(crate) fn nonneg(e: &Expression) -> bool {
    bounds(e).0.is_some_and(|l| l >= 0)
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
    fn interval_arithmetic() {
        let (x, y) = (v("x"), v("y"));
        assert_eq!(c(7).bounds(), (Some(7), Some(7)));
        assert_eq!((&x % 5 * 3 - 2).bounds(), (Some(-2), Some(10)));
        assert_eq!(((&x % 5) * (&y % 3)).bounds(), (Some(0), Some(8)));
        assert_eq!(((&x % 5) - 10).lt(0), c(1));
        assert_eq!(((&x % 7) / (&y % 3 + 1)).bounds(), (Some(0), Some(6)));
        assert_eq!(((&x % 7 - 3) / 2).bounds(), (Some(-2), Some(1)));
        assert_eq!(
            E::min(&(&x % 5), &(&y % 3 + 1)).bounds(),
            (Some(0), Some(3))
        );
        assert_eq!(E::max(&(&x % 5), -3).bounds(), (Some(0), Some(4)));
        assert_eq!((-&x).bounds(), (None, Some(0)));
        assert_eq!((&x - &y).bounds(), (None, None));
        assert_eq!((&x % (-&y)).bounds(), (None, Some(0)));
    }

    #[test]
    fn bounds_decisions() {
        let (x, y) = (v("x"), v("y"));
        assert_eq!((&x % 4).lt(4), E::one());
        assert_eq!(E::min(&(&x % 4), 10), &x % 4);
        assert_eq!(E::max(&x, 0), x);
        assert_eq!(E::min(&x, &x + 1), x);
        assert_eq!(x.lt(0), E::zero());
        assert_eq!((&x + 1).equals(0), E::zero());
        assert_eq!((&x * 2).equals(3), E::zero());
        assert_eq!((&x % 4) / (&y + 4), E::zero());
        assert_eq!((&x % 4) % (&y + 4), &x % 4);
        assert_eq!(x.bounds(), (Some(0), None));
        assert_eq!(x.lt(&y).bounds(), (Some(0), Some(1)));
        assert_eq!((-(&x % 3) + 1).bounds(), (Some(-1), Some(1)));
    }
}
