//! Compiling a fused program's instructions into the steps the block interpreter runs
//! (see [`Compiler`]).

use crate::fused::Instr;
use crate::halfvec::HalfKind;
use crate::simd::MapBin;
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
    /// Several elementwise ops in one pass (see [`crate::simd::map`]); `k` holds the slots of
    /// m1, c1, m2, m3, c2 (`NO_SLOT`: identity).
    Map {
        a: Src,
        pre: Option<(MapBin, Src)>,
        k: [u32; 5],
        op: Option<UnaryOp>,
        post: Option<(MapBin, Src)>,
        out: u32,
    },
}

/// An absent scalar of a `Map` step (the identity is used).
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// A pending fused map: a vector value with ops still to apply (see [`crate::simd::map`]).
/// Positions, in order: 0 leading binary, 1 m1, 2 c1, 3 m2, 4 unary, 5 m3, 6 c2,
/// 7 trailing binary; an op is absorbed at the first free position of its kind after the
/// last one used, so the ops keep their order.
#[derive(Clone, Copy, Debug)]
struct Lazy {
    a: Src,
    pre: Option<(MapBin, Src)>,
    k: [u32; 5],
    op: Option<UnaryOp>,
    post: Option<(MapBin, Src)>,
    next: u8,
    /// Values this map reads (consumed when it is emitted).
    refs: [usize; 3],
    n_refs: usize,
}

impl Lazy {
    fn new(a: Src, va: usize) -> Lazy {
        Lazy {
            a,
            pre: None,
            k: [NO_SLOT; 5],
            op: None,
            post: None,
            next: 0,
            refs: [va, usize::MAX, usize::MAX],
            n_refs: 1,
        }
    }

    /// `x op s` appended; false when no position is left.
    fn scalar(&mut self, op: BinaryOp, slot: u32) -> bool {
        let places: &[(u8, usize)] = match op {
            BinaryOp::Mul => &[(1, 0), (3, 2), (5, 3)],
            BinaryOp::Add => &[(2, 1), (6, 4)],
            _ => &[],
        };
        for &(pos, i) in places {
            if pos >= self.next {
                self.k[i] = slot;
                self.next = pos + 1;
                return true;
            }
        }
        false
    }

    fn unary(&mut self, op: UnaryOp) -> bool {
        if self.next > 4 {
            return false;
        }
        self.op = Some(op);
        self.next = 5;
        true
    }

    fn post(&mut self, op: MapBin, b: Src, vb: usize) -> bool {
        if self.next > 7 {
            return false;
        }
        self.post = Some((op, b));
        self.next = 8;
        self.refs[self.n_refs] = vb;
        self.n_refs += 1;
        true
    }
}

fn map_bin(op: BinaryOp) -> Option<MapBin> {
    match op {
        BinaryOp::Add => Some(MapBin::Add),
        BinaryOp::Mul => Some(MapBin::Mul),
        _ => None,
    }
}

