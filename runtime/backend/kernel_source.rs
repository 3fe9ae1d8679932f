//! Where the NVRTC programs' CUDA C comes from: the files built into the crate, or, for
//! measurements, files that stand in for them, so that one run on a GPU tries several versions
//! of a kernel with the same test and bench binaries. Read once a process; a file that is named
//! but cannot be read is refused as [`Error::InvalidArgument`], never replaced by the built-in
//! one (a measurement must run what it names).
//!
//! - `GRAPHED_KERNELS_DIR=<folder>`: each file of the main program ([`MAIN`]) and `decoder.cu`
//!   that the folder holds (by file name) replaces the built-in one; the others stay built in.
//! - `GRAPHED_DECODER_SOURCE=<file>`: the one-kernel decoding step's source (before the folder's
//!   `decoder.cu`).

use std::path::Path;
use std::sync::OnceLock;

use crate::{Error, Result};

/// The main program's files, by name, in the order NVRTC compiles them. `BuiltinKernel` names
/// are `extern "C"` functions of these.
pub(crate) const MAIN: &[(&str, &str)] = &[
    ("core.cu", include_str!("kernels/core.cu")),
    ("ops.cu", include_str!("kernels/ops.cu")),
    ("half.cu", include_str!("kernels/half.cu")),
    ("scale_update.cu", include_str!("kernels/scale_update.cu")),
    ("generation.cu", include_str!("kernels/generation.cu")),
    ("mixed.cu", include_str!("kernels/mixed.cu")),
    ("multi_tensor.cu", include_str!("kernels/multi_tensor.cu")),
    ("transformer.cu", include_str!("kernels/transformer.cu")),
    ("flash.cu", include_str!("kernels/flash.cu")),
    ("decode.cu", include_str!("kernels/decode.cu")),
];

/// The files the decoding step's program starts with (the helpers `decoder.cu` builds on).
pub(crate) const DECODER_BASE: usize = 3;

const DECODER: &str = include_str!("kernels/decoder.cu");

/// The main program's sources, in [`MAIN`]'s order, each from `GRAPHED_KERNELS_DIR` where that
/// folder holds a file of its name.
pub(crate) fn main_sources() -> Result<&'static [&'static str]> {
    static SRC: OnceLock<std::result::Result<Vec<&'static str>, String>> = OnceLock::new();
    let dir = kernels_dir();
    let src =
        SRC.get_or_init(|| MAIN.iter().map(|&(name, text)| Ok(leak(in_dir(dir, name)?).unwrap_or(text))).collect());
    src.as_deref().map_err(|e| refusal(e))
}

/// The one-kernel decoding step's source: `GRAPHED_DECODER_SOURCE`'s file, else
/// `GRAPHED_KERNELS_DIR`'s `decoder.cu`, else the built-in `kernels/decoder.cu`.
pub(crate) fn decoder_source() -> Result<&'static str> {
    static SRC: OnceLock<std::result::Result<&'static str, String>> = OnceLock::new();
    let src = SRC.get_or_init(|| {
        let named = read_file(std::env::var_os("GRAPHED_DECODER_SOURCE").as_deref(), "GRAPHED_DECODER_SOURCE")?;
        let found = match named {
            Some(text) => Some(text),
            None => in_dir(kernels_dir(), "decoder.cu")?,
        };
        Ok(leak(found).unwrap_or(DECODER))
    });
    src.as_ref().map(|s| *s).map_err(|e| refusal(e))
}

fn refusal(detail: &str) -> Error {
    Error::InvalidArgument { op: "kernel sources", detail: detail.to_string() }
}

/// Kept for the process (sources are read once and compiled for every device).
fn leak(text: Option<String>) -> Option<&'static str> {
    text.map(|t| &*Box::leak(t.into_boxed_str()))
}

fn kernels_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("GRAPHED_KERNELS_DIR").filter(|v| !v.is_empty()).map(Into::into)).as_deref()
}

/// The text of `var`'s file (the variable `what` names it): none when unset or empty, or why
/// it could not be read.
fn read_file(var: Option<&std::ffi::OsStr>, what: &str) -> std::result::Result<Option<String>, String> {
    match var.filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(path) => std::fs::read_to_string(path)
            .map(Some)
            .map_err(|e| format!("{what} names {}, which could not be read: {e}", Path::new(path).display())),
    }
}

/// The text of `name` in `dir`: none without a folder or where the folder has no such file; an
/// error where `dir` is not a folder or the file cannot be read.
fn in_dir(dir: Option<&Path>, name: &str) -> std::result::Result<Option<String>, String> {
    let Some(dir) = dir else { return Ok(None) };
    if !dir.is_dir() {
        return Err(format!("GRAPHED_KERNELS_DIR names {}, which is not a folder", dir.display()));
    }
    let file = dir.join(name);
    if !file.exists() {
        return Ok(None);
    }
    read_file(Some(file.as_os_str()), "GRAPHED_KERNELS_DIR").map_err(|e| format!("{e} ({name})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("graphed-kernel-source-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Unset or empty: the built-in kernel; a file: its text; a file that cannot be read: the
    /// reason (which the callers turn into `Error::InvalidArgument`, never the built-in kernel).
    #[test]
    fn a_named_file_is_read_or_refused() {
        assert_eq!(read_file(None, "X"), Ok(None));
        assert_eq!(read_file(Some(std::ffi::OsStr::new("")), "X"), Ok(None));
        let dir = scratch("file");
        let file = dir.join("variant.cu");
        std::fs::write(&file, "// a variant\n").unwrap();
        assert_eq!(read_file(Some(file.as_os_str()), "X"), Ok(Some("// a variant\n".to_string())));
        let err = read_file(Some(dir.join("missing.cu").as_os_str()), "GRAPHED_DECODER_SOURCE").unwrap_err();
        assert!(
            err.contains("GRAPHED_DECODER_SOURCE") && err.contains("missing.cu") && err.contains("could not be read"),
            "{err}"
        );
        // A folder is not a source file either.
        assert!(read_file(Some(dir.as_os_str()), "X").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A folder replaces the files it holds and leaves the others built in; a path that is not
    /// a folder is refused.
    #[test]
    fn a_folder_replaces_only_the_files_it_holds() {
        assert_eq!(in_dir(None, "transformer.cu"), Ok(None));
        let dir = scratch("dir");
        std::fs::write(dir.join("transformer.cu"), "// rows\n").unwrap();
        assert_eq!(in_dir(Some(&dir), "transformer.cu"), Ok(Some("// rows\n".to_string())));
        assert_eq!(in_dir(Some(&dir), "flash.cu"), Ok(None));
        let err = in_dir(Some(&dir.join("transformer.cu")), "transformer.cu").unwrap_err();
        assert!(err.contains("not a folder"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The built-in table names every file the crate embeds, each once, core.cu first (the
    /// decoding step's program takes the first [`DECODER_BASE`]).
    #[test]
    fn the_table_holds_each_file_once() {
        let names: Vec<&str> = MAIN.iter().map(|&(n, _)| n).collect();
        assert_eq!(&names[..DECODER_BASE], &["core.cu", "ops.cu", "half.cu"]);
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }
}
