//! Symbolic integer expressions for dimensions, strides and index math.
//!
//! An [`Expression`] is kept in a canonical form at all times: every constructor and
//! operator returns an already simplified expression, so structural equality (`==`)
//! catches most semantic equalities and simplification costs microseconds.
//!
//! The canonical form is a polynomial: a sorted list of terms `coef * atom * atom * ...`
//! with distinct monomials and non-zero coefficients (the constant term has no atoms).
//! Atoms are variables or binary nodes (`/`, `%`, `min`, `max`, `<`, `==`) whose
//! arguments are themselves canonical expressions.
//!
//! Semantics:
//! * `/` is **floor** division and `%` is **floor** modulo (Python semantics).
//! * `lt` / `equals` evaluate to `1` or `0`.
//! * Variables range over non-negative integers (they are dims and indices); a
//!   variable used as a divisor is assumed to be at least 1. The simplifier relies on
//!   this (through [`Expression::bounds`]).
//! * Arithmetic wraps on `i64` overflow; it never panics.
//!
//! Note on `min` / `max`: `Expression` implements [`Ord`], whose provided `Ord::min` /
//! `Ord::max` take `self` by value. On an *owned* receiver, `a.min(b)` therefore resolves
//! to `Ord::min` (structural order!). Call the symbolic versions on a reference,
//! `(&a).min(b)`, or as `Expression::min(&a, b)`.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::iter::{Product, Sum};
use std::ops::{
    Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Rem, RemAssign, Sub, SubAssign,
};
use std::sync::Arc;

use super::codegen;
pub use super::codegen::{CompiledExpression, C_PRELUDE};
use super::simplify as s;

/// A canonical symbolic integer expression. See the module docs for the semantics.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Expression {
    /// Sorted by monomial, distinct monomials, no zero coefficients.
    pub(crate) terms: Vec<Term>,
}

/// `coef * atoms[0] * atoms[1] * ...`; `atoms` is sorted (repetition = power).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Term {
    pub(crate) atoms: Vec<Atom>,
    pub(crate) coef: i64,
}

/// The binary operations that cannot be expressed polynomially.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub(crate) enum Op {
    Div,
    Mod,
    Min,
    Max,
    Lt,
    Eq,
}

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Atom {
    Bin(Op, Arc<(Expression, Expression)>),
    Var(Arc<str>),
}

/// Errors from evaluating or compiling an [`Expression`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExprError {
    /// A variable had no binding.
    UnboundVariable(String),
    /// A `/` or `%` had a zero divisor.
    DivisionByZero,
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExprError::UnboundVariable(v) => write!(f, "unbound variable `{v}`"),
            ExprError::DivisionByZero => write!(f, "division by zero"),
        }
    }
}

impl std::error::Error for ExprError {}

impl Op {
    pub(crate) fn apply(self, a: i64, b: i64) -> Result<i64, ExprError> {
        match self {
            Op::Div => s::floor_div(a, b).ok_or(ExprError::DivisionByZero),
            Op::Mod => s::floor_mod(a, b).ok_or(ExprError::DivisionByZero),
            Op::Min => Ok(a.min(b)),
            Op::Max => Ok(a.max(b)),
            Op::Lt => Ok((a < b) as i64),
            Op::Eq => Ok((a == b) as i64),
        }
    }
}

impl Expression {
    /// The constant `v`.
    pub fn constant(v: i64) -> Self {
        if v == 0 {
            return Self::zero();
        }
        Expression {
            terms: vec![Term {
                atoms: Vec::new(),
                coef: v,
            }],
        }
    }

    /// The variable `name` (ranges over non-negative integers).
    pub fn var(name: &str) -> Self {
        Expression {
            terms: vec![Term {
                atoms: vec![Atom::Var(Arc::from(name))],
                coef: 1,
            }],
        }
    }

    /// The constant `0` (no terms).
    pub fn zero() -> Self {
        Expression { terms: Vec::new() }
    }

    /// The constant `1`.
    pub fn one() -> Self {
        Self::constant(1)
    }

    /// `Some(v)` if the expression is the constant `v`.
    pub fn as_constant(&self) -> Option<i64> {
        match self.terms.as_slice() {
            [] => Some(0),
            [t] if t.atoms.is_empty() => Some(t.coef),
            _ => None,
        }
    }

