//! The shapes `forward`, `backward` and hooks must have, checked with one error per problem.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ReceiverKind, ReturnType, Signature, Type};

use crate::ctxt::Ctxt;
use crate::model::{Returned, Slot, TensorArg};

use super::types::*;

/// Rejects what the generated glue cannot call: generics, `async`, `const`, variadics.
pub(super) fn plain_fn(cx: &mut Ctxt, sig: &Signature, what: &str) -> bool {
    let mut ok = true;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        cx.error_spanned_by(&sig.generics, format_args!("{what} cannot be generic (write lifetimes elided)"));
        ok = false;
    }
    if let Some(asyncness) = &sig.asyncness {
        cx.error_spanned_by(asyncness, format_args!("{what} cannot be `async`"));
        ok = false;
    }
    if let Some(variadic) = &sig.variadic {
        cx.error_spanned_by(variadic, format_args!("{what} cannot be variadic"));
        ok = false;
    }
    ok
}

/// The receiver of a method, with the span to point at when it is wrong.
pub(super) enum Receiver {
    Shared,
    Mutable,
    Other(Span),
    Missing,
}

pub(super) fn receiver(sig: &Signature) -> Receiver {
    match sig.inputs.first() {
        Some(FnArg::Receiver(receiver)) => match &receiver.kind {
            ReceiverKind::Reference(_, _, None) => Receiver::Shared,
            ReceiverKind::Reference(_, _, Some(_)) => Receiver::Mutable,
            _ => Receiver::Other(receiver.span()),
        },
        _ => Receiver::Missing,
    }
}

pub(super) struct ForwardSig {
    pub(super) inputs: Vec<TensorArg>,
    pub(super) outputs: Returned,
}

/// The typed arguments after the receiver: the context, then the rest.
pub(super) fn cx_and_rest<'a>(
    cx: &mut Ctxt,
    sig: &'a Signature,
    what: &str,
) -> Option<(Ident, Type, Vec<&'a syn::PatType>)> {
    let mut typed = sig.inputs.iter().filter_map(|arg| match arg {
        FnArg::Typed(typed) => Some(typed),
        FnArg::Receiver(_) => None,
    });
    let Some(first) = typed.next() else {
        cx.error_spanned_by(&sig.ident, format_args!("{what} takes the context first: `cx: &mut Cx`"));
        return None;
    };
    if !matches!(ungroup_ty(&first.ty), Type::Reference(reference) if reference.mutability.is_some()) {
        cx.error_spanned_by(&first.ty, format_args!("{what} takes the context first: `cx: &mut Cx`"));
        return None;
    }
    let name = pat_name(&first.pat).unwrap_or_else(|| Ident::new("cx", Span::call_site()));
    Some((name, (*first.ty).clone(), typed.collect()))
}

/// The `T` of `-> Result<T>`, or an error on the return type.
pub(super) fn result_ok<'a>(cx: &mut Ctxt, sig: &'a Signature, what: &str, expected: &str) -> Option<&'a Type> {
    match &sig.output {
        ReturnType::Type(_, ty) => {
            let ok = generic_of(ty, "Result", false);
            if ok.is_none() {
                cx.error_spanned_by(ty, format_args!("{what} returns `Result<{expected}>`"));
            }
            ok
        }
        ReturnType::Default => {
            cx.error_spanned_by(&sig.ident, format_args!("{what} returns `Result<{expected}>`"));
            None
        }
    }
}

/// `Tensor`, `Option<Tensor>`, or a tuple of them; errors on each offending element.
pub(super) fn returned(cx: &mut Ctxt, ty: &Type, what: &str) -> Option<Returned> {
    let message = format!("{what} is `Tensor`, `Option<Tensor>` or a tuple of them");
    if let Some(slot) = tensor_slot(ty) {
        return Some(Returned { slots: vec![slot], tuple: false, ty: ty.clone() });
    }
    let Type::Tuple(tuple) = ungroup_ty(ty) else {
        cx.error_spanned_by(ty, message);
        return None;
    };
    let mut slots = Vec::new();
    let mut ok = true;
    for elem in &tuple.elems {
        match tensor_slot(elem) {
            Some(slot) => slots.push(slot),
            None => {
                cx.error_spanned_by(elem, &message);
                ok = false;
            }
        }
    }
    ok.then(|| Returned { slots, tuple: true, ty: ty.clone() })
}

