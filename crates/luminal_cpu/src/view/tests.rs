//! Checks of the view loaders: block loads against element loads (random views, gather
//! tables, paired and transposing tables) and re-resolution on dim changes.

use super::*;

/// A resolved view is reused only while the dims its expressions read keep their
/// values: changing a dim it reads re-resolves it, changing one it does not read keeps
/// the (still right) result.
#[test]
fn resolved_views_follow_the_dims_they_read() {
    let names = DimNames(vec!["s".into(), "p".into(), "unused".into()]);
    let (s, p) = (Expression::var("s"), Expression::var("p"));
    // A slice starting at row p of a [p + s + 4, 8] buffer: dims depend on s, the offset
    // on p.
    let mut view = ShapeTracker::new(vec![p.clone() + s.clone() + 4, Expression::from(8)]);
    view.slice(0, p.clone(), p.clone() + s.clone());
    let exprs = ViewExprs::new(&view, &names).unwrap();
    let mut out = ResolvedView::default();
    let mut dims = [0i64; MAX_DYN_DIMS + 1];
    let check = |out: &ResolvedView, s: i64, p: i64| {
        assert_eq!(out.dims, vec![s, 8], "s = {s}, p = {p}");
        assert_eq!(out.offset, p * 8, "s = {s}, p = {p}");
    };
    for (sv, pv, unused) in [
        (1, 0, 0),
        (1, 5, 0),
        (3, 5, 0),
        (3, 5, 9),
        (2, 7, 9),
        (2, 7, 1),
    ] {
        dims[1] = sv;
        dims[2] = pv;
        dims[3] = unused;
        exprs.resolve(&dims, &mut out).unwrap();
        check(&out, sv, pv);
    }
    // Only `s` and `p` are keys. A marked result survives a change of the unused dim
    // (reused, not re-evaluated) and is replaced when `p` changes.
    assert_eq!(exprs.reads, 0b110);
    out.offset = -1;
    dims[3] = 4;
    exprs.resolve(&dims, &mut out).unwrap();
    assert_eq!(
        out.offset, -1,
        "re-resolved although no dim it reads changed"
    );
    dims[2] = 11;
    exprs.resolve(&dims, &mut out).unwrap();
    check(&out, 2, 11);
}

/// Tables that pair up (`Pairs`: adjacent values, or half or all padding) load by
/// 8-byte gathers: the same values as element loads, from odd starts and in short
/// pieces, and where a half-valid pair's neighbour lies past the buffer's end (the
/// buffer ends at the view's last value: those pieces load element by element).
#[test]
fn paired_tables_match_element_loads() {
    let view = |dims: Vec<i64>, strides: Vec<i64>, offset: i64, lo: Vec<i64>, hi: Vec<i64>| {
        let masked = lo
            .iter()
            .zip(&hi)
            .zip(&dims)
            .any(|((&l, &h), &d)| l != 0 || h != d);
        ResolvedView {
            any_valid: true,
            dims,
            strides,
            offset,
            lo,
            hi,
            masked,
            ..Default::default()
        }
    };
    let views = [
        // Whole pairs and rows of padding (a stride-2 convolution's gradient piece).
        view(
            vec![6, 5, 2],
            vec![40, 7, 1],
            0,
            vec![0, 1, 0],
            vec![6, 4, 2],
        ),
        // First values only (a stride-0 last dim cut to one).
        view(
            vec![6, 5, 2],
            vec![40, 7, 0],
            3,
            vec![0, 0, 0],
            vec![6, 5, 1],
        ),
        // Second values only.
        view(
            vec![6, 5, 2],
            vec![40, 7, 1],
            0,
            vec![0, 0, 1],
            vec![6, 5, 2],
        ),
        // A padded copy: rows of 8 between two padding values.
        view(vec![12, 10], vec![8, 1], -1, vec![0, 1], vec![12, 9]),
    ];
    let mut seed = 7u64;
    let mut next = |m: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m as u64) as usize
    };
    for (i, v) in views.iter().enumerate() {
        let t = GatherTable::of(v).expect("a gather table");
        assert!(t.pairs.is_some(), "view {i}: no pairs");
        let end = v.max_index().unwrap() as usize + 1;
        for len in [end, end + 5] {
            let buf: Vec<f32> = (0..len).map(|x| x as f32 + 0.25).collect();
            let n: usize = v.dims.iter().product::<i64>() as usize;
            let want: Vec<f32> = (0..n).map(|z| v.load_one(BufRef::F32(&buf), z)).collect();
            for _ in 0..20 {
                let mut got = vec![f32::NAN; n];
                let mut z = 0;
                while z < n {
                    let take = (1 + next(40)).min(n - z);
                    t.load(&buf, z, &mut got[z..z + take]);
                    z += take;
                }
                assert_eq!(got, want, "view {i}, buffer of {len}");
            }
        }
    }
}

