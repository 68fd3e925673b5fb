//! Several independent generated kernels run by one launch.

use super::{fnv1a, Kernel};

/// One kernel running up to three independent generated kernels (`members`: one thread per
/// element, not cooperative) side by side: each member's body becomes a device function of its
/// block index, and the kernel's blocks `[0, g0)` run the first, `[g0, g0 + g1)` the second,
/// the rest the third (a decode step's RoPE and two cache writes: one launch instead of
/// three). Parameters: every member's buffers (with its error buffer and dims table) in
/// order, then every member's scalars in order, then `g0` (and `g1`). `None` when a member
/// is not such a kernel.
pub fn combined_kernel(members: &[&Kernel]) -> Option<Kernel> {
    if !(2..=3).contains(&members.len()) {
        return None;
    }
    let mut devs = String::new();
    let (mut ptrs, mut scalars, mut calls) = (vec![], vec![], vec![]);
    let mut buffer_types = vec![];
    let mut n_scalars = 0;
    for (m, k) in members.iter().enumerate() {
        let head = format!("LUM_EXTERN_C __global__ void {}(", k.name);
        if k.cooperative || k.scalars.is_some() || !k.source.starts_with(&head) {
            return None;
        }
        let close = k.source.find(") {\n")?;
        let params: Vec<&str> = k.source[head.len()..close].split(", ").collect();
        let mut args = vec![];
        for (i, p) in params.iter().enumerate() {
            let (ty, _) = p.rsplit_once(' ')?;
            // The wrapper only forwards: no `restrict` promise across members (two may share
            // the dims table or the error flag).
            let ty = ty.replace(" __restrict__", "");
            let name = format!("lum_m{m}_{i}");
            if ty.contains('*') {
                ptrs.push(format!("{ty} {name}"));
            } else {
                scalars.push(format!("{ty} {name}"));
                n_scalars += 1;
            }
            args.push(name);
        }
        buffer_types.extend(&k.buffer_types);
        if k.error_flag {
            buffer_types.push("int");
        }
        if !k.dims.is_empty() {
            buffer_types.push("long long");
        }
        let dev = format!("{}_dev", k.name);
        if !devs.contains(&format!(" {dev}(")) {
            // Guarded: combined kernels sharing a member may share a module.
            let guard = format!("LUM_HAVE_{dev}");
            devs.push_str(&format!("#ifndef {guard}\n#define {guard}\n"));
            devs.push_str(
                &k.source
                    .replacen(&head, &format!("LUM_DEV void {dev}(unsigned lum_bx, "), 1)
                    .replace("blockIdx.x", "lum_bx"),
            );
            devs.push_str("#endif\n");
        }
        calls.push((dev, args));
    }
    let bounds: Vec<String> = (0..members.len() - 1)
        .map(|i| format!("lum_g{i}"))
        .collect();
    let mut body = String::from("    unsigned lum_b = blockIdx.x;\n");
    for (m, (dev, args)) in calls.iter().enumerate() {
        let call = format!("{dev}(lum_b, {});", args.join(", "));
        if m + 1 < calls.len() {
            body.push_str(&format!(
                "    if (lum_b < (unsigned)lum_g{m}) {{ {call} return; }}\n    lum_b -= (unsigned)lum_g{m};\n"
            ));
        } else {
            body.push_str(&format!("    {call}\n"));
        }
    }
    let all: Vec<String> = ptrs
        .into_iter()
        .chain(scalars)
        .chain(bounds.iter().map(|b| format!("long long {b}")))
        .collect();
    let text = format!(
        "{devs}LUM_EXTERN_C __global__ void KERNEL({}) {{\n{body}}}\n",
        all.join(", ")
    );
    let name = format!("lum_combo{}_{:016x}", members.len(), fnv1a(&text));
    Some(Kernel {
        source: text.replace("KERNEL", &name),
        name,
        buffer_types,
        error_flag: false,
        dims: vec![],
        cooperative: false,
        scalars: Some(n_scalars + bounds.len()),
    })
}
