//! Stage 2: judge the parsed arguments and the annotated item, and build the model that
//! [`crate::expand`] turns into code.
//!
//! Every check records its error in the [`Ctxt`] and goes on, so one build reports every
//! problem; the model is only used when no error was recorded.

use syn::spanned::Spanned;
use syn::{Field, Ident, ImplItem, ImplItemFn, ItemImpl, ItemStruct};

use crate::ctxt::Ctxt;
use crate::model::{Chunk, Hook, ModuleModel, StructModel};
use crate::parse::{self, GraphedArgs, HookAttr};

mod options;
mod order;
mod signature;
mod types;
mod wgrad;

pub(crate) use options::krate_path;
use options::options;
use order::order;
use signature::*;
use types::*;

// ---------------------------------------------------------------------------------------------
// The struct form.

/// Validates `#[graphed(...)] struct S { chunk: M, ... }`.
pub fn graphed_struct(cx: &mut Ctxt, args: &GraphedArgs, item: &ItemStruct) -> Option<StructModel> {
    let options = options(cx, args);
    // As for impls: wrong arguments (a bad `order` included) still give a model, with
    // defaults, so the wrapper exists; a wrong struct gives none.
    let argument_errors = cx.error_count();
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &item.generics,
            "#[graphed] structs cannot be generic: each chunk must be a concrete module type",
        );
    }
    let fields: Vec<&Field> = match &item.fields {
        syn::Fields::Named(named) => named.named.iter().collect(),
        syn::Fields::Unnamed(unnamed) => {
            cx.error_spanned_by(
                unnamed,
                "#[graphed] on a struct needs named fields, one per chunk: `struct TwoStage { first: Block, second: Block }`",
            );
            Vec::new()
        }
        syn::Fields::Unit => {
            cx.error_spanned_by(
                &item.ident,
                "#[graphed] on a struct needs named fields, one per chunk: `struct TwoStage { first: Block, second: Block }`",
            );
            Vec::new()
        }
    };
    if fields.is_empty() && matches!(item.fields, syn::Fields::Named(_)) {
        cx.error_spanned_by(&item.ident, "#[graphed] struct has no chunks: give it one field per module");
    }
    let chunks: Vec<Chunk> =
        fields.iter().filter_map(|field| Some(Chunk { name: field.ident.clone()?, ty: field.ty.clone() })).collect();
    if cx.error_count() > argument_errors {
        return None;
    }
    let (order, microbatches) = match &args.order {
        Some(arg) if !chunks.is_empty() => match order(cx, &arg.value, &chunks) {
            Some((order, microbatches)) => (Some(order), microbatches),
            None => (None, 1),
        },
        _ => (None, 1),
    };
    Some(StructModel { options, vis: item.vis.clone(), ident: item.ident.clone(), chunks, order, microbatches })
}

// ---------------------------------------------------------------------------------------------
// The impl form.

/// The argument `#[graphed]` leaves in each `#[capture_time_hook]` it has read, so the
/// attribute (and the user's import of it) stays used while the hook macro knows to emit the
/// method untouched.
pub const CONSUMED_MARKER: &str = "__graphed_consumed";

/// Takes the `#[capture_time_hook]` attributes of the impl's methods, leaving in their place
/// `#[capture_time_hook(__graphed_consumed)]` (same path), and returns them with the method
/// they were on, in declaration order.
pub fn take_hook_attrs(item: &mut ItemImpl) -> Vec<(syn::Attribute, ImplItemFn)> {
    let mut hooks = Vec::new();
    for impl_item in &mut item.items {
        if let ImplItem::Fn(method) = impl_item {
            let original = method.clone();
            for attr in &mut method.attrs {
                if parse::is_hook_attr(attr) {
                    let path = attr.path().clone();
                    let marker = Ident::new(CONSUMED_MARKER, attr.span());
                    let consumed: syn::Attribute = syn::parse_quote_spanned!(attr.span()=> #[#path(#marker)]);
                    hooks.push((std::mem::replace(attr, consumed), original.clone()));
                }
            }
        }
    }
    hooks
}

/// The method `name` of the impl, if it has one.
fn method<'a>(item: &'a ItemImpl, name: &str) -> Option<&'a ImplItemFn> {
    item.items.iter().find_map(|impl_item| match impl_item {
        ImplItem::Fn(method) if method.sig.ident == name => Some(method),
        _ => None,
    })
}

