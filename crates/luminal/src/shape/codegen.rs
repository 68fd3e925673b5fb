//! Code generation for [`Expression`]: a flat postfix program for fast repeated
//! evaluation ([`CompiledExpression`]) and C/CUDA source ([`Expression::to_c`]).

use super::simplify as s;
use super::symbolic::{Atom, ExprError, Expression, Op};

/// C helpers used by [`Expression::to_c`]. Works for C, C++ and CUDA/HIP.
pub const C_PRELUDE: &str = r#"#ifndef LUMINAL_SHAPE_PRELUDE
#define LUMINAL_SHAPE_PRELUDE
#if defined(__CUDACC__) || defined(__HIPCC__)
#define LUMINAL_INLINE static inline __host__ __device__
#else
#define LUMINAL_INLINE static inline
#endif
LUMINAL_INLINE long long floor_div(long long a, long long b) { long long q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
LUMINAL_INLINE long long floor_mod(long long a, long long b) { long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
LUMINAL_INLINE long long lum_min(long long a, long long b) { return a < b ? a : b; }
LUMINAL_INLINE long long lum_max(long long a, long long b) { return a > b ? a : b; }
#endif
"#;

// ---------------------------------------------------------------- compiled form

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Instr {
    Const(i64),
    Var(usize),
    Add,
    Mul,
    AddC(i64),
    MulC(i64),
    DivC(i64),
    ModC(i64),
    Bin(Op),
}

/// An [`Expression`] compiled to a flat postfix program for fast repeated evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledExpression {
    ops: Vec<Instr>,
    vars: Vec<String>,
    depth: usize,
}

const STACK: usize = 32;

impl CompiledExpression {
    pub(crate) fn new(e: &Expression, vars: &[&str]) -> Result<Self, ExprError> {
        let mut c = CompiledExpression {
            ops: Vec::new(),
            vars: vars.iter().map(|v| v.to_string()).collect(),
            depth: 0,
        };
        let mut sp = 0usize;
        c.emit_expr(e, &mut sp)?;
        Ok(c)
    }

    /// The variable order expected by [`CompiledExpression::eval`].
    pub fn vars(&self) -> &[String] {
        &self.vars
    }

    /// Evaluate with `values[i]` bound to `vars[i]`. Allocation-free for programs of
    /// stack depth <= 32.
    #[inline]
    pub fn eval(&self, values: &[i64]) -> Result<i64, ExprError> {
        if values.len() < self.vars.len() {
            return Err(ExprError::UnboundVariable(self.vars[values.len()].clone()));
        }
        if self.depth <= STACK {
            let mut stack = [0i64; STACK];
            self.run(&mut stack, values)
        } else {
            let mut stack = vec![0i64; self.depth];
            self.run(&mut stack, values)
        }
    }

    #[inline]
    fn run(&self, st: &mut [i64], values: &[i64]) -> Result<i64, ExprError> {
        let mut sp = 0usize;
        for ins in &self.ops {
            match *ins {
                Instr::Const(c) => {
                    st[sp] = c;
                    sp += 1;
                }
                Instr::Var(i) => {
                    st[sp] = values[i];
                    sp += 1;
                }
                Instr::Add => {
                    sp -= 1;
                    st[sp - 1] = st[sp - 1].wrapping_add(st[sp]);
                }
                Instr::Mul => {
                    sp -= 1;
                    st[sp - 1] = st[sp - 1].wrapping_mul(st[sp]);
                }
                Instr::AddC(c) => st[sp - 1] = st[sp - 1].wrapping_add(c),
                Instr::MulC(c) => st[sp - 1] = st[sp - 1].wrapping_mul(c),
                Instr::DivC(c) => {
                    st[sp - 1] = s::floor_div(st[sp - 1], c).ok_or(ExprError::DivisionByZero)?
                }
                Instr::ModC(c) => {
                    st[sp - 1] = s::floor_mod(st[sp - 1], c).ok_or(ExprError::DivisionByZero)?
                }
                Instr::Bin(op) => {
                    sp -= 1;
                    st[sp - 1] = op.apply(st[sp - 1], st[sp])?;
                }
            }
        }
        Ok(st[0])
    }

    fn push(&mut self, i: Instr, sp: &mut usize) {
        match i {
            Instr::Const(_) | Instr::Var(_) => *sp += 1,
            Instr::Add | Instr::Mul | Instr::Bin(_) => *sp -= 1,
            _ => {}
        }
        self.depth = self.depth.max(*sp);
        self.ops.push(i);
    }

    fn emit_expr(&mut self, e: &Expression, sp: &mut usize) -> Result<(), ExprError> {
        let mut first = true;
        let mut constant = 0;
        for t in &e.terms {
            if t.atoms.is_empty() {
                constant = t.coef;
                continue;
            }
            for (i, a) in t.atoms.iter().enumerate() {
                self.emit_atom(a, sp)?;
                if i > 0 {
                    self.push(Instr::Mul, sp);
                }
            }
            if t.coef != 1 {
                self.push(Instr::MulC(t.coef), sp);
            }
            if !first {
                self.push(Instr::Add, sp);
            }
            first = false;
        }
        if first {
            self.push(Instr::Const(constant), sp);
        } else if constant != 0 {
            self.push(Instr::AddC(constant), sp);
        }
        Ok(())
    }

    fn emit_atom(&mut self, a: &Atom, sp: &mut usize) -> Result<(), ExprError> {
        match a {
            Atom::Var(v) => {
                let idx = self
                    .vars
                    .iter()
                    .position(|n| **n == **v)
                    .ok_or_else(|| ExprError::UnboundVariable(v.to_string()))?;
                self.push(Instr::Var(idx), sp);
            }
            Atom::Bin(op, args) => {
                self.emit_expr(&args.0, sp)?;
                match (op, args.1.as_constant()) {
                    (Op::Div, Some(c)) => self.push(Instr::DivC(c), sp),
                    (Op::Mod, Some(c)) => self.push(Instr::ModC(c), sp),
                    _ => {
                        self.emit_expr(&args.1, sp)?;
                        self.push(Instr::Bin(*op), sp);
                    }
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- C rendering

pub(crate) fn to_c(e: &Expression) -> String {
    let mut out = String::new();
    c_expr(e, &mut out);
    out
}

fn c_lit(v: i64, out: &mut String) {
    if v == i64::MIN {
        out.push_str("(-9223372036854775807LL - 1)");
    } else if i32::try_from(v).is_ok() {
        if v < 0 {
            out.push_str(&format!("({v})"));
        } else {
            out.push_str(&v.to_string());
        }
    } else if v < 0 {
        out.push_str(&format!("({v}LL)"));
    } else {
        out.push_str(&format!("{v}LL"));
    }
}

fn c_expr(e: &Expression, out: &mut String) {
    let n_terms = e.terms.len();
    if n_terms == 0 {
        out.push('0');
        return;
    }
    let t0 = &e.terms[0];
    let simple = (t0.atoms.is_empty() && t0.coef >= 0) || (t0.coef == 1 && t0.atoms.len() == 1);
    let wrap = n_terms > 1 || !simple;
    if wrap {
        out.push('(');
    }
    // Constant last, like the Display form.
    let ordered = e
        .terms
        .iter()
        .filter(|t| !t.atoms.is_empty())
        .chain(e.terms.iter().filter(|t| t.atoms.is_empty()));
    for (i, t) in ordered.enumerate() {
        let negate = t.coef < 0 && t.coef != i64::MIN;
        let coef = if negate { -t.coef } else { t.coef };
        if i > 0 {
            out.push_str(if negate { " - " } else { " + " });
        } else if negate {
            out.push('-');
        }
        let mut first = true;
        for a in &t.atoms {
            if !first {
                out.push_str(" * ");
            }
            first = false;
            c_atom(a, out);
        }
        if coef != 1 || t.atoms.is_empty() {
            if !first {
                out.push_str(" * ");
            }
            c_lit(coef, out);
        }
    }
    if wrap {
        out.push(')');
    }
}

fn c_atom(a: &Atom, out: &mut String) {
    match a {
        Atom::Var(v) => out.push_str(v),
        Atom::Bin(op, args) => {
            let (x, y) = (&args.0, &args.1);
            let plain = || {
                let (xl, _) = x.bounds();
                let (yl, _) = y.bounds();
                xl.is_some_and(|l| l >= 0)
                    && yl.is_some_and(|l| l >= 1 || (l >= 0 && !y.is_constant()))
            };
            let (func, sym) = match op {
                Op::Div if plain() => (None, " / "),
                Op::Mod if plain() => (None, " % "),
                Op::Div => (Some("floor_div("), ", "),
                Op::Mod => (Some("floor_mod("), ", "),
                Op::Min => (Some("lum_min("), ", "),
                Op::Max => (Some("lum_max("), ", "),
                Op::Lt => (None, " < "),
                Op::Eq => (None, " == "),
            };
            out.push_str(func.unwrap_or("("));
            c_expr(x, out);
            out.push_str(sym);
            c_expr(y, out);
            out.push(')');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn v(n: &str) -> Expression {
        Expression::var(n)
    }

    fn binds(pairs: &[(&str, i64)]) -> HashMap<String, i64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn compile_eval() {
        let e = ((v("z") / 4) % 3) * 2 + v("seq") + Expression::min(&v("z"), v("seq")) - 5
            + v("z").lt(3)
            + v("seq") / v("z");
        let c = e.compile(&["z", "seq"]).unwrap();
        for z in 1..20 {
            for seq in 0..7 {
                let b = binds(&[("z", z), ("seq", seq)]);
                assert_eq!(c.eval(&[z, seq]), e.exec(&b));
            }
        }
        assert_eq!(c.eval(&[0, 3]), Err(ExprError::DivisionByZero));
        assert_eq!(c.eval(&[1]), Err(ExprError::UnboundVariable("seq".into())));
        assert_eq!(
            e.compile(&["z"]).unwrap_err(),
            ExprError::UnboundVariable("seq".into())
        );
        assert_eq!(
            Expression::constant(7).compile(&[]).unwrap().eval(&[]),
            Ok(7)
        );
        assert_eq!(Expression::zero().compile(&[]).unwrap().eval(&[]), Ok(0));
        // deep expression (stack > 32) falls back to the heap
        let mut deep = v("x");
        for i in 0..40 {
            deep = Expression::max(&v("x"), deep + i);
        }
        let c = deep.compile(&["x"]).unwrap();
        assert_eq!(c.eval(&[2]), deep.eval_with(&|_| Some(2)));
    }

    #[test]
    fn to_c_strings() {
        let z = v("z");
        assert_eq!(
            ((&z / 4) % 3 * 2 + v("seq")).to_c(),
            "(((z / 4) % 3) * 2 + seq)"
        );
        assert_eq!(((&z - 3) / 4).to_c(), "(((z + 1) / 4) - 1)");
        assert_eq!(((&z - v("y")) / 4).to_c(), "floor_div((-y + z), 4)");
        assert_eq!(((&z - 3) % v("n")).to_c(), "floor_mod((z - 3), n)");
        assert_eq!((&z % v("n")).to_c(), "(z % n)");
        assert_eq!(Expression::min(&z, v("n")).to_c(), "lum_min(n, z)");
        assert_eq!(z.lt(v("n")).to_c(), "(z < n)");
        assert_eq!(Expression::constant(-5).to_c(), "(-5)");
        assert_eq!(Expression::constant(1 << 40).to_c(), "1099511627776LL");
        assert!(C_PRELUDE.contains("floor_div") && C_PRELUDE.contains("floor_mod"));
    }
}
