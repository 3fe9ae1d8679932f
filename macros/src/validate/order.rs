//! `order = [...]` against the chunks: every entry a chunk number (`c`, `-c`) or a weight-grad
//! entry (`w(c)`), every backward after its forward and every `w(c)` after its backward, 2 x
//! chunks x M forward and backward entries, every chunk balanced, and the data flow between
//! neighbouring chunks kept (chunk c + 1's forward of a microbatch after chunk c's, chunk c's
//! backward after chunk c + 1's). Each error is spanned on the entry at fault where there is
//! one. `windowed(microbatches = M, in_flight = K)` is laid out here for a fixed layout.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::Expr;

use super::options::{int_literal, ungroup};
use crate::ctxt::Ctxt;
use crate::model::{Entry, Pass};
use crate::parse;

/// A chunk as messages name it: `` `blocks[2]` `` for a stack's layer.
pub(super) struct ChunkName(pub(super) String);

/// What an entry that is not a chunk number should look like.
const ENTRY_FORMS: &str =
    "an `order` entry is a chunk number: `c` runs the forward of chunk c, `-c` its backward, `w(c)` its weight grads";

/// Validates a schedule against the chunks; returns it with its number of microbatches.
pub(super) fn order(cx: &mut Ctxt, list: &parse::OrderList, chunks: &[ChunkName]) -> Option<(Vec<Entry>, usize)> {
    let before = cx.error_count();
    let names = chunk_list(chunks);
    // First every entry on its own: a number naming a chunk. Counting is only meaningful
    // once all of them are.
    let entries = entries(cx, list, chunks.len(), &names);
    if entries.len() != list.entries.len() || !fifo(cx, &entries, chunks) {
        return None;
    }
    let microbatches = microbatches(cx, list, &entries, chunks.len())?;
    balanced(cx, list, &entries, chunks, microbatches);
    if cx.error_count() > before {
        return None;
    }
    data_flow(cx, &entries, chunks);
    if cx.error_count() > before {
        return None;
    }
    Some((entries.into_iter().map(|(entry, _)| entry).collect(), microbatches))
}

/// "`a`, `blocks[0]`, `blocks[1]`" for messages (a long stack abbreviated).
fn chunk_list(chunks: &[ChunkName]) -> String {
    let names: Vec<&str> = chunks.iter().map(|chunk| chunk.0.as_str()).collect();
    if names.len() <= 8 {
        return names.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ");
    }
    let (head, tail) = (&names[..3], &names[names.len() - 2..]);
    let head = head.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ");
    let tail = tail.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ");
    format!("{head}, ..., {tail}")
}

/// A struct's chunks form a pipeline: chunk c + 1 reads chunk c's output of the same
/// microbatch, and chunk c's backward reads chunk c + 1's input grad. An order that runs a
/// step before the step it reads from is refused (following the schedule would need a grad or
/// an output nobody has computed yet).
fn data_flow(cx: &mut Ctxt, entries: &[(Entry, &Expr)], chunks: &[ChunkName]) {
    let n = chunks.len();
    let (mut fwd, mut bwd) = (vec![0usize; n], vec![0usize; n]);
    for (entry, expr) in entries {
        let (c, index) = (entry.chunk, entry.chunk - 1);
        let name = &chunks[index].0;
        match entry.pass {
            Pass::Forward => {
                let m = fwd[index];
                if index > 0 && fwd[index - 1] <= m {
                    let prev = &chunks[index - 1].0;
                    cx.error_spanned_by(
                        expr,
                        format_args!(
                            "`{c}` breaks the data flow: the forward of chunk {c} (`{name}`) for microbatch {} reads chunk {} (`{prev}`)'s output for it, so `{}` must come first",
                            m + 1,
                            c - 1,
                            c - 1
                        ),
                    );
                }
                fwd[index] += 1;
            }
            Pass::Backward => {
                let m = bwd[index];
                if index + 1 < n && bwd[index + 1] <= m {
                    let next = &chunks[index + 1].0;
                    cx.error_spanned_by(
                        expr,
                        format_args!(
                            "`-{c}` breaks the data flow: the backward of chunk {c} (`{name}`) for microbatch {} needs the grad of its output, which chunk {} (`{next}`)'s backward for that microbatch computes, so `-{}` must come first",
                            m + 1,
                            c + 1,
                            c + 1
                        ),
                    );
                }
                bwd[index] += 1;
            }
            Pass::Wgrad => {}
        }
    }
}