/// An error for each of `forward` and `backward` the impl lacks.
fn require_methods(cx: &mut Ctxt, item: &ItemImpl, has_forward: bool, has_backward: bool) {
    if !has_forward {
        cx.error_spanned_by(
            &item.self_ty,
            "#[graphed] impl is missing `fn forward(&self, cx: &mut Cx, <tensors>) -> Result<...>`",
        );
    }
    if !has_backward {
        cx.error_spanned_by(
            &item.self_ty,
            "#[graphed] impl is missing `fn backward(&mut self, cx: &mut Cx, <grad per output>) -> Result<...>`",
        );
    }
}

/// The hooks whose attribute and signature are both right (errors for the others).
fn model_hooks(cx: &mut Ctxt, hooks: &[(syn::Attribute, ImplItemFn)]) -> Vec<Hook> {
    let mut model_hooks = Vec::new();
    for (attr, method) in hooks {
        let parsed = parse::hook_attr(cx, attr);
        let signature_ok = hook_signature(cx, &method.sig);
        if let (Some(HookAttr { kind, prepend }), true) = (parsed, signature_ok) {
            model_hooks.push(Hook { method: method.sig.ident.clone(), kind, prepend });
        }
    }
    model_hooks
}

/// Validates `#[graphed(...)] impl T { ... }`; `item` has its hook attributes stripped
/// already and `hooks` holds them.
pub fn graphed_impl(
    cx: &mut Ctxt,
    args: &GraphedArgs,
    item: &ItemImpl,
    hooks: &[(syn::Attribute, ImplItemFn)],
) -> Option<ModuleModel> {
    let options = options(cx, args);
    // Errors in the arguments alone still give a model (with defaults), so the generated API
    // exists and the user sees no follow-on errors; errors in the item give none.
    let argument_errors = cx.error_count();
    if let Some(order) = &args.order {
        cx.error_spanned_by(
            &order.key,
            "`order` belongs on a struct of chunks (`#[graphed(order = [...])] struct Stages { a: A, b: B }`), not on a module's impl",
        );
    }
    if let Some((path, _)) = &item.trait_ {
        // Nothing else about the impl is meaningful then.
        cx.error_spanned_by(
            path,
            "#[graphed] goes on the inherent impl that defines `forward` and `backward` (`impl Block { ... }`), not on a trait impl",
        );
        return None;
    }
    let generic = !item.generics.params.is_empty() || item.generics.where_clause.is_some();
    if generic {
        cx.error_spanned_by(
            &item.generics,
            "#[graphed] modules cannot be generic: graphs are captured for one concrete module type",
        );
    }
    let ident = type_ident(&item.self_ty);
    if ident.is_none() && !generic {
        cx.error_spanned_by(
            &item.self_ty,
            "#[graphed] needs a module type named by a plain path, such as `impl Block`",
        );
    }

    let (forward, backward) = (method(item, "forward"), method(item, "backward"));
    require_methods(cx, item, forward.is_some(), backward.is_some());
    let forward_sig = forward.and_then(|method| forward_signature(cx, &method.sig));
    let backward_sig = backward.and_then(|method| backward_signature(cx, &method.sig));
    let mut grad_outputs = Vec::new();
    let mut grad_inputs = None;
    if let (Some(fwd), Some(bwd)) = (&forward_sig, backward_sig) {
        grad_outputs = check_grad_outputs(cx, fwd, bwd.args, backward.map(|m| &m.sig));
        grad_inputs = check_grad_inputs(cx, fwd, bwd.ret);
    }

    let model_hooks = model_hooks(cx, hooks);
    let wgrad = method(item, wgrad::METHOD);
    let splits_backward = wgrad.is_some_and(|method| wgrad::backward_weights_signature(cx, &method.sig));

    if cx.error_count() > argument_errors {
        return None;
    }
    let (forward, forward_sig, grad_inputs, ident) = (forward?, forward_sig?, grad_inputs?, ident?);
    Some(ModuleModel {
        options,
        vis: forward.vis.clone(),
        self_ty: (*item.self_ty).clone(),
        ident,
        inputs: forward_sig.inputs,
        outputs: forward_sig.outputs,
        grad_outputs,
        grad_inputs,
        hooks: model_hooks,
        splits_backward,
    })
}
