//! A disk cache of NVRTC's output. Every process that opens a GPU compiles the main kernel
//! program (about 13 s of NVRTC on one core for 5.6 MB of PTX), and the one-kernel decoding step
//! once a model shape: the same sources with the same options give the same PTX, so a process
//! can read it back instead. The driver caches its own step, PTX to machine code, in its
//! compute cache (`CUDA_CACHE_PATH`).
//!
//! Opt-in (it writes files): `GRAPHED_CACHE_DIR=<folder>` turns it on (the PTX goes to
//! `<folder>/ptx`); unset or empty, every process compiles. On the H200's host a warm entry cut
//! `gpt --steps 1` from 12.0 s to 9.8 s (2026-12-04). An entry is keyed by a SHA-256 of
//! the NVRTC version, the options and the source, and holds the PTX's own SHA-256 and length: a
//! truncated, corrupted or foreign file is a miss (compiled again and rewritten), never an error.
//! Entries are written to a temporary file and renamed into place, so processes that compile
//! the same program at once each find a whole file or none; a folder that cannot be written
//! leaves the compile's result as it is.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cudarc::nvrtc::Ptx;
use sha2::{Digest, Sha256};

/// The first line's tag: a format change makes old entries misses.
const TAG: &str = "graphed-ptx 1";

/// The folder entries go to (`GRAPHED_CACHE_DIR`/ptx), or `None`: no cache.
fn folder() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os("GRAPHED_CACHE_DIR").filter(|v| !v.is_empty()).map(|v| PathBuf::from(v).join("ptx"))
    })
    .as_deref()
}

/// NVRTC's version, part of every key (another compiler may give other PTX). Call it only
/// after the library was found (`CudaBackend::new` probes it first).
fn nvrtc_version() -> (i32, i32) {
    static V: OnceLock<(i32, i32)> = OnceLock::new();
    *V.get_or_init(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out-pointers to live i32s; the library is loaded (see above).
        let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (major, minor)
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The entry's key: what the PTX is a function of.
fn key(compiler: (i32, i32), options: &[String], source: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!("{TAG}\0nvrtc {}.{}\0", compiler.0, compiler.1));
    for o in options {
        h.update(o.as_bytes());
        h.update([0u8]);
    }
    h.update([1u8]);
    h.update(source.as_bytes());
    hex(&h.finalize())
}

/// `compile()`'s PTX for `source` compiled with `options`, read from the cache where it holds
/// it (then `compile` is not called); otherwise compiled, and stored where the cache is on.
/// Errors are `compile`'s only.
pub(crate) fn compile_cached<E>(
    source: &str,
    options: &[String],
    compile: impl FnOnce() -> std::result::Result<Ptx, E>,
) -> std::result::Result<Ptx, E> {
    match folder() {
        Some(dir) => cached_in(dir, nvrtc_version(), source, options, compile, image_text),
        None => compile(),
    }
}

/// The text of NVRTC's PTX (an image, as `compile_ptx` returns it); `None` for another kind,
/// which is not stored (`Ptx::to_src` would panic on a cubin or an unreadable file).
fn image_text(ptx: &Ptx) -> Option<String> {
    ptx.as_bytes().map(|_| ptx.to_src())
}

/// [`compile_cached`] with its folder, compiler version and the compile result's text given
/// (the tests' entry).
fn cached_in<E>(
    dir: &Path,
    compiler: (i32, i32),
    source: &str,
    options: &[String],
    compile: impl FnOnce() -> std::result::Result<Ptx, E>,
    text: impl Fn(&Ptx) -> Option<String>,
) -> std::result::Result<Ptx, E> {
    let key = key(compiler, options, source);
    let path = dir.join(format!("{key}.ptx"));
    if let Some(ptx) = load(&path, &key) {
        return Ok(Ptx::from_src(ptx));
    }
    let ptx = compile()?;
    if let Some(t) = text(&ptx) {
        store(dir, &path, &key, &t);
    }
    Ok(ptx)
}

/// The entry's PTX, if the file is whole and is this key's.
fn load(path: &Path, key: &str) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let nl = bytes.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..nl]).ok()?;
    let body = &bytes[nl + 1..];
    let mut fields = header.strip_prefix(TAG)?.split_whitespace();
    let (k, sum, len) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() || k != key || len.parse::<usize>().ok()? != body.len() {
        return None;
    }
    if hex(&Sha256::digest(body)) != sum || body.contains(&0) {
        return None;
    }
    String::from_utf8(body.to_vec()).ok()
}