/// Compiles a program's instructions into steps:
/// - values equal across a block (constants, row scalars, and ops on those only) become
///   scalar slots, computed once per block;
/// - chains of elementwise ops on one vector (scalar adds/muls, one unary op, one leading
///   and one trailing add/mul with another vector) fuse into one `Map` pass; every op still
///   rounds separately, so results are unchanged;
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
                Instr::Unary(_, a) | Instr::NotZero(a) | Instr::Round(_, a) => uses[value[a]] += 1,
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
                        | Step::Map { out, .. },
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

    /// Emits a pending map into register `out` (allocated by the caller, or `DST`).
    fn emit(&mut self, l: Lazy, out: u32) {
        let plain = l.k == [NO_SLOT; 5] && l.post.is_none();
        let step = match (plain, l.pre, l.op) {
            (true, Some((b, x)), None) => Step::Binary {
                op: match b {
                    MapBin::Add => BinaryOp::Add,
                    MapBin::Mul => BinaryOp::Mul,
                },
                a: l.a,
                b: x,
                out,
            },
            (true, None, Some(op)) => Step::Unary { op, a: l.a, out },
            _ => Step::Map {
                a: l.a,
                pre: l.pre,
                k: l.k,
                op: l.op,
                post: l.post,
                out,
            },
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

    fn vector_step(&mut self, i: usize, step: impl FnOnce(u32) -> Step, reads: &[usize]) {
        let out = self.alloc();
        self.steps.push(step(out));
        for &v in reads {
            self.consume(v);
        }
        self.src[i] = Some(Src::Reg(out));
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
                    self.extend_with(i, va, |l| l.unary(op));
                }
            }
            Instr::Round(kind, a) => {
                let va = val(a);
                if let Some(a) = self.scalar_of(va) {
                    let out = self.slot();
                    self.steps.push(Step::SRound { kind, a, out });
                    self.src[i] = Some(Src::Scalar(out));
                } else {
                    let a = self.mat(va);
                    self.vector_step(i, |out| Step::Round { kind, a, out }, &[va]);
                }
            }
            Instr::NotZero(a) => {
                let va = val(a);
                if let Some(a) = self.scalar_of(va) {
                    let out = self.slot();
                    self.steps.push(Step::SNotZero { a, out });
                    self.src[i] = Some(Src::Scalar(out));
                } else {
                    let a = self.mat(va);
                    self.vector_step(i, |out| Step::NotZero { a, out }, &[va]);
                }
            }
            Instr::Max(a, b) => {
                let (va, vb) = (val(a), val(b));
                if let (Some(a), Some(b)) = (self.scalar_of(va), self.scalar_of(vb)) {
                    let out = self.slot();
                    self.steps.push(Step::SMax { a, b, out });
                    self.src[i] = Some(Src::Scalar(out));
                    return;
                }
                let mut reads = vec![];
                let mut operand = |c: &mut Self, v: usize| match c.scalar_of(v) {
                    Some(k) => Src::Scalar(k),
                    None => {
                        reads.push(v);
                        c.mat(v)
                    }
                };
                let (x, y) = (operand(self, va), operand(self, vb));
                self.vector_step(i, |out| Step::Max { a: x, b: y, out }, &reads);
            }
            Instr::Binary(op, a, b) => {
                let (va, vb) = (val(a), val(b));
                match (self.scalar_of(va), self.scalar_of(vb), map_bin(op)) {
                    (Some(a), Some(b), _) => {
                        let out = self.slot();
                        self.steps.push(Step::SBinary { op, a, b, out });
                        self.src[i] = Some(Src::Scalar(out));
                    }
                    // Add / Mul commute exactly in IEEE arithmetic.
                    (Some(s), None, Some(_)) => self.extend_with(i, vb, |l| l.scalar(op, s)),
                    (None, Some(s), Some(_)) => self.extend_with(i, va, |l| l.scalar(op, s)),
                    (None, None, Some(mb)) => {
                        let lazy_ok = |c: &Self, v: usize| {
                            c.lazy[v].is_some_and(|l| l.next <= 7) && c.uses[v] == 1
                        };
                        let (main, other) = if lazy_ok(self, va) {
                            (va, vb)
                        } else if lazy_ok(self, vb) {
                            (vb, va)
                        } else {
                            (usize::MAX, usize::MAX)
                        };
                        if main != usize::MAX {
                            let b = self.mat(other);
                            let mut l = self.extend(main);
                            assert!(l.post(mb, b, other));
                            self.lazy[i] = Some(l);
                        } else {
                            let (x, y) = (self.mat(va), self.mat(vb));
                            let mut l = Lazy::new(x, va);
                            l.pre = Some((mb, y));
                            l.next = 1;
                            l.refs[1] = vb;
                            l.n_refs = 2;
                            self.lazy[i] = Some(l);
                        }
                    }
                    _ => {
                        let x = match self.scalar_of(va) {
                            Some(k) => Src::Scalar(k),
                            None => self.mat(va),
                        };
                        let y = match self.scalar_of(vb) {
                            Some(k) => Src::Scalar(k),
                            None => self.mat(vb),
                        };
                        let mut reads = vec![];
                        if !matches!(x, Src::Scalar(_)) {
                            reads.push(va);
                        }
                        if !matches!(y, Src::Scalar(_)) {
                            reads.push(vb);
                        }
                        self.vector_step(
                            i,
                            |out| Step::Binary {
                                op,
                                a: x,
                                b: y,
                                out,
                            },
                            &reads,
                        );
                    }
                }
            }
        }
    }
}