    /// Whether the expression is a constant.
    pub fn is_constant(&self) -> bool {
        self.as_constant().is_some()
    }

    /// Whether the expression is the constant `0`.
    pub fn is_zero(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether the expression is the constant `1`.
    pub fn is_one(&self) -> bool {
        self.as_constant() == Some(1)
    }

    /// `Some(name)` if the expression is exactly one variable.
    pub fn as_var(&self) -> Option<&str> {
        match self.terms.as_slice() {
            [t] if t.coef == 1 => match t.atoms.as_slice() {
                [Atom::Var(v)] => Some(v),
                _ => None,
            },
            _ => None,
        }
    }

    /// Symbolic minimum. See the module docs about `Ord::min` on owned receivers.
    pub fn min(&self, other: impl Into<Expression>) -> Expression {
        s::min(self, &other.into())
    }

    /// Symbolic maximum. See the module docs about `Ord::max` on owned receivers.
    pub fn max(&self, other: impl Into<Expression>) -> Expression {
        s::max(self, &other.into())
    }

    /// `1` if `self < other`, else `0`.
    pub fn lt(&self, other: impl Into<Expression>) -> Expression {
        s::lt(self, &other.into())
    }

    /// `1` if `self == other`, else `0`.
    pub fn equals(&self, other: impl Into<Expression>) -> Expression {
        s::eq(self, &other.into())
    }

    /// `Some(q)` when `self == q * other` exactly as polynomials (`other` non-zero).
    pub fn exact_div(&self, other: &Expression) -> Option<Expression> {
        s::exact_div(self, other)
    }

    /// Conservative integer bounds `(lo, hi)`; `None` means unbounded on that side.
    pub fn bounds(&self) -> (Option<i64>, Option<i64>) {
        s::bounds(self)
    }

    /// All variable names used.
    pub fn variables(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        self.collect_vars(&mut out);
        out
    }

    fn collect_vars(&self, out: &mut BTreeSet<String>) {
        for t in &self.terms {
            for a in &t.atoms {
                match a {
                    Atom::Var(v) => {
                        if !out.contains(&**v) {
                            out.insert(v.to_string());
                        }
                    }
                    Atom::Bin(_, args) => {
                        args.0.collect_vars(out);
                        args.1.collect_vars(out);
                    }
                }
            }
        }
    }

    /// Replace variable `name` by `value` (and re-simplify).
    pub fn substitute(&self, name: &str, value: &Expression) -> Expression {
        self.substitute_all(&|n| (n == name).then(|| value.clone()))
    }

    /// Replace every variable for which `f` returns `Some` (and re-simplify).
    pub fn substitute_all(&self, f: &dyn Fn(&str) -> Option<Expression>) -> Expression {
        let mut total = Expression::zero();
        for t in &self.terms {
            let mut prod = Expression::constant(t.coef);
            for a in &t.atoms {
                let sub = match a {
                    Atom::Var(v) => f(v).unwrap_or_else(|| Expression::var(v)),
                    Atom::Bin(op, args) => {
                        let (x, y) = (args.0.substitute_all(f), args.1.substitute_all(f));
                        s::apply_op(*op, &x, &y)
                    }
                };
                prod = s::mul(&prod, &sub);
            }
            total = s::add(&total, &prod);
        }
        total
    }

    /// Evaluate with variables bound by `bindings`.
    pub fn exec(&self, bindings: &HashMap<String, i64>) -> Result<i64, ExprError> {
        self.eval_with(&|n| bindings.get(n).copied())
    }

    /// Evaluate with variables bound by `f`.
    pub fn eval_with(&self, f: &dyn Fn(&str) -> Option<i64>) -> Result<i64, ExprError> {
        let mut total = 0i64;
        for t in &self.terms {
            let mut v = t.coef;
            for a in &t.atoms {
                let x = match a {
                    Atom::Var(name) => {
                        f(name).ok_or_else(|| ExprError::UnboundVariable(name.to_string()))?
                    }
                    Atom::Bin(op, args) => op.apply(args.0.eval_with(f)?, args.1.eval_with(f)?)?,
                };
                v = v.wrapping_mul(x);
            }
            total = total.wrapping_add(v);
        }
        Ok(total)
    }

    /// Render as C/CUDA source (`long long` arithmetic; variables are rendered by name
    /// and should be declared `long long`). Needs [`C_PRELUDE`] for the helpers.
    pub fn to_c(&self) -> String {
        codegen::to_c(self)
    }

    /// Compile into a flat stack program; `vars` gives the positional order of the
    /// values passed to [`CompiledExpression::eval`].
    pub fn compile(&self, vars: &[&str]) -> Result<CompiledExpression, ExprError> {
        CompiledExpression::new(self, vars)
    }
}

// ---------------------------------------------------------------- Display

fn fmt_operand(e: &Expression, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let simple = match e.terms.as_slice() {
        [] => true,
        [t] => (t.atoms.is_empty() && t.coef >= 0) || (t.coef == 1 && t.atoms.len() == 1),
        _ => false,
    };
    if let Some(a) = e
        .terms
        .first()
        .filter(|t| e.terms.len() == 1 && t.coef == 1 && t.atoms.len() == 1)
    {
        fmt_atom(&a.atoms[0], f, true)
    } else if simple {
        fmt_expr(e, f)
    } else {
        write!(f, "(")?;
        fmt_expr(e, f)?;
        write!(f, ")")
    }
}

fn fmt_atom(a: &Atom, f: &mut fmt::Formatter<'_>, outer_parens: bool) -> fmt::Result {
    match a {
        Atom::Var(v) => write!(f, "{v}"),
        Atom::Bin(op, args) => {
            let sym = match op {
                Op::Min | Op::Max => {
                    write!(f, "{}(", if *op == Op::Min { "min" } else { "max" })?;
                    fmt_expr(&args.0, f)?;
                    write!(f, ", ")?;
                    fmt_expr(&args.1, f)?;
                    return write!(f, ")");
                }
                Op::Div => " / ",
                Op::Mod => " % ",
                Op::Lt => " < ",
                Op::Eq => " == ",
            };
            if outer_parens {
                write!(f, "(")?;
            }
            fmt_operand(&args.0, f)?;
            write!(f, "{sym}")?;
            fmt_operand(&args.1, f)?;
            if outer_parens {
                write!(f, ")")?;
            }
            Ok(())
        }
    }
}

fn fmt_expr(e: &Expression, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if e.terms.is_empty() {
        return write!(f, "0");
    }
    if let [t] = e.terms.as_slice() {
        if t.coef == 1 && t.atoms.len() == 1 {
            return fmt_atom(&t.atoms[0], f, false);
        }
    }
    let ordered = e
        .terms
        .iter()
        .filter(|t| !t.atoms.is_empty())
        .chain(e.terms.iter().filter(|t| t.atoms.is_empty()));
    for (i, t) in ordered.enumerate() {
        let negate = t.coef < 0 && t.coef != i64::MIN;
        let coef = if negate { -t.coef } else { t.coef };
        if i > 0 {
            write!(f, "{}", if negate { " - " } else { " + " })?;
        } else if negate {
            write!(f, "-")?;
        }
        for (j, a) in t.atoms.iter().enumerate() {
            if j > 0 {
                write!(f, " * ")?;
            }
            fmt_atom(a, f, true)?;
        }
        if t.atoms.is_empty() {
            write!(f, "{coef}")?;
        } else if coef != 1 {
            write!(f, " * {coef}")?;
        }
    }
    Ok(())
}

impl fmt::Display for Expression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_expr(self, f)
    }
}

