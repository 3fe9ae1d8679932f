//! The training text: the repository's own sources and docs, or a file, as bytes, split into
//! training and validation parts, and batches drawn from them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use graphed::{Device, Error, Result, Tensor};

use crate::runner::Rng;

fn corpus_err(detail: String) -> Error {
    Error::InvalidArgument { op: "corpus", detail }
}

/// Files under `dir` (recursively) whose name ends in `ext`, sorted.
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            files(&p, ext, out);
        } else if p.extension().is_some_and(|e| e == ext) {
            out.push(p);
        }
    }
}

/// The text: `data` when given (an unreadable file is an error), else README.md, docs/*.md and
/// the `.rs` files under runtime/, macros/ and examples/ of `root`, concatenated. No text at all
/// is an error.
pub fn load(root: &Path, data: Option<&Path>) -> Result<Vec<u8>> {
    let bytes = match data {
        Some(p) => std::fs::read(p).map_err(|e| corpus_err(format!("--data {}: {e}", p.display())))?,
        None => {
            let mut paths = vec![root.join("README.md")];
            files(&root.join("docs"), "md", &mut paths);
            for dir in ["runtime", "macros", "examples"] {
                files(&root.join(dir), "rs", &mut paths);
            }
            paths.iter().filter_map(|p| std::fs::read(p).ok()).flatten().collect()
        }
    };
    if bytes.is_empty() {
        let what = data.map_or(format!("no README.md, docs/ or sources under {}", root.display()), |p| {
            format!("{} is empty", p.display())
        });
        return Err(corpus_err(format!("{what}: run from the repository root or pass --data FILE")));
    }
    Ok(bytes)
}

/// Training (the first 90%) and validation (the rest) parts of a text.
pub struct Splits {
    pub train: Vec<u8>,
    pub val: Vec<u8>,
}

impl Splits {
    /// Splits `text`; each part must hold more than `context + 1` bytes.
    pub fn new(text: Vec<u8>, context: usize) -> Result<Splits> {
        let cut = text.len() * 9 / 10;
        let (train, val) = (text[..cut].to_vec(), text[cut..].to_vec());
        if val.len() <= context + 1 {
            return Err(corpus_err(format!(
                "{} bytes are too few for a context of {context} (need {})",
                text.len(),
                10 * (context + 2)
            )));
        }
        Ok(Splits { train, val })
    }
}

/// `batch` random windows of `context + 1` bytes of `part`: ids `[batch, context]` and the
/// next-byte labels `[batch · context]`.
pub fn batch(dev: &Device, part: &[u8], batch: usize, context: usize, rng: &mut Rng) -> Result<(Tensor, Tensor)> {
    let (mut ids, mut labels) = (Vec::with_capacity(batch * context), Vec::with_capacity(batch * context));
    for _ in 0..batch {
        let start = (rng.next_u64() % (part.len() - context) as u64) as usize;
        ids.extend(part[start..start + context].iter().map(|b| *b as f32));
        labels.extend(part[start + 1..start + context + 1].iter().map(|b| *b as f32));
    }
    Ok((Tensor::from_slice(dev, &ids, &[batch, context])?, Tensor::from_slice(dev, &labels, &[batch * context])?))
}

/// `n` batches of `batch / n` windows each (the same windows, in the same order, as one
/// batch of `batch` from the same `rng`): the microbatches of one step.
pub fn microbatches(
    dev: &Device,
    part: &[u8],
    batch: usize,
    n: usize,
    context: usize,
    rng: &mut Rng,
) -> Result<Vec<(Tensor, Tensor)>> {
    (0..n).map(|_| self::batch(dev, part, batch / n, context, rng)).collect()
}