pub(super) fn forward_signature(cx: &mut Ctxt, sig: &Signature) -> Option<ForwardSig> {
    let mut ok = plain_fn(cx, sig, "a graphed `forward`");
    match receiver(sig) {
        Receiver::Shared => {}
        Receiver::Mutable | Receiver::Other(_) => {
            cx.error_spanned_by(
                sig.inputs.first(),
                "a graphed `forward` takes `&self`: several microbatches may be in flight before their backwards, so keep per-call state in `cx`",
            );
            ok = false;
        }
        Receiver::Missing => {
            cx.error_spanned_by(&sig.ident, "a graphed `forward` is a method taking `&self`");
            ok = false;
        }
    }
    let (_, _, rest) = cx_and_rest(cx, sig, "a graphed `forward`")?;
    let mut inputs = Vec::new();
    for (index, arg) in rest.into_iter().enumerate() {
        match tensor_ref_slot(&arg.ty) {
            Some(slot) => inputs.push(TensorArg {
                name: pat_name(&arg.pat).unwrap_or_else(|| quote::format_ident!("input_{}", index)),
                slot,
                ty: (*arg.ty).clone(),
            }),
            None => {
                cx.error_spanned_by(
                    &arg.ty,
                    "non-tensor forward arguments are not supported: after `cx`, a graphed `forward` takes only `&Tensor` or `Option<&Tensor>` (graphs replay on fixed tensor inputs; keep other values in the module's fields)",
                );
                ok = false;
            }
        }
    }
    let out =
        result_ok(cx, sig, "a graphed `forward`", "Tensor>`, `Result<Option<Tensor>>` or `Result<(Tensor, ...)>")?;
    let outputs = returned(cx, out, "a forward output")?;
    if outputs.slots.is_empty() {
        cx.error_spanned_by(out, "a graphed `forward` returns at least one tensor");
        ok = false;
    }
    ok.then_some(ForwardSig { inputs, outputs })
}

pub(super) struct BackwardSig<'a> {
    pub(super) args: Vec<&'a syn::PatType>,
    pub(super) ret: &'a Type,
}

pub(super) fn backward_signature<'a>(cx: &mut Ctxt, sig: &'a Signature) -> Option<BackwardSig<'a>> {
    let mut ok = plain_fn(cx, sig, "a graphed `backward`");
    match receiver(sig) {
        Receiver::Shared | Receiver::Mutable => {}
        Receiver::Other(span) => {
            cx.error_at(span, "a graphed `backward` takes `&mut self` (it accumulates parameter grads)");
            ok = false;
        }
        Receiver::Missing => {
            cx.error_spanned_by(&sig.ident, "a graphed `backward` is a method taking `&mut self`");
            ok = false;
        }
    }
    let (_, _, args) = cx_and_rest(cx, sig, "a graphed `backward`")?;
    let ret = result_ok(
        cx,
        sig,
        "a graphed `backward`",
        "Option<Tensor>>` (one grad per forward input, a tuple for several",
    )?;
    ok.then_some(BackwardSig { args, ret })
}