/// `windowed(M, K)` over `chunks` chunks: each microbatch's forwards through the chunks, and
/// once K microbatches are outstanding, the oldest one's backwards (last chunk first); the rest
/// at the end (what `OrderEntry::windowed` lays out at run time).
pub(super) fn windowed(chunks: usize, microbatches: usize, in_flight: usize, span: Span) -> Vec<Entry> {
    let forwards = (1..=chunks).map(|chunk| Entry { pass: Pass::Forward, chunk, span });
    let backwards = (1..=chunks).rev().map(|chunk| Entry { pass: Pass::Backward, chunk, span });
    let mut order = Vec::with_capacity(2 * chunks * microbatches);
    let (mut outstanding, mut done) = (0, 0);
    for _ in 0..microbatches {
        if outstanding >= in_flight.max(1) {
            order.extend(backwards.clone());
            outstanding -= 1;
            done += 1;
        }
        order.extend(forwards.clone());
        outstanding += 1;
    }
    for _ in done..microbatches {
        order.extend(backwards.clone());
    }
    order
}

/// `w(c)`: the chunk expression, if `expr` is a call of `w` with one argument.
fn wgrad_arg(expr: &Expr) -> Option<&Expr> {
    let Expr::Call(call) = ungroup(expr) else { return None };
    let Expr::Path(func) = ungroup(&call.func) else { return None };
    (func.path.is_ident("w") && call.args.len() == 1).then(|| &call.args[0])
}

/// One entry as (pass, signed chunk number), or the message for what it is instead.
fn entry_value(expr: &Expr) -> Result<(Pass, i64), String> {
    if let Some(arg) = wgrad_arg(expr) {
        return match int_literal(arg) {
            Some(Ok(value)) if value > 0 => Ok((Pass::Wgrad, value)),
            Some(Ok(_)) => Err("`w(c)` takes a chunk number from 1: `w(2)` runs the weight grads of chunk 2".into()),
            Some(Err(error)) => Err(error.to_string()),
            None => Err(ENTRY_FORMS.into()),
        };
    }
    match int_literal(expr) {
        Some(Ok(value)) => Ok((if value < 0 { Pass::Backward } else { Pass::Forward }, value)),
        Some(Err(error)) => Err(error.to_string()),
        None => Err(ENTRY_FORMS.into()),
    }
}

