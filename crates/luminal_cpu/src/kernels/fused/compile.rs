//! Compiling a fused program's instructions into the steps the block interpreter runs
//! (see [`Compiler`]).

use crate::kernels::fused::Instr;
use crate::simd::half::HalfKind;
use crate::simd::ChainOp;
use luminal::op::{BinaryOp, UnaryOp};

/// Where a step reads an operand block from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Src {
    /// A scratch register.
    Reg(u32),
    /// Leaf `i`: its buffer in place, or its register when the block had to be gathered.
    Leaf(u32),
    /// A row register of a row kernel.
    Row(u32),
    /// A per-block scalar slot, broadcast.
    Scalar(u32),
}

/// Output register meaning "the destination block".
pub(crate) const DST: u32 = u32::MAX;

/// A compiled instruction.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    Load {
        leaf: u32,
        reg: u32,
    },
    Const {
        c: u32,
        slot: u32,
    },
    RowScalar {
        stage: u32,
        slot: u32,
    },
    SUnary {
        op: UnaryOp,
        a: u32,
        out: u32,
    },
    SBinary {
        op: BinaryOp,
        a: u32,
        b: u32,
        out: u32,
    },
    SNotZero {
        a: u32,
        out: u32,
    },
    SMax {
        a: u32,
        b: u32,
        out: u32,
    },
    /// A recognised function of a scalar.
    SFn {
        f: crate::simd::FnOp,
        a: u32,
        out: u32,
    },
    /// A scalar rounded to half precision.
    SRound {
        kind: HalfKind,
        a: u32,
        out: u32,
    },
    /// A block rounded to half precision (the value a half op stores).
    Round {
        kind: HalfKind,
        a: Src,
        out: u32,
    },
    Max {
        a: Src,
        b: Src,
        out: u32,
    },
    Unary {
        op: UnaryOp,
        a: Src,
        out: u32,
    },
    Binary {
        op: BinaryOp,
        a: Src,
        b: Src,
        out: u32,
    },
    NotZero {
        a: Src,
        out: u32,
    },
    /// Several elementwise ops in one pass (see [`crate::simd::chain`]): `a` through
    /// `ops[start .. start + len]` of the compiler's chain table.
    Chain {
        a: Src,
        start: u32,
        len: u32,
        out: u32,
    },
}

/// The second operand of a chain op: none, a scalar slot, or a block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    None,
    Slot(u32),
    Vector(Src),
}

/// Ops a chain holds at most (the interpreter resolves their operands on the stack).
pub(crate) const MAX_CHAIN: usize = 16;

/// A pending chain: a vector value with ops still to apply to it (see
/// [`crate::simd::chain`]).
#[derive(Clone, Copy, Debug)]
struct Lazy {
    a: Src,
    ops: [(ChainOp, Operand); MAX_CHAIN],
    n_ops: usize,
    /// Values this chain reads (consumed when it is emitted).
    refs: [usize; MAX_CHAIN + 1],
    n_refs: usize,
}

impl Lazy {
    fn new(a: Src, va: usize) -> Lazy {
        let mut refs = [usize::MAX; MAX_CHAIN + 1];
        refs[0] = va;
        Lazy {
            a,
            ops: [(ChainOp::NotZero, Operand::None); MAX_CHAIN],
            n_ops: 0,
            refs,
            n_refs: 1,
        }
    }

    fn full(&self) -> bool {
        self.n_ops == MAX_CHAIN
    }

    /// Appends an op (false when the chain is full); `v`: the value a vector operand is.
    fn push(&mut self, op: ChainOp, b: Operand, v: Option<usize>) -> bool {
        if self.full() {
            return false;
        }
        self.ops[self.n_ops] = (op, b);
        self.n_ops += 1;
        if let Some(v) = v {
            self.refs[self.n_refs] = v;
            self.n_refs += 1;
        }
        true
    }
}

