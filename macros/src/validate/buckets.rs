//! `buckets(axis = A, sizes = ..., pad(i = v), above_largest = eager)`: shape buckets over one
//! axis of the inputs. Refuses at compile time what `graphed::Buckets` would refuse when
//! `make_graphed` runs (no sizes, a zero size, a rule that lays out none) and what it cannot
//! say (a missing axis, an input padded twice), each on the token at fault.

use syn::spanned::Spanned;
use syn::{Expr, Lit, UnOp};

use super::options::{int_literal, ungroup};
use crate::ctxt::Ctxt;
use crate::model::{BucketSizes, Buckets};
use crate::parse::{self, list, Arg, BucketsArgs, SizeRule, SizesArg};

/// The values `above_largest = ...` accepts.
const ABOVE_LARGEST: &[&str] = &["error", "eager"];

/// The validated buckets, or `None` after recording every error.
pub(super) fn buckets(cx: &mut Ctxt, arg: &Arg<BucketsArgs>) -> Option<Buckets> {
    let args = &arg.value;
    let before = cx.error_count();
    let axis = match &args.axis {
        Some(axis) => non_negative(cx, &axis.value, "`axis` is the index of the input axis whose size varies"),
        None if args.unknown_key => None,
        None => {
            cx.error_spanned_by(
                &args.name,
                "`buckets` needs `axis = N`, the input axis whose size varies: `buckets(axis = 1, sizes = [128, 256, 512])`",
            );
            None
        }
    };
    let sizes = match &args.sizes {
        Some(sizes) => bucket_sizes(cx, &sizes.value),
        None if args.unknown_key => None,
        None => {
            cx.error_spanned_by(
                &args.name,
                "`buckets` needs its sizes: `sizes = [128, 256, 512]`, `sizes = powers_of_two(min = 8, max = 256)` or `sizes = step(by = 64, max = 1024)`",
            );
            None
        }
    };
    let pads = args.pad.as_ref().map_or_else(Vec::new, |pad| pads(cx, pad));
    let eager_above = args.above_largest.as_ref().is_some_and(|above| {
        if !ABOVE_LARGEST.iter().any(|value| above.value == value) {
            cx.error_spanned_by(
                &above.value,
                format_args!(
                    "`above_largest` says what a call larger than the largest bucket does: one of {} (`error`, the default, refuses it; `eager` runs it without graphs)",
                    list(ABOVE_LARGEST)
                ),
            );
        }
        above.value == "eager"
    });
    if cx.error_count() > before {
        return None;
    }
    Some(Buckets { axis: axis?, sizes: sizes?, pads, eager_above })
}

/// A non-negative integer literal, or an error saying `what` it is.
fn non_negative(cx: &mut Ctxt, expr: &Expr, what: &str) -> Option<usize> {
    match int_literal(expr) {
        Some(Ok(value)) if value >= 0 => match usize::try_from(value) {
            Ok(value) => Some(value),
            Err(_) => {
                cx.error_spanned_by(expr, format_args!("{what}; {value} is too large"));
                None
            }
        },
        Some(Ok(value)) => {
            cx.error_spanned_by(expr, format_args!("{what}, from 0; not {value}"));
            None
        }
        Some(Err(error)) => {
            cx.error_spanned_by(expr, format_args!("{what}; {error}"));
            None
        }
        None => {
            cx.error_spanned_by(expr, format_args!("{what}, an integer literal"));
            None
        }
    }
}

/// A bucket size (or a rule's argument): a positive integer literal.
fn positive(cx: &mut Ctxt, expr: &Expr, what: &str) -> Option<usize> {
    let value = non_negative(cx, expr, what)?;
    if value == 0 {
        cx.error_spanned_by(expr, format_args!("{what}, and 0 is not a size"));
        return None;
    }
    Some(value)
}

