//! A run's launches, listed before any is issued: the buffers they name, the signature that
//! decides whether a captured graph can replay them, and issuing them on the executor.

use super::{Buffer, Executor, IdMap, PlanRuntime};
use crate::attention::AttnCall;
use crate::gemm::GemmCall;
use luminal::graph::NodeId;
use luminal::{LuminalError, Result};

/// A buffer a launch reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum BufRef {
    Node(NodeId),
    /// A product's rounded operand.
    Scratch(usize),
    /// A product's dequantized weight copy.
    Dequant(usize),
    Error,
    Dims,
}

/// The buffer `r` names, among the plan's.
pub(super) fn buffer_of<'a, B>(
    buffers: &'a IdMap<NodeId, Buffer<B>>,
    scratch: &'a IdMap<BufRef, Buffer<B>>,
    error: &'a Option<B>,
    dims: &'a Option<Buffer<B>>,
    r: BufRef,
) -> Result<&'a B> {
    match r {
        BufRef::Node(id) => buffers.get(&id).map(|b| &b.buf),
        BufRef::Scratch(_) | BufRef::Dequant(_) => scratch.get(&r).map(|b| &b.buf),
        BufRef::Error => error.as_ref(),
        BufRef::Dims => dims.as_ref().map(|b| &b.buf),
    }
    .ok_or_else(|| LuminalError::Backend(format!("no buffer for {r:?}")))
}

/// One launch of a run, prepared before any is issued (so that a run's launches can be
/// compared with the last run's and replayed from a graph).
#[derive(Clone, PartialEq)]
pub(super) enum Launch {
    Kernel {
        function: usize,
        grid: u32,
        block: u32,
        buffers: Vec<BufRef>,
        scalars: Vec<i64>,
    },
    Gemm {
        call: GemmCall,
        c: BufRef,
        a: BufRef,
        b: BufRef,
    },
    /// One fused attention (its scratch is the plan's `attn_scratch`; its call is also
    /// written to slot `slot` of the plan's `attn_table`).
    Attention {
        slot: usize,
        call: Box<AttnCall>,
        out: BufRef,
        q: BufRef,
        k: BufRef,
        v: BufRef,
        bias: Option<BufRef>,
    },
}

impl Launch {
    /// Whether `self` issues what `other` does as far as a run's [signature]
    /// (PlanRuntime::signature) sees it, given that no buffer moved: the same function,
    /// grid, buffers and scalars, the same product, or an attention of the same slot, buffers
    /// and [shape](attention_shape) (the rest of its call is read from the parameter table).
    pub(super) fn same_work(&self, other: &Launch) -> bool {
        match (self, other) {
            (
                Launch::Attention {
                    slot,
                    call,
                    out,
                    q,
                    k,
                    v,
                    bias,
                },
                Launch::Attention {
                    slot: slot2,
                    call: call2,
                    out: out2,
                    q: q2,
                    k: k2,
                    v: v2,
                    bias: bias2,
                },
            ) => {
                slot == slot2
                    && (out, q, k, v, bias) == (out2, q2, k2, v2, bias2)
                    && attention_shape(call) == attention_shape(call2)
            }
            _ => self == other,
        }
    }
}

/// What an attention launch's shape depends on (grids, kernel, the combine pass): the part
/// of its call in a run's signature. The rest (the key count, offsets) is read from the
/// parameter table, so a replayed graph sees this run's.
fn attention_shape(call: &AttnCall) -> [i64; 7] {
    [
        call.s,
        call.d,
        call.batches(),
        call.splits,
        call.k_f16,
        call.v_f16,
        call.has_bias,
    ]
}

/// The buffer and scalar lists of the last run's launches, kept for the next run's (a run
/// lists hundreds of launches: no allocation each).
#[derive(Default)]
pub(super) struct ListPool {
    buffers: Vec<Vec<BufRef>>,
    scalars: Vec<Vec<i64>>,
}

impl ListPool {
    /// Takes back the lists of `launches`.
    pub(super) fn recycle(&mut self, launches: &mut Vec<Launch>) {
        for l in launches.drain(..) {
            if let Launch::Kernel {
                mut buffers,
                mut scalars,
                ..
            } = l
            {
                buffers.clear();
                scalars.clear();
                self.buffers.push(buffers);
                self.scalars.push(scalars);
            }
        }
    }

    /// An empty buffer list holding `refs`.
    pub(super) fn buffers(&mut self, refs: &[BufRef]) -> Vec<BufRef> {
        let mut v = self.buffers.pop().unwrap_or_default();
        v.extend_from_slice(refs);
        v
    }

