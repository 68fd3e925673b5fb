//! The tile-product loop of an AMX f32 product: one 32 × 32 block of C over a chunk of K
//! blocks, the piece products of each K block run in an order that spreads the tile loads
//! (see [`chunk`]).

use super::{Operands, TILE};
use std::arch::asm;

/// The piece products `(A piece, B piece)` of f32 accuracy (`Highest`: `hh, mh, mm, hm,
/// hl, lh`), in the order a K block runs them: each product shares one operand with the one
/// before, except once (`lh` after `hl`, both operands new), so a K block loads 16 tiles for
/// its 24 tile products instead of the 18 of grouping them by B piece. (The products form a
/// graph on the pieces with four odd vertices: no order does with fewer than one such jump,
/// plus the one into the next K block.)
pub(super) const TRAIL_F32: [(usize, usize); 6] = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (2, 0)];

/// The three-product form (`mh, hh, hm`: two pieces each, ~2⁻¹⁶ relative, PyTorch's
/// "high" float32 matmul precision): one trail, 8 loads for 12 tile products.
pub(super) const TRAIL_HIGH: [(usize, usize); 3] = [(1, 0), (0, 0), (0, 1)];

/// K blocks `kc..kc + kn` of the 32 × 32 block of C at A panels `ip, ip+1` and B panels
/// `jp, jp+1`: accumulators 0 = (ip, jp), 1 = (ip, jp+1), 2 = (ip+1, jp), 3 = (ip+1, jp+1)
/// start at zero (`src` none) or from `src` (f32, the given row stride), and are stored to
/// `dst`.
///
/// Each K block runs the piece products of `trail` in order, four tile products each
/// (operands: A panels in tmm4/tmm5, B panels in tmm6/tmm7). Between two products only the
/// operand that changes is loaded, each tile right after the last tile product reading its
/// register is issued, and each product issues first the tile products whose operands were
/// loaded longest ago: a tile load waits for the products still reading its register, and
/// a product for the load of its operands; several loads in a row before the products that
/// read them cut the rate to a third (`tests::peak_probe::tmul_rates`).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn chunk(
    ops: &Operands,
    ip: usize,
    jp: usize,
    kc: usize,
    kn: usize,
    trail: &[(usize, usize)],
    src: Option<(*mut f32, usize)>,
    dst: (*mut f32, usize),
) {
    let Operands { pa, mp, pb, np, kb } = *ops;
    // Tile of piece `p`, panel `q`, K block `x` of A / B.
    let at = |p: usize, q: usize, x: usize| pa.add(((p * mp + q) * kb + x) * TILE);
    let bt = |p: usize, q: usize, x: usize| pb.add(((p * np + q) * kb + x) * TILE);
    match src {
        None => asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        ),
        Some((c, rs)) => asm!(
            "tileloadd tmm0, [{0} + {4}*1]",
            "tileloadd tmm1, [{1} + {4}*1]",
            "tileloadd tmm2, [{2} + {4}*1]",
            "tileloadd tmm3, [{3} + {4}*1]",
            in(reg) c,
            in(reg) c.add(16),
            in(reg) c.add(16 * rs),
            in(reg) c.add(16 * rs + 16),
            in(reg) rs * 4,
            options(nostack, readonly)
        ),
    }
    // The first product's operands.
    let (a0, b0) = trail[0];
    load_a(0, at(a0, ip, kc));
    load_b(0, bt(b0, jp, kc));
    load_a(1, at(a0, ip + 1, kc));
    load_b(1, bt(b0, jp + 1, kc));
    // Whether B was loaded last (its tile products then go last).
    let mut b_last = true;
    let end = kc + kn;
    for x in kc..end {
        for (i, &(a_piece, b_piece)) in trail.iter().enumerate() {
            // The next product's operands: the trail's next, or the next K block's first.
            let (nx, (na, nb)) = match trail.get(i + 1) {
                Some(&p) => (x, p),
                None => (x + 1, trail[0]),
            };
            let more = nx < end;
            let new_a = more && (nx != x || na != a_piece);
            let new_b = more && (nx != x || nb != b_piece);
            // Accumulator (A panel, B panel) order: the panels of the operand loaded last
            // are read last.
            let order = if b_last {
                [(0, 0), (1, 0), (0, 1), (1, 1)]
            } else {
                [(0, 0), (0, 1), (1, 0), (1, 1)]
            };
            for (s, &(r, c)) in order.iter().enumerate() {
                tile_product(r, c);
                // A register whose last reader this was takes its next tile now.
                let rest = &order[s + 1..];
                if new_a && !rest.iter().any(|&(r2, _)| r2 == r) {
                    load_a(r, at(na, ip + r, nx));
                }
                if new_b && !rest.iter().any(|&(_, c2)| c2 == c) {
                    load_b(c, bt(nb, jp + c, nx));
                }
            }
            if new_a || new_b {
                b_last = new_b;
            }
        }
    }
    let (c, rs) = dst;
    asm!(
        "tilestored [{0} + {4}*1], tmm0",
        "tilestored [{1} + {4}*1], tmm1",
        "tilestored [{2} + {4}*1], tmm2",
        "tilestored [{3} + {4}*1], tmm3",
        in(reg) c,
        in(reg) c.add(16),
        in(reg) c.add(16 * rs),
        in(reg) c.add(16 * rs + 16),
        in(reg) rs * 4,
        options(nostack)
    );
}

/// Loads the tile at `p` (rows 64 bytes apart) into the A register of panel `r` (tmm4,
/// tmm5).
#[inline(always)]
unsafe fn load_a(r: usize, p: *const u16) {
    match r {
        0 => {
            asm!("tileloadd tmm4, [{0} + {1}*1]", in(reg) p, in(reg) 64usize, options(nostack, readonly))
        }
        _ => {
            asm!("tileloadd tmm5, [{0} + {1}*1]", in(reg) p, in(reg) 64usize, options(nostack, readonly))
        }
    }
}

/// Loads the tile at `p` into the B register of panel `c` (tmm6, tmm7).
#[inline(always)]
unsafe fn load_b(c: usize, p: *const u16) {
    match c {
        0 => {
            asm!("tileloadd tmm6, [{0} + {1}*1]", in(reg) p, in(reg) 64usize, options(nostack, readonly))
        }
        _ => {
            asm!("tileloadd tmm7, [{0} + {1}*1]", in(reg) p, in(reg) 64usize, options(nostack, readonly))
        }
    }
}

/// Accumulator (A panel `r`, B panel `c`) += A register `r` · B register `c`.
#[inline(always)]
unsafe fn tile_product(r: usize, c: usize) {
    match (r, c) {
        (0, 0) => asm!("tdpbf16ps tmm0, tmm4, tmm6", options(nostack, nomem)),
        (0, _) => asm!("tdpbf16ps tmm1, tmm4, tmm7", options(nostack, nomem)),
        (_, 0) => asm!("tdpbf16ps tmm2, tmm5, tmm6", options(nostack, nomem)),
        _ => asm!("tdpbf16ps tmm3, tmm5, tmm7", options(nostack, nomem)),
    }
}
