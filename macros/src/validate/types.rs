//! Recognising tensor types, names and paths in the user's signatures.

use syn::{GenericArgument, Ident, Pat, PathArguments, Type};

use crate::model::Slot;

/// The last identifier of a plain path type (`Block`, `crate::layers::Block`).
pub(super) fn type_ident(ty: &Type) -> Option<Ident> {
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            let last = path.path.segments.last()?;
            matches!(last.arguments, PathArguments::None).then(|| last.ident.clone())
        }
        Type::Group(group) => type_ident(&group.elem),
        Type::Paren(paren) => type_ident(&paren.elem),
        _ => None,
    }
}

pub(super) fn ungroup_ty(mut ty: &Type) -> &Type {
    loop {
        match ty {
            Type::Group(group) => ty = &group.elem,
            Type::Paren(paren) => ty = &paren.elem,
            _ => return ty,
        }
    }
}

/// `Name<T>` (any path ending in `Name` with one type argument, possibly more after it):
/// returns `T`.
pub(super) fn generic_of<'a>(ty: &'a Type, name: &str, exactly_one: bool) -> Option<&'a Type> {
    let Type::Path(path) = ungroup_ty(ty) else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    if exactly_one && args.args.len() != 1 {
        return None;
    }
    match args.args.first()? {
        GenericArgument::Type(inner) => Some(inner),
        _ => None,
    }
}

/// `Tensor` (any path ending in it, without arguments).
pub(super) fn is_tensor(ty: &Type) -> bool {
    matches!(ungroup_ty(ty), Type::Path(path)
        if path.qself.is_none()
            && path.path.segments.last().is_some_and(|last| last.ident == "Tensor" && last.arguments.is_none()))
}

/// `&Tensor` (shared, any lifetime).
pub(super) fn is_tensor_ref(ty: &Type) -> bool {
    matches!(ungroup_ty(ty), Type::Reference(reference) if reference.mutability.is_none() && is_tensor(&reference.elem))
}

/// `&Tensor` → Required, `Option<&Tensor>` → Optional.
pub(super) fn tensor_ref_slot(ty: &Type) -> Option<Slot> {
    if is_tensor_ref(ty) {
        Some(Slot::Required)
    } else if generic_of(ty, "Option", true).is_some_and(is_tensor_ref) {
        Some(Slot::Optional)
    } else {
        None
    }
}

/// `Tensor` → Required, `Option<Tensor>` → Optional.
pub(super) fn tensor_slot(ty: &Type) -> Option<Slot> {
    if is_tensor(ty) {
        Some(Slot::Required)
    } else if generic_of(ty, "Option", true).is_some_and(is_tensor) {
        Some(Slot::Optional)
    } else {
        None
    }
}

/// The name of an argument pattern, when it is a plain name.
pub(super) fn pat_name(pat: &Pat) -> Option<Ident> {
    match pat {
        Pat::Ident(ident) if ident.subpat.is_none() && ident.by_ref.is_none() => Some(ident.ident.clone()),
        _ => None,
    }
}
