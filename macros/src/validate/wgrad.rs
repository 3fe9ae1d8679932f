//! `fn backward_weights(&mut self, cx: &mut Cx) -> Result<()>`: the weight-grad half of a split
//! backward, recognised by name in a `#[graphed]` impl as `forward` and `backward` are.

use syn::{Signature, Type};

use super::signature::{cx_and_rest, plain_fn, receiver, result_ok, Receiver};
use super::types::ungroup_ty;
use crate::ctxt::Ctxt;

/// The name `#[graphed]` recognises.
pub(super) const METHOD: &str = "backward_weights";

/// Whether `sig` is a valid `backward_weights` (an error for each problem).
pub(super) fn backward_weights_signature(cx: &mut Ctxt, sig: &Signature) -> bool {
    let what = "a graphed `backward_weights`";
    let mut ok = plain_fn(cx, sig, what);
    match receiver(sig) {
        Receiver::Mutable => {}
        Receiver::Shared | Receiver::Other(_) => {
            cx.error_spanned_by(
                sig.inputs.first(),
                format_args!("{what} takes `&mut self`: it accumulates parameter grads"),
            );
            ok = false;
        }
        Receiver::Missing => {
            cx.error_spanned_by(&sig.ident, format_args!("{what} is a method taking `&mut self`"));
            ok = false;
        }
    }
    match cx_and_rest(cx, sig, what) {
        Some((_, _, rest)) => {
            for arg in rest {
                cx.error_spanned_by(
                    arg,
                    format_args!("{what} takes only the context (`cx: &mut Cx`): read what it needs from what `backward` saved in it"),
                );
                ok = false;
            }
        }
        None => ok = false,
    }
    match result_ok(cx, sig, what, "()") {
        Some(ty) if matches!(ungroup_ty(ty), Type::Tuple(tuple) if tuple.elems.is_empty()) => {}
        Some(ty) => {
            cx.error_spanned_by(
                ty,
                format_args!("{what} returns `Result<()>`: it accumulates into the parameters' grads"),
            );
            ok = false;
        }
        None => ok = false,
    }
    ok
}