/// Compiles a program's instructions into steps:
/// - values equal across a block (constants, row scalars, and ops on those only) become
///   scalar slots, computed once per block;
/// - chains of elementwise ops on one running value (each op taking it and at most one
///   scalar or other vector) fuse into one `Chain` pass; every op still rounds separately,
///   so results are unchanged;
/// - registers are reference-counted: a register returns to the pool when the last step
///   reading it is emitted (after that step's output was assigned, so no step reads and
///   writes the same register).
pub(crate) struct Compiler<'p> {
    instrs: &'p [Instr],
    value: Vec<usize>,
    /// Steps still to read each value (never reaches 0 for the root).
    uses: Vec<usize>,
    src: Vec<Option<Src>>,
    lazy: Vec<Option<Lazy>>,
    pub(crate) leaf_reg: Vec<u32>,
    free: Vec<u32>,
    pub(crate) n_regs: u32,
    pub(crate) n_slots: u32,
    pub(crate) steps: Vec<Step>,
    /// The ops of every `Chain` step.
    pub(crate) chains: Vec<(ChainOp, Operand)>,
    pub(crate) root: Src,
}

impl<'p> Compiler<'p> {
    pub(crate) fn run(instrs: &'p [Instr], n_leaves: usize) -> Compiler<'p> {
        let n = instrs.len();
        assert!(n > 0, "empty fused program");
        // Copy is an alias: resolve every instruction to the one that computes its value.
        let mut value = vec![0usize; n];
        for (i, ins) in instrs.iter().enumerate() {
            value[i] = match *ins {
                Instr::Copy(a) => value[a],
                _ => i,
            };
        }
        let mut uses = vec![0usize; n];
        for ins in instrs {
            match *ins {
                Instr::Unary(_, a) | Instr::NotZero(a) | Instr::Round(_, a) | Instr::Fn(_, a) => {
                    uses[value[a]] += 1
                }
                Instr::Binary(_, a, b) | Instr::Max(a, b) => {
                    uses[value[a]] += 1;
                    uses[value[b]] += 1;
                }
                _ => {}
            }
        }
        let root = value[n - 1];
        uses[root] += 1;
        let mut c = Compiler {
            instrs,
            value,
            uses,
            src: vec![None; n],
            lazy: vec![None; n],
            leaf_reg: vec![u32::MAX; n_leaves],
            free: vec![],
            n_regs: 0,
            n_slots: 0,
            steps: vec![],
            chains: vec![],
            root: Src::Scalar(0),
        };
        for i in 0..n {
            c.instr(i);
        }
        c.root = if c.lazy[root].is_some() {
            let l = c.lazy[root].take().unwrap();
            c.emit(l, DST);
            Src::Reg(DST)
        } else {
            let r = c.src[root].expect("root computed");
            // The root op writes the destination block directly.
            match (r, c.steps.last_mut()) {
                (
                    Src::Reg(r),
                    Some(
                        Step::Unary { out, .. }
                        | Step::Binary { out, .. }
                        | Step::NotZero { out, .. }
                        | Step::Max { out, .. }
                        | Step::Round { out, .. }
                        | Step::Chain { out, .. },
                    ),
                ) if *out == r => {
                    *out = DST;
                    Src::Reg(DST)
                }
                _ => r,
            }
        };
        c
    }

    fn alloc(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.n_regs += 1;
            self.n_regs - 1
        })
    }

    fn slot(&mut self) -> u32 {
        self.n_slots += 1;
        self.n_slots - 1
    }

    /// One read of value `v` done; its register is free after the last.
    fn consume(&mut self, v: usize) {
        self.uses[v] -= 1;
        if self.uses[v] == 0 {
            match self.src[v] {
                Some(Src::Reg(r)) if r != DST => self.free.push(r),
                Some(Src::Leaf(l)) => self.free.push(self.leaf_reg[l as usize]),
                _ => {}
            }
        }
    }

    fn scalar_of(&self, v: usize) -> Option<u32> {
        match self.src[v] {
            Some(Src::Scalar(k)) => Some(k),
            _ => None,
        }
    }

    /// Emits a pending chain into register `out` (allocated by the caller, or `DST`). A
    /// chain of one op becomes that op's own step.
    fn emit(&mut self, l: Lazy, out: u32) {
        assert!(l.n_ops > 0, "an empty chain");
        let step = if l.n_ops == 1 {
            let (op, b) = l.ops[0];
            let b = match b {
                Operand::None => Src::Scalar(u32::MAX),
                Operand::Slot(k) => Src::Scalar(k),
                Operand::Vector(v) => v,
            };
            match op {
                ChainOp::Binary { op, swap } => {
                    let (a, b) = if swap { (b, l.a) } else { (l.a, b) };
                    Step::Binary { op, a, b, out }
                }
                ChainOp::Max => Step::Max { a: l.a, b, out },
                ChainOp::Unary(op) => Step::Unary { op, a: l.a, out },
                ChainOp::NotZero => Step::NotZero { a: l.a, out },
                ChainOp::Round(kind) => Step::Round { kind, a: l.a, out },
                ChainOp::Fn(_) => {
                    let start = self.chains.len() as u32;
                    self.chains.push(l.ops[0]);
                    Step::Chain {
                        a: l.a,
                        start,
                        len: 1,
                        out,
                    }
                }
            }
        } else {
            let start = self.chains.len() as u32;
            self.chains.extend_from_slice(&l.ops[..l.n_ops]);
            Step::Chain {
                a: l.a,
                start,
                len: l.n_ops as u32,
                out,
            }
        };
        self.steps.push(step);
        for &v in &l.refs[..l.n_refs] {
            self.consume(v);
        }
    }

    /// The vector value `v` in a register / leaf / row register, emitting its pending map.
    fn mat(&mut self, v: usize) -> Src {
        if let Some(s) = self.src[v] {
            return s;
        }
        let l = self.lazy[v].take().expect("value computed");
        let out = self.alloc();
        self.emit(l, out);
        self.src[v] = Some(Src::Reg(out));
        Src::Reg(out)
    }

    /// A pending map to extend for value `v`: its own (if `v` has no other reader), or a new
    /// one reading `v`.
    fn extend(&mut self, v: usize) -> Lazy {
        if self.lazy[v].is_some() && self.uses[v] == 1 {
            self.uses[v] = 0;
            return self.lazy[v].take().unwrap();
        }
        let a = self.mat(v);
        Lazy::new(a, v)
    }

    /// Like `extend`, but when `f` cannot append to `v`'s pending map, that map is emitted
    /// and a new one started from its result.
    fn extend_with(&mut self, i: usize, v: usize, f: impl Fn(&mut Lazy) -> bool) {
        let mut l = self.extend(v);
        if !f(&mut l) {
            // `l` was `v`'s own map (a fresh one accepts any op): emit it as `v`.
            let out = self.alloc();
            self.emit(l, out);
            self.src[v] = Some(Src::Reg(out));
            self.uses[v] = 1;
            l = Lazy::new(Src::Reg(out), v);
            assert!(f(&mut l), "a fresh map accepts one op");
        }
        self.lazy[i] = Some(l);
    }

    /// Value `i` is `op(va, vb)` for two vector values: appended to the pending chain of
    /// one of them when this op is its only reader, else a new chain.
    fn two_vectors(&mut self, i: usize, va: usize, vb: usize, op: impl Fn(bool) -> ChainOp) {
        let open = |c: &Self, v: usize| c.lazy[v].is_some_and(|l| !l.full()) && c.uses[v] == 1;
        let (main, other, swap) = if open(self, va) {
            (va, vb, false)
        } else if open(self, vb) {
            (vb, va, true)
        } else {
            let (x, y) = (self.mat(va), self.mat(vb));
            let mut l = Lazy::new(x, va);
            l.push(op(false), Operand::Vector(y), Some(vb));
            self.lazy[i] = Some(l);
            return;
        };
        let b = self.mat(other);
        let mut l = self.extend(main);
        assert!(l.push(op(swap), Operand::Vector(b), Some(other)));
        self.lazy[i] = Some(l);
    }

    fn instr(&mut self, i: usize) {
        let ins = self.instrs[i].clone();
        let val = |j: usize| self.value[j];
        match ins {
            Instr::Copy(_) => {}
            Instr::Load(l) => {
                let reg = self.alloc();
                self.leaf_reg[l] = reg;
                self.steps.push(Step::Load {
                    leaf: l as u32,
                    reg,
                });
                self.src[i] = Some(Src::Leaf(l as u32));
            }
            Instr::Const(c) => {
                let slot = self.slot();
                self.steps.push(Step::Const { c: c as u32, slot });
                self.src[i] = Some(Src::Scalar(slot));
            }
            Instr::RowScalar(stage) => {
                let slot = self.slot();
                self.steps.push(Step::RowScalar {
                    stage: stage as u32,
                    slot,
                });
                self.src[i] = Some(Src::Scalar(slot));
            }
            Instr::RowReg(r) => self.src[i] = Some(Src::Row(r as u32)),
            Instr::Unary(op, a) => {
                let va = val(a);
                if let Some(a) = self.scalar_of(va) {
                    let out = self.slot();
                    self.steps.push(Step::SUnary { op, a, out });
                    self.src[i] = Some(Src::Scalar(out));
                } else {
                    self.extend_with(i, va, |l| l.push(ChainOp::Unary(op), Operand::None, None));
                }
            }
            Instr::Fn(f, a) => {
                let va = val(a);
                if let Some(a) = self.scalar_of(va) {
                    let out = self.slot();
                    self.steps.push(Step::SFn { f, a, out });
                    self.src[i] = Some(Src::Scalar(out));
                } else {
                    self.extend_with(i, va, |l| l.push(ChainOp::Fn(f), Operand::None, None));
                }
            }
            Instr::Round(kind, a) => {
                let va = val(a);
                if let Some(a) = self.scalar_of(va) {
                    let out = self.slot();
                    self.steps.push(Step::SRound { kind, a, out });
                    self.src[i] = Some(Src::Scalar(out));
                } else {
                    self.extend_with(i, va, |l| l.push(ChainOp::Round(kind), Operand::None, None));
                }
            }
            Instr::NotZero(a) => {
                let va = val(a);
                if let Some(a) = self.scalar_of(va) {
                    let out = self.slot();
                    self.steps.push(Step::SNotZero { a, out });
                    self.src[i] = Some(Src::Scalar(out));
                } else {
                    self.extend_with(i, va, |l| l.push(ChainOp::NotZero, Operand::None, None));
                }
            }
            Instr::Max(a, b) => {
                let (va, vb) = (val(a), val(b));
                match (self.scalar_of(va), self.scalar_of(vb)) {
                    (Some(a), Some(b)) => {
                        let out = self.slot();
                        self.steps.push(Step::SMax { a, b, out });
                        self.src[i] = Some(Src::Scalar(out));
                    }
                    // The order of max's operands is immaterial (see `simd::max_one`).
                    (Some(s), None) => {
                        self.extend_with(i, vb, |l| l.push(ChainOp::Max, Operand::Slot(s), None))
                    }
                    (None, Some(s)) => {
                        self.extend_with(i, va, |l| l.push(ChainOp::Max, Operand::Slot(s), None))
                    }
                    (None, None) => self.two_vectors(i, va, vb, |_| ChainOp::Max),
                }
            }
            Instr::Binary(op, a, b) => {
                let (va, vb) = (val(a), val(b));
                match (self.scalar_of(va), self.scalar_of(vb)) {
                    (Some(a), Some(b)) => {
                        let out = self.slot();
                        self.steps.push(Step::SBinary { op, a, b, out });
                        self.src[i] = Some(Src::Scalar(out));
                    }
                    (Some(s), None) => self.extend_with(i, vb, |l| {
                        l.push(ChainOp::Binary { op, swap: true }, Operand::Slot(s), None)
                    }),
                    (None, Some(s)) => self.extend_with(i, va, |l| {
                        l.push(ChainOp::Binary { op, swap: false }, Operand::Slot(s), None)
                    }),
                    (None, None) => {
                        self.two_vectors(i, va, vb, |swap| ChainOp::Binary { op, swap })
                    }
                }
            }
        }
    }
}