/// Transposing tables (a row-major block read down its columns) load whole groups of
/// 16 rows as register-transposed tiles: the same values as element loads, in whole
/// tables, in groups of rows, and in pieces that fall back to gathers.
#[test]
fn transposing_tables_match_element_loads() {
    // Three blocks of 48 rows of 40 values (32 read), read as [3, 32, 48].
    let v = ResolvedView {
        any_valid: true,
        dims: vec![3, 32, 48],
        strides: vec![2000, 1, 40],
        offset: 5,
        lo: vec![0, 0, 0],
        hi: vec![3, 32, 48],
        ..Default::default()
    };
    let t = GatherTable::of(&v).expect("a gather table");
    assert_eq!(t.transpose, Some((32, 48, 40)));
    let buf: Vec<f32> = (0..6100).map(|x| x as f32 - 7.5).collect();
    let n = 3 * 32 * 48;
    let want: Vec<f32> = (0..n).map(|z| v.load_one(BufRef::F32(&buf), z)).collect();
    for piece in [32 * 48, 3 * 32 * 48, 16 * 48, 48, 7] {
        let mut got = vec![f32::NAN; n];
        let mut z = 0;
        while z < n {
            let take = piece.min(n - z);
            t.load(&buf, z, &mut got[z..z + take]);
            z += take;
        }
        assert_eq!(got, want, "pieces of {piece}");
    }
}

/// `load` (the odometer and the short-row paths) against `load_one` element by element,
/// on random masked, strided, broadcast views and random block boundaries.
#[test]
fn block_loads_match_element_loads() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: i64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % m.max(1) as u64) as i64
    };
    let buf: Vec<f32> = (0..200_000).map(|i| i as f32 + 0.5).collect();
    let mut tables = 0;
    for case in 0..3000 {
        let r = 1 + next(if case % 3 == 0 { 6 } else { 4 }) as usize;
        let dims: Vec<i64> = (0..r)
            .map(|i| {
                if i == r - 1 {
                    1 + next(9)
                } else if next(4) == 0 {
                    1
                } else {
                    1 + next(6)
                }
            })
            .collect();
        // Every third case: strides that chain (row-major pieces, broadcasts), so the
        // loaders' dim merging and size-1 dropping are exercised.
        let strides: Vec<i64> = if case % 3 == 0 {
            let mut st = vec![0i64; r];
            let mut acc = 1 + next(3);
            for i in (0..r).rev() {
                st[i] = if next(5) == 0 { 0 } else { acc };
                acc *= dims[i] + next(2);
            }
            st
        } else {
            (0..r)
                .map(|_| if next(4) == 0 { 0 } else { 1 + next(40) })
                .collect()
        };
        let masked = case % 4 != 0;
        let (lo, hi): (Vec<i64>, Vec<i64>) = dims
            .iter()
            .map(|&d| {
                if masked {
                    let a = next(d + 1);
                    (a, a + next(d - a + 1))
                } else {
                    (0, d)
                }
            })
            .unzip();
        let v = ResolvedView {
            any_valid: lo.iter().zip(&hi).all(|(l, h)| l < h),
            dims: dims.clone(),
            strides,
            offset: next(100),
            lo,
            hi,
            masked,
            contiguous: false,
            linear: false,
            table: None,
            resolved_for: None,
        };
        let n: usize = dims.iter().product::<i64>() as usize;
        let want: Vec<f32> = (0..n).map(|z| v.load_one(BufRef::F32(&buf), z)).collect();
        let mut got = vec![f32::NAN; n];
        let mut z = 0;
        while z < n {
            let len = (1 + next(n as i64) as usize).min(n - z);
            v.load(BufRef::F32(&buf), z, &mut got[z..z + len]);
            z += len;
        }
        assert_eq!(got, want, "case {case}: {v:?}");
        // The same view through its gather table, where it gets one.
        if v.any_valid {
            let mut vt = v.clone();
            vt.table = GatherTable::of(&vt).map(std::sync::Arc::new);
            if vt.table.is_some() {
                tables += 1;
                let mut got = vec![f32::NAN; n];
                let mut z = 0;
                while z < n {
                    let len = (1 + next(n as i64) as usize).min(n - z);
                    vt.load(BufRef::F32(&buf), z, &mut got[z..z + len]);
                    z += len;
                }
                assert_eq!(got, want, "case {case} (gather table): {v:?}");
            }
        }
    }
    assert!(
        tables > 300,
        "only {tables} random views got a gather table"
    );
    // Padding before the buffer's start: a [7, 3, 1] view whose first two rows are
    // padding (offset -6) merges into one masked dim, and a block of padding only must
    // not touch the buffer.
    let v = ResolvedView {
        dims: vec![7, 3, 1],
        strides: vec![3, 1, 1],
        offset: -6,
        lo: vec![2, 0, 0],
        hi: vec![7, 3, 1],
        any_valid: true,
        masked: true,
        contiguous: false,
        linear: false,
        table: None,
        resolved_for: None,
    };
    for z0 in 0..21 {
        for n in 1..=21 - z0 {
            let want: Vec<f32> = (z0..z0 + n)
                .map(|z| v.load_one(BufRef::F32(&buf), z))
                .collect();
            let mut got = vec![f32::NAN; n];
            v.load(BufRef::F32(&buf), z0, &mut got);
            assert_eq!(got, want, "z0 {z0} n {n}");
        }
    }
}
