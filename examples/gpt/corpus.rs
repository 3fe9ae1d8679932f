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
/// next-byte labels `[batch, context]`.
pub fn batch(dev: &Device, part: &[u8], batch: usize, context: usize, rng: &mut Rng) -> Result<(Tensor, Tensor)> {
    let (mut ids, mut labels) = (Vec::with_capacity(batch * context), Vec::with_capacity(batch * context));
    for _ in 0..batch {
        let start = (rng.next_u64() % (part.len() - context) as u64) as usize;
        ids.extend(part[start..start + context].iter().map(|b| *b as f32));
        labels.extend(part[start + 1..start + context + 1].iter().map(|b| *b as f32));
    }
    Ok((Tensor::from_slice(dev, &ids, &[batch, context])?, Tensor::from_slice(dev, &labels, &[batch, context])?))
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

/// A batch of rows of different lengths, padded by the loader to its longest row.
pub struct Ragged {
    /// Ids `[batch, longest]`: byte 0 after a row's end.
    pub ids: Tensor,
    /// Next-byte labels `[batch, longest]`: `ops::IGNORE_LABEL` after a row's end.
    pub labels: Tensor,
    /// The real tokens (the labels not ignored).
    pub tokens: usize,
}

/// `batch` rows of `part` cut at line boundaries, as documents of different lengths are: a
/// length is drawn for the step (log-uniform between `min` and `context`), each row starts at a
/// line and ends after the last newline within that length (or at the length, for a longer
/// line). Rows shorter than the longest are padded here (ids 0, ignored labels); the graphed
/// model pads the batch further, up to its sequence bucket.
pub fn ragged_batch(
    dev: &Device,
    part: &[u8],
    batch: usize,
    context: usize,
    min: usize,
    rng: &mut Rng,
) -> Result<Ragged> {
    let (lo, hi) = ((min.clamp(2, context)) as f64, context as f64);
    let len = ((lo.ln() + rng.uniform() * (hi.ln() - lo.ln())).exp().round() as usize).clamp(2, context);
    let mut rows = Vec::with_capacity(batch);
    for _ in 0..batch {
        let mut start = (rng.next_u64() % (part.len() - len - 1) as u64) as usize;
        // Start at the beginning of a line (the next one), where there is room.
        if let Some(nl) = part[start..part.len() - len - 1].iter().position(|b| *b == b'\n') {
            start += nl + 1;
        }
        let window = &part[start..start + len + 1];
        // End after the last newline of the window, unless that leaves less than half of it.
        let end = window[..len].iter().rposition(|b| *b == b'\n').map_or(len, |p| p + 1);
        rows.push(&part[start..start + if end >= len / 2 { end } else { len } + 1]);
    }
    let longest = rows.iter().map(|r| r.len() - 1).max().unwrap_or(1);
    let (mut ids, mut labels) = (vec![0.0; batch * longest], vec![graphed::ops::IGNORE_LABEL; batch * longest]);
    let mut tokens = 0;
    for (b, row) in rows.iter().enumerate() {
        let n = row.len() - 1;
        for t in 0..n {
            ids[b * longest + t] = row[t] as f32;
            labels[b * longest + t] = row[t + 1] as f32;
        }
        tokens += n;
    }
    Ok(Ragged {
        ids: Tensor::from_slice(dev, &ids, &[batch, longest])?,
        labels: Tensor::from_slice(dev, &labels, &[batch, longest])?,
        tokens,
    })
}