impl fmt::Debug for Expression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_expr(self, f)
    }
}

// ---------------------------------------------------------------- conversions

impl From<i64> for Expression {
    fn from(v: i64) -> Self {
        Expression::constant(v)
    }
}
impl From<i32> for Expression {
    fn from(v: i32) -> Self {
        Expression::constant(v as i64)
    }
}
impl From<u32> for Expression {
    fn from(v: u32) -> Self {
        Expression::constant(v as i64)
    }
}
impl From<usize> for Expression {
    /// Values above `i64::MAX` saturate.
    fn from(v: usize) -> Self {
        Expression::constant(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<&str> for Expression {
    fn from(v: &str) -> Self {
        Expression::var(v)
    }
}
impl From<String> for Expression {
    fn from(v: String) -> Self {
        Expression::var(&v)
    }
}
impl From<&String> for Expression {
    fn from(v: &String) -> Self {
        Expression::var(v)
    }
}
impl From<&Expression> for Expression {
    fn from(v: &Expression) -> Self {
        v.clone()
    }
}

// ---------------------------------------------------------------- operators

macro_rules! binop {
    ($tr:ident, $method:ident, $atr:ident, $amethod:ident, $f:expr) => {
        impl<T: Into<Expression>> $tr<T> for Expression {
            type Output = Expression;
            fn $method(self, rhs: T) -> Expression {
                let f: fn(&Expression, &Expression) -> Expression = $f;
                f(&self, &rhs.into())
            }
        }
        impl<T: Into<Expression>> $tr<T> for &Expression {
            type Output = Expression;
            fn $method(self, rhs: T) -> Expression {
                let f: fn(&Expression, &Expression) -> Expression = $f;
                f(self, &rhs.into())
            }
        }
        impl<T: Into<Expression>> $atr<T> for Expression {
            fn $amethod(&mut self, rhs: T) {
                let f: fn(&Expression, &Expression) -> Expression = $f;
                *self = f(self, &rhs.into());
            }
        }
        binop!(@prim $tr, $method, $f, i64, i32, usize);
    };
    (@prim $tr:ident, $method:ident, $f:expr, $($p:ty),*) => {$(
        impl $tr<Expression> for $p {
            type Output = Expression;
            fn $method(self, rhs: Expression) -> Expression {
                let f: fn(&Expression, &Expression) -> Expression = $f;
                f(&Expression::from(self), &rhs)
            }
        }
        impl $tr<&Expression> for $p {
            type Output = Expression;
            fn $method(self, rhs: &Expression) -> Expression {
                let f: fn(&Expression, &Expression) -> Expression = $f;
                f(&Expression::from(self), rhs)
            }
        }
    )*};
}

binop!(Add, add, AddAssign, add_assign, s::add);
binop!(Sub, sub, SubAssign, sub_assign, s::sub);
binop!(Mul, mul, MulAssign, mul_assign, s::mul);
binop!(Div, div, DivAssign, div_assign, s::div);
binop!(Rem, rem, RemAssign, rem_assign, s::modulo);

impl Neg for Expression {
    type Output = Expression;
    fn neg(self) -> Expression {
        s::scale(&self, -1)
    }
}
impl Neg for &Expression {
    type Output = Expression;
    fn neg(self) -> Expression {
        s::scale(self, -1)
    }
}

impl Sum for Expression {
    fn sum<I: Iterator<Item = Expression>>(iter: I) -> Self {
        iter.fold(Expression::zero(), |a, b| s::add(&a, &b))
    }
}
impl<'a> Sum<&'a Expression> for Expression {
    fn sum<I: Iterator<Item = &'a Expression>>(iter: I) -> Self {
        iter.fold(Expression::zero(), |a, b| s::add(&a, b))
    }
}
impl Product for Expression {
    fn product<I: Iterator<Item = Expression>>(iter: I) -> Self {
        iter.fold(Expression::one(), |a, b| s::mul(&a, &b))
    }
}
impl<'a> Product<&'a Expression> for Expression {
    fn product<I: Iterator<Item = &'a Expression>>(iter: I) -> Self {
        iter.fold(Expression::one(), |a, b| s::mul(&a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: &str) -> Expression {
        Expression::var(n)
    }

    fn binds(pairs: &[(&str, i64)]) -> HashMap<String, i64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn send_sync_and_traits() {
        fn assert_traits<
            T: Send + Sync + Clone + Eq + std::hash::Hash + Ord + fmt::Debug + fmt::Display,
        >() {
        }
        assert_traits::<Expression>();
        fn assert_ss<T: Send + Sync>() {}
        assert_ss::<CompiledExpression>();
    }

    #[test]
    fn basic_accessors() {
        assert_eq!(Expression::constant(5).as_constant(), Some(5));
        assert_eq!(Expression::zero().as_constant(), Some(0));
        assert!(Expression::one().is_one());
        assert_eq!(v("seq").as_var(), Some("seq"));
        assert_eq!((v("seq") * 2).as_var(), None);
        assert!(!v("a").is_constant());
        let e = (v("a") + v("seq")) / v("b") + 3;
        let names: Vec<String> = e.variables().into_iter().collect();
        assert_eq!(names, vec!["a", "b", "seq"]);
        assert_eq!(Expression::from("x"), v("x"));
        assert_eq!(Expression::from(3usize), Expression::constant(3));
        assert_eq!(Expression::from(-3i32), Expression::constant(-3));
    }

    #[test]
    fn display() {
        let z = v("z");
        let e = (&z / 4) % 3 * 2 + v("seq");
        assert_eq!(e.to_string(), "((z / 4) % 3) * 2 + seq");
        assert_eq!((v("a") - v("b") * 3 - 2).to_string(), "a - b * 3 - 2");
        assert_eq!(((v("a") + 1) / 4).to_string(), "(a + 1) / 4");
        assert_eq!(Expression::min(&v("a"), v("b")).to_string(), "min(a, b)");
        assert_eq!(v("a").lt(v("b")).to_string(), "a < b");
        assert_eq!(Expression::zero().to_string(), "0");
        assert_eq!(format!("{:?}", -v("x")), "-x");
    }

    #[test]
    fn exec_and_errors() {
        let e = (v("a") * 3 + v("b")) / 2 - v("a") % 4;
        assert_eq!(e.exec(&binds(&[("a", 7), ("b", 1)])), Ok((21 + 1) / 2 - 3));
        assert_eq!(
            e.exec(&binds(&[("a", 7)])),
            Err(ExprError::UnboundVariable("b".into()))
        );
        let d = v("a") / v("b");
        assert_eq!(
            d.exec(&binds(&[("a", 7), ("b", 0)])),
            Err(ExprError::DivisionByZero)
        );
        let d0 = v("a") / 0;
        assert_eq!(d0.exec(&binds(&[("a", 7)])), Err(ExprError::DivisionByZero));
        let m0 = v("a") % 0;
        assert_eq!(m0.exec(&binds(&[("a", 7)])), Err(ExprError::DivisionByZero));
        assert_eq!(
            (Expression::constant(7) / 0).eval_with(&|_| None),
            Err(ExprError::DivisionByZero)
        );
        // floor semantics
        let f = (v("a") - 7) / 2;
        assert_eq!(f.eval_with(&|_| Some(0)), Ok(-4));
        let g = (v("a") - 7) % 3;
        assert_eq!(g.eval_with(&|_| Some(0)), Ok(2));
        assert_eq!(ExprError::DivisionByZero.to_string(), "division by zero");
    }

    #[test]
    fn substitute() {
        let e = (v("a") + v("b")) / 4 + v("a") % v("b");
        let s1 = e.substitute("b", &Expression::constant(4));
        assert_eq!(s1, v("a") / 4 + 1 + v("a") % 4);
        let s2 = e.substitute_all(&|n| (n == "a").then(|| Expression::constant(3)));
        assert_eq!(s2, (v("b") + 3) / 4 + Expression::constant(3) % v("b"));
        let s3 = e.substitute_all(&|n| Some(Expression::constant(if n == "a" { 9 } else { 4 })));
        assert_eq!(s3.as_constant(), Some(3 + 1));
    }

    #[test]
    fn operators_and_iterators() {
        let a = v("a");
        let mut x = a.clone();
        x += 2;
        x *= 3;
        x -= &a;
        assert_eq!(x, &a * 2 + 6);
        x /= 2;
        assert_eq!(x, &a + 3);
        x %= 2;
        assert_eq!(x, (&a + 1) % 2);
        assert_eq!(3 + &a, &a + 3);
        assert_eq!(3usize * a.clone(), &a * 3);
        assert_eq!(10i64 - &a, -&a + 10);
        let s: Expression = vec![v("a"), v("b"), Expression::constant(2)]
            .into_iter()
            .sum();
        assert_eq!(s, v("a") + v("b") + 2);
        let dims = [Expression::constant(2), v("n"), Expression::constant(3)];
        let p: Expression = dims.iter().product();
        assert_eq!(p, v("n") * 6);
        let empty: Expression = std::iter::empty::<Expression>().product();
        assert!(empty.is_one());
    }
}
