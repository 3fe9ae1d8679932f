//! `order = [...]` against the chunks: every entry a chunk number, every backward after its
//! forward, the length a multiple of 2 x chunks, every chunk balanced. Each error is spanned on
//! the entry at fault where there is one.

use syn::Expr;

use super::options::int_literal;
use crate::ctxt::Ctxt;
use crate::model::Chunk;
use crate::parse;

/// Validates a schedule against the chunks; returns it with its number of microbatches.
pub(super) fn order(cx: &mut Ctxt, list: &parse::OrderList, chunks: &[Chunk]) -> Option<(Vec<i32>, usize)> {
    let before = cx.error_count();
    let names = chunks.iter().map(|chunk| format!("`{}`", chunk.name)).collect::<Vec<_>>().join(", ");
    // First every entry on its own: a number naming a chunk. Counting is only meaningful
    // once all of them are.
    let entries = entries(cx, list, chunks.len(), &names);
    if entries.len() != list.entries.len() || !fifo(cx, &entries, chunks) {
        return None;
    }
    let microbatches = microbatches(cx, list, entries.len(), chunks.len())?;
    balanced(cx, list, &entries, chunks, microbatches);
    if cx.error_count() > before {
        return None;
    }
    Some((entries.into_iter().map(|(value, _)| value).collect(), microbatches))
}

/// The entries that are chunk numbers in range, with their expressions.
fn entries<'a>(cx: &mut Ctxt, list: &'a parse::OrderList, num_chunks: usize, names: &str) -> Vec<(i32, &'a Expr)> {
    let mut entries: Vec<(i32, &Expr)> = Vec::new();
    for expr in &list.entries {
        let value = match int_literal(expr) {
            Some(Ok(value)) => value,
            Some(Err(error)) => {
                cx.error_spanned_by(expr, error);
                continue;
            }
            None => {
                cx.error_spanned_by(
                    expr,
                    "an `order` entry is a chunk number: `c` runs the forward of chunk c, `-c` its backward",
                );
                continue;
            }
        };
        if value == 0 {
            cx.error_spanned_by(
                expr,
                format_args!("chunks are numbered from 1 (in field order: {names}); 0 is not a chunk"),
            );
            continue;
        }
        match i32::try_from(value) {
            Ok(value) if value.unsigned_abs() as usize <= num_chunks => entries.push((value, expr)),
            _ => cx.error_spanned_by(
                expr,
                format_args!(
                    "chunk {} is out of range: this struct has {num_chunks} chunk{} ({names}), numbered from 1",
                    value.unsigned_abs(),
                    if num_chunks == 1 { "" } else { "s" }
                ),
            ),
        }
    }
    entries
}

/// A backward needs an outstanding forward of its chunk.
fn fifo(cx: &mut Ctxt, entries: &[(i32, &Expr)], chunks: &[Chunk]) -> bool {
    let num_chunks = chunks.len();
    let mut forwards = vec![0usize; num_chunks];
    let mut backwards = vec![0usize; num_chunks];
    let mut ok = true;
    for (value, expr) in entries {
        let chunk = value.unsigned_abs() as usize;
        let index = chunk - 1;
        if *value > 0 {
            forwards[index] += 1;
        } else {
            if backwards[index] >= forwards[index] {
                cx.error_spanned_by(
                    expr,
                    format_args!(
                        "backward of chunk {chunk} (`{}`) before its forward: `-{chunk}` runs the backward of the oldest microbatch whose forward has run, and none is outstanding here",
                        chunks[index].name
                    ),
                );
                ok = false;
            }
            backwards[index] += 1;
        }
    }
    ok
}

/// The number of microbatches the length gives: 2 x chunks x M entries.
fn microbatches(cx: &mut Ctxt, list: &parse::OrderList, len: usize, num_chunks: usize) -> Option<usize> {
    let per_microbatch = 2 * num_chunks;
    if len == 0 || len % per_microbatch != 0 {
        cx.error_at(
            list.bracket_span,
            format_args!(
                "`order` has {len} entr{}, but with {num_chunks} chunk{} it needs 2 x {num_chunks} x M entries for M microbatches ({}, {}, ...): each chunk's forward and backward once per microbatch",
                if len == 1 { "y" } else { "ies" },
                if num_chunks == 1 { "" } else { "s" },
                per_microbatch,
                2 * per_microbatch
            ),
        );
        return None;
    }
    Some(len / per_microbatch)
}

/// Each chunk has exactly `microbatches` forwards and backwards.
fn balanced(cx: &mut Ctxt, list: &parse::OrderList, entries: &[(i32, &Expr)], chunks: &[Chunk], microbatches: usize) {
    let (len, num_chunks) = (entries.len(), chunks.len());
    let count = |index: usize, forward: bool| {
        entries
            .iter()
            .filter(|(value, _)| value.unsigned_abs() as usize == index + 1 && (*value > 0) == forward)
            .count()
    };
    for (index, chunk) in chunks.iter().enumerate() {
        let (f, b) = (count(index, true), count(index, false));
        if f == microbatches && b == microbatches {
            continue;
        }
        let number = index + 1;
        let message = format!(
            "unbalanced `order`: chunk {number} (`{}`) has {f} forward{} and {b} backward{}, but with {microbatches} microbatch{} ({len} entries, {num_chunks} chunks) each chunk needs {microbatches} of each",
            chunk.name,
            if f == 1 { "" } else { "s" },
            if b == 1 { "" } else { "s" },
            if microbatches == 1 { "" } else { "es" },
        );
        // Point at the first entry of this chunk past what it may have, else at the list.
        let excess = entries
            .iter()
            .filter(|(value, _)| value.unsigned_abs() as usize == number && (*value > 0) == (f > microbatches))
            .nth(microbatches);
        match excess {
            Some((_, expr)) if f > microbatches || b > microbatches => cx.error_spanned_by(expr, message),
            _ => cx.error_at(list.bracket_span, message),
        }
    }
}
