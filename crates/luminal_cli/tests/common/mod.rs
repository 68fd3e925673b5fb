//! Helpers shared by the CLI tests that run the `luminal` binary.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::Output;

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The process's stderr as text.
pub fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code 1, nothing on stdout, one `error: …` line on stderr: that line.
pub fn one_line_error(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(1), "{}", err(o));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let e = err(o);
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 1, "{e}");
    lines[0].to_string()
}