fn bucket_sizes(cx: &mut Ctxt, sizes: &SizesArg) -> Option<BucketSizes> {
    match sizes {
        SizesArg::List { bracket_span, entries } => {
            if entries.is_empty() {
                cx.error_at(
                    *bracket_span,
                    "`sizes` lists no bucket: give at least one size, `sizes = [128, 256, 512]`",
                );
                return None;
            }
            let before = cx.error_count();
            let sizes: Vec<usize> = entries
                .iter()
                .filter_map(|entry| positive(cx, entry, "a bucket size is a positive integer literal"))
                .collect();
            (cx.error_count() == before).then_some(BucketSizes::List(sizes))
        }
        SizesArg::Rule(rule) => size_rule(cx, rule),
    }
}

/// `powers_of_two(min, max)` or `step(by, max)`: both arguments, positive, the first at most
/// the second (the runtime lays out no sizes otherwise).
fn size_rule(cx: &mut Ctxt, rule: &SizeRule) -> Option<BucketSizes> {
    let name = &rule.name;
    let first_key = rule.first_key();
    let mut argument = |arg: &Option<parse::Arg<Expr>>, key: &str| match arg {
        Some(arg) => positive(cx, &arg.value, &format!("`{key}` is a positive integer literal")),
        None if rule.unknown_key => None,
        None => {
            cx.error_spanned_by(
                name,
                format_args!(
                    "`{name}` needs `{first_key} = N` and `max = N`: `sizes = {name}({first_key} = {}, max = 1024)`",
                    if first_key == "by" { 64 } else { 8 }
                ),
            );
            None
        }
    };
    let first = argument(&rule.first, first_key);
    let max = argument(&rule.max, "max");
    let (first, max) = (first?, max?);
    if first > max {
        let span = rule.first.as_ref().map_or(name.span(), |arg| arg.value.span());
        cx.error_at(
            span,
            format_args!(
                "`{first_key} = {first}` is above `max = {max}`: `{name}` lays out no sizes from {first} up to {max}"
            ),
        );
        return None;
    }
    Some(if name == "step" {
        BucketSizes::Step { by: first, max }
    } else {
        BucketSizes::PowersOfTwo { min: first, max }
    })
}

/// `pad(i = v, ...)`: each input once, each value a number literal.
fn pads(cx: &mut Ctxt, pad: &Arg<Vec<parse::PadEntry>>) -> Vec<(usize, f32)> {
    if pad.value.is_empty() {
        cx.error_spanned_by(&pad.key, "`pad` lists no input: `pad(1 = -100.0)` pads input 1 with -100.0");
    }
    let mut pads: Vec<(usize, f32)> = Vec::new();
    for entry in &pad.value {
        let input = non_negative(cx, &entry.input, "`pad` takes an input's index (from 0) before `=`");
        let value = match number_literal(&entry.value) {
            Some(value) if value.is_finite() => Some(value),
            _ => {
                cx.error_spanned_by(
                    &entry.value,
                    "the value an input is padded with is a number literal: `pad(1 = -100.0)` or `pad(1 = -100)`",
                );
                None
            }
        };
        if let Some(input) = input {
            if pads.iter().any(|(seen, _)| *seen == input) {
                cx.error_spanned_by(
                    &entry.input,
                    format_args!("input {input} is padded twice: keep one `{input} = ...`"),
                );
                continue;
            }
            if let Some(value) = value {
                pads.push((input, value));
            }
        }
    }
    pads
}

/// A float or integer literal, with or without a leading minus, as an `f32`.
fn number_literal(expr: &Expr) -> Option<f32> {
    let unsigned = |expr: &Expr| match ungroup(expr) {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Float(float) => float.base10_parse::<f32>().ok(),
            Lit::Int(int) => int.base10_parse::<f32>().ok(),
            _ => None,
        },
        _ => None,
    };
    match ungroup(expr) {
        Expr::Unary(unary) if matches!(unary.op, UnOp::Neg(_)) => unsigned(&unary.expr).map(|value| -value),
        other => unsigned(other),
    }
}
