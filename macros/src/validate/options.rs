//! The attribute's options: `warmup`, `buckets` (checked in `buckets`), `allow_unused_input`,
//! `crate`.

use syn::{Expr, Lit, UnOp};

use crate::ctxt::Ctxt;
use crate::model::{Options, DEFAULT_WARMUP};
use crate::parse::GraphedArgs;

/// The runtime's path: the `crate = "..."` override when it parses, else `::graphed`.
pub(crate) fn krate_path(args: &GraphedArgs) -> syn::Path {
    args.krate
        .as_ref()
        .and_then(|arg| arg.value.parse::<syn::Path>().ok())
        .unwrap_or_else(|| syn::parse_quote!(::graphed))
}

/// Validates the keys both forms share.
pub(super) fn options(cx: &mut Ctxt, args: &GraphedArgs) -> Options {
    let warmup = args.warmup.as_ref().and_then(|arg| warmup(cx, &arg.value)).unwrap_or(DEFAULT_WARMUP);
    let buckets = args.buckets.as_ref().and_then(|arg| super::buckets::buckets(cx, arg));
    let allow_unused_input = args.allow_unused_input.as_ref().is_some_and(|arg| arg.value);
    let krate = match &args.krate {
        Some(arg) => match arg.value.parse::<syn::Path>() {
            Ok(path) => path,
            Err(_) => {
                cx.error_spanned_by(
                    &arg.value,
                    "`crate` is the path of the graphed runtime crate, for example `crate = \"graphed\"`",
                );
                syn::parse_quote!(::graphed)
            }
        },
        None => syn::parse_quote!(::graphed),
    };
    Options { warmup, allow_unused_input, buckets, krate }
}

/// Strips invisible groups that `macro_rules!` transcription leaves around expressions.
pub(super) fn ungroup(mut expr: &Expr) -> &Expr {
    while let Expr::Group(group) = expr {
        expr = &group.expr;
    }
    expr
}

/// An integer literal, with or without a leading minus (syn reads `-2` in an expression as
/// negation of `2`; a literal token made by a macro may also carry the minus itself).
pub(super) fn int_literal(expr: &Expr) -> Option<syn::Result<i64>> {
    match ungroup(expr) {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(int) => Some(int.base10_parse::<i64>()),
            _ => None,
        },
        Expr::Unary(unary) if matches!(unary.op, UnOp::Neg(_)) => match ungroup(&unary.expr) {
            Expr::Lit(lit) => match &lit.lit {
                Lit::Int(int) => Some(int.base10_parse::<i64>().map(|value| -value)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn warmup(cx: &mut Ctxt, expr: &Expr) -> Option<usize> {
    const WHAT: &str = "`warmup` is the number of eager iterations before capture, a positive integer";
    match int_literal(expr) {
        Some(Ok(value)) if value > 0 => match usize::try_from(value) {
            Ok(value) => Some(value),
            Err(_) => {
                cx.error_spanned_by(expr, format_args!("{WHAT}; {value} is too large"));
                None
            }
        },
        Some(Ok(value)) => {
            cx.error_spanned_by(expr, format_args!("{WHAT}, not {value}"));
            None
        }
        Some(Err(error)) => {
            cx.error_spanned_by(expr, format_args!("{WHAT}; {error}"));
            None
        }
        None => {
            cx.error_spanned_by(expr, format_args!("{WHAT} literal such as `warmup = 3`"));
            None
        }
    }
}