    /// An empty scalar list holding `values`.
    pub(super) fn scalars(&mut self, values: &[i64]) -> Vec<i64> {
        let mut v = self.scalars.pop().unwrap_or_default();
        v.extend_from_slice(values);
        v
    }

    /// A copy of `l` in lists from the pool.
    pub(super) fn copy(&mut self, l: &Launch) -> Launch {
        match l {
            Launch::Kernel {
                function,
                grid,
                block,
                buffers,
                scalars,
            } => Launch::Kernel {
                function: *function,
                grid: *grid,
                block: *block,
                buffers: self.buffers(buffers),
                scalars: self.scalars(scalars),
            },
            other => other.clone(),
        }
    }
}

impl<E: Executor> PlanRuntime<E> {
    /// The buffer `r` names.
    pub(super) fn buffer(&self, r: BufRef) -> Result<&E::Buffer> {
        buffer_of(
            &self.buffers,
            &self.scratch,
            &self.error_buffer,
            &self.dims_table,
            r,
        )
    }

    /// What identifies a run's launches: functions, grids, scalars, products and the
    /// addresses of every buffer they touch (dims values excepted: they are read from the
    /// dims table).
    pub(super) fn signature(&self, launches: &[Launch]) -> Result<Vec<u64>> {
        let mut sig = Vec::with_capacity(launches.len() * 6);
        for l in launches {
            match l {
                Launch::Kernel {
                    function,
                    grid,
                    block,
                    buffers,
                    scalars,
                } => {
                    sig.extend([0, *function as u64, *grid as u64, buffers.len() as u64]);
                    sig.push(*block as u64);
                    for &b in buffers {
                        sig.push(self.exec.addr(self.buffer(b)?));
                    }
                    sig.extend(scalars.iter().map(|&x| x as u64));
                }
                Launch::Gemm { call, c, a, b } => {
                    sig.push(1);
                    for r in [c, a, b] {
                        sig.push(self.exec.addr(self.buffer(*r)?));
                    }
                    sig.extend(call.words().map(|x| x as u64));
                }
                Launch::Attention {
                    slot,
                    call,
                    out,
                    q,
                    k,
                    v,
                    bias,
                } => {
                    sig.push(2);
                    sig.push(*slot as u64);
                    sig.push(
                        self.attn_table
                            .as_ref()
                            .map_or(0, |b| self.exec.addr(&b.buf)),
                    );
                    for r in [out, q, k, v] {
                        sig.push(self.exec.addr(self.buffer(*r)?));
                    }
                    sig.push(match bias {
                        Some(b) => self.exec.addr(self.buffer(*b)?),
                        None => 0,
                    });
                    sig.push(
                        self.attn_scratch
                            .as_ref()
                            .map_or(0, |b| self.exec.addr(&b.buf)),
                    );
                    sig.extend(attention_shape(call).map(|x| x as u64));
                }
            }
        }
        Ok(sig)
    }