/// One backward argument per forward output, `Option<&Tensor>` where the output is optional.
pub(super) fn check_grad_outputs(
    cx: &mut Ctxt,
    forward: &ForwardSig,
    args: Vec<&syn::PatType>,
    sig: Option<&Signature>,
) -> Vec<TensorArg> {
    let outputs = &forward.outputs.slots;
    if args.len() != outputs.len() {
        let message = format!(
            "a graphed `backward` takes one grad per forward output after `cx`: forward returns {} tensor{}, backward takes {}",
            outputs.len(),
            if outputs.len() == 1 { "" } else { "s" },
            args.len()
        );
        match (args.get(outputs.len()), sig) {
            (Some(extra), _) => cx.error_spanned_by(extra, message),
            (None, Some(sig)) => cx.error_at(sig.paren_token.span.join(), message),
            (None, None) => {}
        }
        return Vec::new();
    }
    let mut grads = Vec::new();
    for (index, (arg, output)) in args.into_iter().zip(outputs).enumerate() {
        match (tensor_ref_slot(&arg.ty), output) {
            (Some(Slot::Required), Slot::Optional) => cx.error_spanned_by(
                &arg.ty,
                format_args!("forward output {index} is an `Option<Tensor>`, so its grad is `Option<&Tensor>` (`None` when the output was `None`)"),
            ),
            (Some(slot), _) => grads.push(TensorArg {
                name: pat_name(&arg.pat).unwrap_or_else(|| quote::format_ident!("grad_{}", index)),
                slot,
                ty: (*arg.ty).clone(),
            }),
            (None, _) => cx.error_spanned_by(
                &arg.ty,
                "a graphed `backward` takes only grads after `cx`: `&Tensor`, or `Option<&Tensor>` for an optional output",
            ),
        }
    }
    grads
}

/// One grad per forward input: a single one for one input, a tuple for several.
pub(super) fn check_grad_inputs(cx: &mut Ctxt, forward: &ForwardSig, ret: &Type) -> Option<Returned> {
    let returned = returned(cx, ret, "a backward result (one grad per forward input)")?;
    let inputs = forward.inputs.len();
    if returned.slots.len() != inputs {
        cx.error_spanned_by(
            ret,
            format_args!(
                "a graphed `backward` returns one grad per forward input: forward takes {inputs} tensor{}, this returns {}{}",
                if inputs == 1 { "" } else { "s" },
                returned.slots.len(),
                if inputs > 1 { " (return a tuple of `Option<Tensor>`, `None` where no grad is needed)" } else { "" }
            ),
        );
        return None;
    }
    Some(returned)
}

/// A hook is `fn name(&mut self)` returning `()` or `Result<()>`.
pub(super) fn hook_signature(cx: &mut Ctxt, sig: &Signature) -> bool {
    let mut ok = plain_fn(cx, sig, "a capture-time hook");
    match receiver(sig) {
        Receiver::Mutable => {}
        Receiver::Shared | Receiver::Other(_) => {
            cx.error_spanned_by(
                sig.inputs.first(),
                "a capture-time hook takes `&mut self`: `fn name(&mut self)` returning `()` or `Result<()>`",
            );
            ok = false;
        }
        Receiver::Missing => {
            cx.error_spanned_by(
                &sig.ident,
                "a capture-time hook is a method: `fn name(&mut self)` returning `()` or `Result<()>`",
            );
            ok = false;
        }
    }
    let extra: Vec<&FnArg> = sig.inputs.iter().filter(|arg| matches!(arg, FnArg::Typed(_))).collect();
    if let Some(first) = extra.first() {
        cx.error_spanned_by(
            first,
            "a capture-time hook takes no arguments besides `&mut self` (the runtime calls it with nothing else)",
        );
        ok = false;
    }
    if let ReturnType::Type(_, ty) = &sig.output {
        let unit = |ty: &Type| matches!(ungroup_ty(ty), Type::Tuple(tuple) if tuple.elems.is_empty());
        let is_result_unit = generic_of(ty, "Result", false).is_some_and(unit);
        if !unit(ty) && !is_result_unit {
            cx.error_spanned_by(
                ty,
                "a capture-time hook returns `()` or `Result<()>`, not a value: it runs outside the graphs and nothing receives what it returns",
            );
            ok = false;
        }
    }
    ok
}
