//! The fields of a `#[graphed]` struct: each one chunk (`field: M`) or a stack of them
//! (`field: [M; N]`, `field: Vec<M>`), with its `#[graphed(checkpoint...)]` attribute.

use syn::spanned::Spanned;
use syn::Type;

use super::options::{int_literal, ungroup};
use super::types::{generic_of, ungroup_ty};
use crate::ctxt::Ctxt;
use crate::model::{Checkpointing, Field, Stack};
use crate::parse::{self, FieldArgs};

/// How a field's type counts chunks, and its module type.
fn stack(cx: &mut Ctxt, field: &syn::Field, name: &syn::Ident) -> (Stack, Type) {
    if let Type::Array(array) = ungroup_ty(&field.ty) {
        let len = match int_literal(&array.len) {
            Some(Ok(0)) => {
                cx.error_spanned_by(
                    &array.len,
                    format_args!(
                        "the stack `{name}` is empty: a stack holds at least one layer (remove the field, or give it a length from 1)"
                    ),
                );
                None
            }
            Some(Ok(n)) => match usize::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    cx.error_spanned_by(&array.len, "a stack's length is a positive integer");
                    None
                }
            },
            Some(Err(error)) => {
                cx.syn_error(syn::Error::new(array.len.span(), error));
                None
            }
            // A constant: a fixed length the macro cannot read; counted at construction.
            None => None,
        };
        let len_expr = ungroup(&array.len).clone();
        return (Stack::Array { len_expr, len }, (*array.elem).clone());
    }
    match generic_of(&field.ty, "Vec", true) {
        Some(elem) => (Stack::Vec, elem.clone()),
        None => (Stack::Single, field.ty.clone()),
    }
}

/// The field's checkpointing from its attribute.
fn checkpointing(cx: &mut Ctxt, args: &FieldArgs, stack: &Stack, name: &syn::Ident) -> Checkpointing {
    if let (Some(flag), Some(every)) = (&args.checkpoint, &args.checkpoint_every) {
        cx.error_spanned_by(
            &every.key,
            format_args!("`{}` and `checkpoint_every` both say which layers of `{name}` recompute: keep one", flag.key),
        );
        return Checkpointing::None;
    }
    if let Some(every) = &args.checkpoint_every {
        if matches!(stack, Stack::Single) {
            cx.error_spanned_by(
                &every.key,
                format_args!(
                    "`checkpoint_every` is for a stack (`[M; N]` or `Vec<M>`), and `{name}` is one chunk: use `#[graphed(checkpoint)]`"
                ),
            );
            return Checkpointing::None;
        }
        const WHAT: &str =
            "`checkpoint_every = k` checkpoints layers k, 2k, 3k, ... of the stack (1-indexed); k is a positive integer";
        return match int_literal(&every.value) {
            Some(Ok(k)) if k > 0 => match usize::try_from(k) {
                Ok(k) => Checkpointing::Every(k),
                Err(_) => {
                    cx.error_spanned_by(&every.value, WHAT);
                    Checkpointing::None
                }
            },
            _ => {
                cx.error_spanned_by(&every.value, WHAT);
                Checkpointing::None
            }
        };
    }
    match &args.checkpoint {
        Some(flag) if flag.value => Checkpointing::Every(1),
        _ => Checkpointing::None,
    }
}

/// The fields as chunks (errors for bad stacks and attributes).
pub(super) fn fields(cx: &mut Ctxt, fields: &[&syn::Field]) -> Vec<Field> {
    let mut out = Vec::new();
    for field in fields {
        let Some(name) = field.ident.clone() else { continue };
        let args = parse::field_args(cx, &field.attrs);
        let (stack, module) = stack(cx, field, &name);
        let checkpoint = checkpointing(cx, &args, &stack, &name);
        out.push(Field { name, ty: field.ty.clone(), module, stack, checkpoint });
    }
    out
}