    /// Issues `launches` on the executor (running them, or recording them in a capture).
    pub(super) fn issue(&mut self, launches: &[Launch]) -> Result<()> {
        let PlanRuntime {
            exec,
            buffers,
            scratch,
            error_buffer,
            dims_table,
            functions,
            attn_scratch,
            attn_table,
            ..
        } = self;
        let get = |r: BufRef| buffer_of(buffers, scratch, error_buffer, dims_table, r);
        // One list of a kernel's buffers, refilled per launch (no allocation per launch).
        let mut bufs: Vec<&E::Buffer> = Vec::new();
        for l in launches {
            match l {
                Launch::Kernel {
                    function,
                    grid,
                    block,
                    buffers,
                    scalars,
                } => {
                    bufs.clear();
                    for &b in buffers {
                        bufs.push(get(b)?);
                    }
                    exec.launch(&functions[*function], *grid, *block, &bufs, scalars)?;
                }
                Launch::Gemm { call, c, a, b } => {
                    exec.gemm(call, get(*c)?, get(*a)?, get(*b)?)?;
                }
                Launch::Attention {
                    slot,
                    call,
                    out,
                    q,
                    k,
                    v,
                    bias,
                } => {
                    let scratch = attn_scratch.as_ref().map(|b| &b.buf).ok_or_else(|| {
                        LuminalError::Backend("attention scratch not allocated".into())
                    })?;
                    let table = attn_table.as_ref().map(|b| &b.buf).ok_or_else(|| {
                        LuminalError::Backend("attention parameters not written".into())
                    })?;
                    let bias = bias.map(get).transpose()?;
                    exec.attention(
                        call,
                        table,
                        slot * std::mem::size_of::<AttnCall>(),
                        get(*out)?,
                        get(*q)?,
                        get(*k)?,
                        get(*v)?,
                        bias,
                        scratch,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// How many runs were replayed from a captured graph, and how many graphs were captured.
    pub fn graph_replays(&self) -> (usize, usize) {
        (self.replays, self.captures)
    }

    /// Runs a prepared run's launches: writes the dims and attention tables the kernels read,
    /// then replays the captured graph when the launches are the last captured ones, captures
    /// them when they repeat the previous run's, or issues them. `same`: the launches are the
    /// previous run's (prepared by its fast path, [`PlanRuntime::prepare_changed`]), so their
    /// signature is the previous run's too unless a table moved.
    pub(super) fn execute(&mut self, launches: &[Launch], same: bool) -> Result<()> {
        // The dims and thread counts, and the attention calls, where the kernels read them
        // (before any launch or capture).
        let mut moved = write_table(
            &mut self.exec,
            &mut self.table_bytes,
            &mut self.dims_table,
            &self.dims_host,
        )?;
        if launches
            .iter()
            .any(|l| matches!(l, Launch::Attention { .. }))
        {
            moved |= write_table(
                &mut self.exec,
                &mut self.table_bytes,
                &mut self.attn_table,
                &self.attn_host,
            )?;
        }
        if self.stats >= 3 {
            // Each launch of the run, by kernel name (for finding what to fuse next).
            let names: Vec<String> = launches
                .iter()
                .map(|l| match l {
                    Launch::Kernel { function, .. } => self
                        .kernels
                        .get(*function)
                        .map_or("round".to_string(), |k| k.name.clone()),
                    Launch::Gemm { .. } => "gemm".into(),
                    Launch::Attention { .. } => "attention".into(),
                })
                .collect();
            eprintln!("luminal_cuda: launches: {}", names.join(" "));
        }
        if !self.graphs {
            return self.issue(launches);
        }
        if same && !moved {
            // The previous run's signature: the captured graph's when that run replayed it
            // (or captured it), else `last_signature` (that run issued its launches), now seen
            // twice in a row.
            if self.captured_last {
                let (_, graph) = self.captured.as_ref().expect("captured_last");
                self.exec.replay(graph)?;
                self.replays += 1;
                return Ok(());
            }
            let sig = self.last_signature.clone();
            return self.capture(launches, sig);
        }
        let sig = self.signature(launches)?;
        if let Some((_, graph)) = self.captured.as_ref().filter(|g| g.0 == sig) {
            self.exec.replay(graph)?;
            self.replays += 1;
            self.captured_last = true;
        } else if sig == self.last_signature {
            // The same launches twice in a row: record them once, then replay.
            self.capture(launches, sig)?;
        } else {
            self.captured_last = false;
            self.issue(launches)?;
            if self.stats >= 3 && !self.last_signature.is_empty() {
                // Why this run was not replayed: where its launches first differ.
                let i = sig
                    .iter()
                    .zip(&self.last_signature)
                    .position(|(a, b)| a != b);
                eprintln!(
                    "luminal_cuda: launches differ from the last run's at word {i:?} of {} (was {}): {:?}",
                    sig.len(),
                    self.last_signature.len(),
                    i.map(|i| &sig[i.saturating_sub(8)..(i + 4).min(sig.len())])
                );
            }
            self.last_signature = sig;
        }
        Ok(())
    }

    /// Records `launches` (of signature `sig`) into a graph, which replaces the captured one,
    /// and replays it.
    fn capture(&mut self, launches: &[Launch], sig: Vec<u64>) -> Result<()> {
        self.captured = None;
        self.captured_last = false;
        self.exec.begin_capture()?;
        let issued = self.issue(launches);
        let graph = self.exec.end_capture();
        issued?;
        let graph = graph?;
        self.exec.replay(&graph)?;
        self.captured = Some((sig, graph));
        self.captured_last = true;
        self.captures += 1;
        self.replays += 1;
        Ok(())
    }
}

/// Writes `values` into `table` (allocated, or reallocated when too small, as needed; `bytes`
/// is scratch for their bytes). Returns whether the table moved (a new allocation).
fn write_table<E: Executor>(
    exec: &mut E,
    bytes: &mut Vec<u8>,
    table: &mut Option<Buffer<E::Buffer>>,
    values: &[i64],
) -> Result<bool> {
    if values.is_empty() {
        return Ok(false);
    }
    bytes.clear();
    bytes.extend(values.iter().flat_map(|x| x.to_le_bytes()));
    match table {
        Some(t) if t.capacity >= bytes.len() => exec.write(&mut t.buf, bytes).map(|_| false),
        _ => {
            let buf = exec.upload(bytes)?;
            *table = Some(Buffer {
                buf,
                capacity: bytes.len(),
                len: bytes.len(),
            });
            Ok(true)
        }
    }
}