/// The entries that name chunks in range, with their expressions.
fn entries<'a>(cx: &mut Ctxt, list: &'a parse::OrderList, num_chunks: usize, names: &str) -> Vec<(Entry, &'a Expr)> {
    let mut entries = Vec::new();
    for expr in &list.entries {
        let (pass, value) = match entry_value(expr) {
            Ok(parsed) => parsed,
            Err(message) => {
                cx.error_spanned_by(expr, message);
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
        match usize::try_from(value.unsigned_abs()) {
            Ok(chunk) if chunk <= num_chunks => entries.push((Entry { pass, chunk, span: expr.span() }, expr)),
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

/// A backward needs an outstanding forward of its chunk, a `w(c)` an outstanding backward.
fn fifo(cx: &mut Ctxt, entries: &[(Entry, &Expr)], chunks: &[ChunkName]) -> bool {
    // Per chunk: forwards, backwards and weight grads so far.
    let mut counts = vec![[0usize; 3]; chunks.len()];
    let mut ok = true;
    for (entry, expr) in entries {
        let (chunk, index) = (entry.chunk, entry.chunk - 1);
        let name = &chunks[index].0;
        let [forwards, backwards, wgrads] = counts[index];
        let message = match entry.pass {
            Pass::Backward if backwards >= forwards => Some(format!(
                "backward of chunk {chunk} (`{name}`) before its forward: `-{chunk}` runs the backward of the oldest microbatch whose forward has run, and none is outstanding here"
            )),
            Pass::Wgrad if wgrads >= backwards => Some(format!(
                "weight grads of chunk {chunk} (`{name}`) before its backward: `w({chunk})` runs the weight grads of the oldest microbatch whose backward (`-{chunk}`) has run, and none is outstanding here"
            )),
            _ => None,
        };
        if let Some(message) = message {
            cx.error_spanned_by(expr, message);
            ok = false;
        }
        counts[index][entry.pass as usize] += 1;
    }
    ok
}

/// The number of microbatches the forward and backward entries give: 2 x chunks x M.
fn microbatches(
    cx: &mut Ctxt,
    list: &parse::OrderList,
    entries: &[(Entry, &Expr)],
    num_chunks: usize,
) -> Option<usize> {
    let per_microbatch = 2 * num_chunks;
    let len = entries.iter().filter(|(entry, _)| entry.pass != Pass::Wgrad).count();
    let what = if len == entries.len() { "" } else { "forward and backward " };
    if len == 0 || len % per_microbatch != 0 {
        cx.error_at(
            list.bracket_span,
            format_args!(
                "`order` has {len} {what}entr{}, but with {num_chunks} chunk{} it needs 2 x {num_chunks} x M {what}entries for M microbatches ({}, {}, ...): each chunk's forward and backward once per microbatch (plus, for chunks that split their backward, M `w(c)` entries each)",
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

/// Each chunk has exactly `microbatches` forwards and backwards, and none or `microbatches`
/// weight-grad entries.
fn balanced(
    cx: &mut Ctxt,
    list: &parse::OrderList,
    entries: &[(Entry, &Expr)],
    chunks: &[ChunkName],
    microbatches: usize,
) {
    let (len, num_chunks) = (entries.len(), chunks.len());
    let s = |n: usize| if n == 1 { "" } else { "s" };
    for (index, chunk) in chunks.iter().enumerate() {
        let number = index + 1;
        let of = |pass: Pass| entries.iter().filter(move |(e, _)| e.chunk == number && e.pass == pass);
        let [f, b, w] = [Pass::Forward, Pass::Backward, Pass::Wgrad].map(|pass| of(pass).count());
        let wgrads_ok = w == 0 || w == microbatches;
        if f == microbatches && b == microbatches && wgrads_ok {
            continue;
        }
        let message = format!(
            "unbalanced `order`: chunk {number} (`{}`) has {f} forward{} and {b} backward{}{}, but with {microbatches} microbatch{} ({len} entries, {num_chunks} chunk{}) each chunk needs {microbatches} of each{}",
            chunk.0,
            s(f),
            s(b),
            if w > 0 { format!(" and {w} weight-grad entr{}", if w == 1 { "y" } else { "ies" }) } else { String::new() },
            if microbatches == 1 { "" } else { "es" },
            s(num_chunks),
            if w > 0 { format!(", and `w({number})` none or {microbatches} times") } else { String::new() },
        );
        // Point at the first entry of this chunk past what it may have, else at the list.
        let excess = [(Pass::Forward, f), (Pass::Backward, b), (Pass::Wgrad, w)]
            .into_iter()
            .find(|(_, n)| *n > microbatches)
            .and_then(|(pass, _)| of(pass).nth(microbatches));
        match excess {
            Some((_, expr)) => cx.error_spanned_by(expr, message),
            None => cx.error_at(list.bracket_span, message),
        }
    }
}
