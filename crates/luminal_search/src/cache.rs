//! The on-disk cache of search results.
//!
//! Key: a hash of the graph's terms and tables (structure, views, dtypes, input names),
//! the dynamic dims' shape bucket (each value rounded up to a power of two), the backend's
//! [`luminal::Tunable::tuning_id`] (backend, instruction set, cores, settings), this crate's
//! version and its rule files. Value: the chosen schedule and the chosen terms
//! ([`crate::terms::TermDag::to_text`]), so a hit rebuilds the plan without searching.
//!
//! Directory: `$LUMINAL_CACHE_DIR`, else `$XDG_CACHE_HOME/luminal`, else
//! `$HOME/.cache/luminal` (`%LOCALAPPDATA%\luminal` on Windows), else the temp dir; results
//! live in its `search/` folder, one file per key.

use crate::terms::{Encoding, TermDag};
use luminal::GraphData;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// FNV-1a, 64 bits: stable across runs and Rust versions (unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The cache directory (see the module docs).
pub fn default_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("LUMINAL_CACHE_DIR") {
        return d;
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("luminal");
    }
    if let Some(d) = env("LOCALAPPDATA") {
        return d.join("luminal");
    }
    if let Some(d) = env("HOME") {
        return d.join(".cache").join("luminal");
    }
    std::env::temp_dir().join("luminal-cache")
}

/// The power of two at or above `v` (the shape bucket of a dynamic dim).
pub fn bucket(v: i64) -> i64 {
    (v.max(1) as u64).next_power_of_two() as i64
}

/// The cache key of a search of `g` (encoded as `enc`) for `backend_id` at `dims`.
pub fn key(enc: &Encoding, g: &GraphData, dims: &HashMap<String, i64>, backend_id: &str) -> String {
    let mut text = String::new();
    text.push_str(&enc.dag.to_text());
    for v in &enc.views {
        text.push_str(&format!("view {v:?}\n"));
    }
    for &k in &enc.opaque {
        let n = g.node(k);
        text.push_str(&format!("opaque {:?} {} {:?}\n", n.op, n.dtype, n.shape));
    }
    let mut d: Vec<(&String, &i64)> = dims.iter().collect();
    d.sort();
    for (name, v) in d {
        text.push_str(&format!("dim {name} {}\n", bucket(*v)));
    }
    text.push_str(&format!("backend {backend_id}\n"));
    text.push_str(&format!("luminal_search {}\n", env!("CARGO_PKG_VERSION")));
    text.push_str(crate::egraph::LANG);
    for (_, rules) in crate::egraph::RULE_FILES {
        text.push_str(rules);
    }
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// A cached result.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub schedule: String,
    pub dag: TermDag,
    /// Human-readable notes (the timings that chose it).
    pub notes: String,
}

pub fn path(dir: &Path, key: &str) -> PathBuf {
    dir.join("search").join(format!("{key}.plan"))
}

const MAGIC: &str = "luminal-search-plan v1";

pub fn load(dir: &Path, key: &str) -> Option<Entry> {
    let text = std::fs::read_to_string(path(dir, key)).ok()?;
    let mut lines = text.lines();
    if lines.next()? != MAGIC {
        return None;
    }
    let schedule = lines.next()?.strip_prefix("schedule ")?.to_string();
    let mut notes = String::new();
    let mut terms = String::new();
    for l in lines {
        match l.strip_prefix("# ") {
            Some(n) => {
                notes.push_str(n);
                notes.push('\n');
            }
            None => {
                terms.push_str(l);
                terms.push('\n');
            }
        }
    }
    Some(Entry {
        schedule,
        dag: TermDag::from_text(&terms)?,
        notes,
    })
}

/// Writes the entry (to a temporary file renamed into place, so readers never see half).
pub fn store(dir: &Path, key: &str, e: &Entry) -> std::io::Result<PathBuf> {
    let p = path(dir, key);
    std::fs::create_dir_all(p.parent().unwrap_or(dir))?;
    let mut text = format!("{MAGIC}\nschedule {}\n", e.schedule);
    for n in e.notes.lines() {
        text.push_str(&format!("# {n}\n"));
    }
    text.push_str(&e.dag.to_text());
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, &p)?;
    Ok(p)
}