/// Writes the entry through a temporary file renamed into place; failures leave no entry.
fn store(dir: &Path, path: &Path, key: &str, ptx: &str) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dir.join(format!(".{key}.{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let mut text = format!("{TAG} {key} {} {}\n", hex(&Sha256::digest(ptx.as_bytes())), ptx.len()).into_bytes();
    text.extend_from_slice(ptx.as_bytes());
    if std::fs::write(&tmp, &text).is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const PTX: &str = "//\n.version 8.0\n.target sm_90\n.address_size 64\n";

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("graphed-ptx-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The cache with a compile that counts its calls and gives `PTX`.
    fn run(dir: &Path, src: &str, opts: &[String], calls: &Cell<u32>) -> String {
        let compile = || -> std::result::Result<Ptx, ()> {
            calls.set(calls.get() + 1);
            Ok(Ptx::from_src(PTX))
        };
        cached_in(dir, (13, 0), src, opts, compile, |p| Some(p.to_src())).unwrap().to_src()
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir).map_or(Vec::new(), |r| r.map(|e| e.unwrap().path()).collect())
    }

    #[test]
    fn a_miss_compiles_and_stores_and_a_hit_reads_back_without_compiling() {
        let dir = temp_dir("hit");
        let opts = vec!["--gpu-architecture=sm_90".to_string(), "-DX=1".to_string()];
        let calls = Cell::new(0);
        assert_eq!(run(&dir, "src", &opts, &calls), PTX);
        assert_eq!(calls.get(), 1);
        let files = entries(&dir);
        assert_eq!(files.len(), 1, "one entry, no temporary file left: {files:?}");
        assert_eq!(run(&dir, "src", &opts, &calls), PTX);
        assert_eq!(calls.get(), 1, "read back, not compiled");
        // Another source or option set is another entry.
        assert_eq!(run(&dir, "src2", &opts, &calls), PTX);
        assert_eq!(run(&dir, "src", &opts[..1], &calls), PTX);
        assert_eq!((calls.get(), entries(&dir).len()), (3, 3));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_foreign_or_damaged_entry_is_a_miss_and_is_rewritten() {
        let dir = temp_dir("damaged");
        let opts = vec!["-DA=1".to_string()];
        let key = key((13, 0), &opts, "src");
        let path = dir.join(format!("{key}.ptx"));
        store(&dir, &path, &key, PTX);
        assert_eq!(load(&path, &key).as_deref(), Some(PTX));
        let whole = std::fs::read(&path).unwrap();
        let other = format!("{}{}", if key.starts_with('0') { '1' } else { '0' }, &key[1..]);
        assert_eq!(load(&path, &other), None, "another key's entry");
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut nul = whole.clone();
        let n = nul.len();
        nul[n - 2] = 0;
        let mut longer = whole.clone();
        longer.push(b'\n');
        for (what, bytes) in [
            ("truncated", whole[..whole.len() - 3].to_vec()),
            ("a flipped byte", flipped),
            ("a NUL byte", nul),
            ("a byte too many", longer),
            ("no header", PTX.as_bytes().to_vec()),
            ("a header alone", whole[..whole.iter().position(|&b| b == b'\n').unwrap()].to_vec()),
            ("empty", Vec::new()),
            ("not UTF-8", vec![0xff, 0xfe, b'\n', 0x80]),
        ] {
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(load(&path, &key), None, "{what}");
            let calls = Cell::new(0);
            assert_eq!(run(&dir, "src", &opts, &calls), PTX, "{what}");
            assert_eq!(calls.get(), 1, "{what}: compiled again");
            assert_eq!(load(&path, &key).as_deref(), Some(PTX), "{what}: rewritten whole");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_key_changes_with_the_compiler_the_options_and_the_source() {
        let o = |s: &str| vec![s.to_string()];
        let base = key((13, 0), &o("-DA=1"), "src");
        assert_eq!(base, key((13, 0), &o("-DA=1"), "src"));
        assert_ne!(base, key((12, 9), &o("-DA=1"), "src"));
        assert_ne!(base, key((13, 0), &o("-DA=2"), "src"));
        assert_ne!(base, key((13, 0), &o("-DA=1"), "src "));
        // Options and source do not run into each other.
        assert_ne!(key((13, 0), &o("ab"), "c"), key((13, 0), &o("a"), "bc"));
        assert_ne!(key((13, 0), &["a".into(), "b".into()], ""), key((13, 0), &o("ab"), ""));
    }

    #[test]
    fn errors_are_the_compiles_and_results_without_text_are_not_stored() {
        let dir = temp_dir("errors");
        let err = cached_in(&dir, (13, 0), "s", &[], || -> std::result::Result<Ptx, &str> { Err("no") }, |_| None);
        assert_eq!(err.err(), Some("no"));
        let ok =
            cached_in(&dir, (13, 0), "s", &[], || -> std::result::Result<Ptx, ()> { Ok(Ptx::from_src(PTX)) }, |_| None);
        assert_eq!(ok.unwrap().to_src(), PTX);
        assert!(entries(&dir).is_empty());
        // A text PTX (not an NVRTC image) has no image text.
        assert_eq!(image_text(&Ptx::from_src(PTX)), None);
    }

    #[test]
    fn a_folder_that_cannot_be_written_leaves_the_result_as_it_is() {
        // A file where the folder should be: nothing is stored, the compile's result stands.
        let base = temp_dir("blocked");
        std::fs::create_dir_all(&base).unwrap();
        let dir = base.join("ptx");
        std::fs::write(&dir, b"not a folder").unwrap();
        let calls = Cell::new(0);
        assert_eq!(run(&dir, "s", &[], &calls), PTX);
        assert_eq!(run(&dir, "s", &[], &calls), PTX);
        assert_eq!(calls.get(), 2);
        let _ = std::fs::remove_dir_all(&base);
    }
}
