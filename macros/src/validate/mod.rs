//! Stage 2: judge the parsed arguments and the annotated item, and build the model that
//! [`crate::expand`] turns into code.
//!
//! Every check records its error in the [`Ctxt`] and goes on, so one build reports every
//! problem; the model is only used when no error was recorded.

use syn::spanned::Spanned;
use syn::{Ident, ImplItem, ImplItemFn, ItemImpl, ItemStruct};

use crate::ctxt::Ctxt;
use crate::model::{Entry, Hook, ModuleModel, Order, Pass, Returned, StructModel};
use crate::parse::{self, GraphedArgs, HookAttr, OrderArg};

mod buckets;
mod fields;
mod options;
mod order;
mod signature;
mod types;
mod wgrad;

pub(crate) use options::krate_path;
use options::options;
use order::{order, ChunkName};
use signature::*;
use types::*;

// ---------------------------------------------------------------------------------------------
// The struct form.

/// Validates `#[graphed(...)] struct S { chunk: M, stack: [M; N], layers: Vec<M>, ... }`.
pub fn graphed_struct(cx: &mut Ctxt, args: &GraphedArgs, item: &ItemStruct) -> Option<StructModel> {
    let options = options(cx, args);
    // As for impls: wrong arguments (a bad `order` or field attribute included) still give a
    // model, with defaults, so the wrapper exists; a wrong struct gives none.
    let argument_errors = cx.error_count();
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        cx.error_spanned_by(
            &item.generics,
            "#[graphed] structs cannot be generic: each chunk must be a concrete module type",
        );
    }
    const NAMED: &str = "#[graphed] on a struct needs named fields, one per chunk or stack of chunks: `struct Model { embed: Embed, blocks: Vec<Block>, head: Head }`";
    let fields: Vec<&syn::Field> = match &item.fields {
        syn::Fields::Named(named) => named.named.iter().collect(),
        syn::Fields::Unnamed(unnamed) => {
            cx.error_spanned_by(unnamed, NAMED);
            Vec::new()
        }
        syn::Fields::Unit => {
            cx.error_spanned_by(&item.ident, NAMED);
            Vec::new()
        }
    };
    if fields.is_empty() && matches!(item.fields, syn::Fields::Named(_)) {
        cx.error_spanned_by(&item.ident, "#[graphed] struct has no chunks: give it one field per module");
    }
    let struct_errors = cx.error_count();
    let fields = fields::fields(cx, &fields);
    let empty_stack = fields.iter().any(|field| field.fixed_len() == Some(0));
    if struct_errors > argument_errors || empty_stack {
        return None;
    }
    let chained = args.chained.as_ref().is_some_and(|arg| arg.value);
    let mut model = StructModel {
        options,
        vis: item.vis.clone(),
        ident: item.ident.clone(),
        fields,
        chained,
        order: None,
        microbatches: 1,
        whole_chains: true,
    };
    if let Some(arg) = args.chained.as_ref().filter(|arg| arg.value) {
        if model.fixed_chunks() == Some(1) {
            cx.error_spanned_by(
                &arg.key,
                "`chained` links each chunk's output to the next chunk's input, and this struct has one chunk: give it two or more fields, or a stack",
            );
        }
    }
    if let Some(arg) = &args.order {
        schedule(cx, arg, &mut model);
    }
    Some(model)
}

/// The struct with its fields' `#[graphed(...)]` attributes removed (they are the macro's,
/// read by [`graphed_struct`]).
pub fn strip_field_attrs(item: &ItemStruct) -> ItemStruct {
    let mut item = item.clone();
    for field in item.fields.iter_mut() {
        field.attrs.retain(|attr| !parse::is_graphed_attr(attr));
    }
    item
}

/// The struct's schedule from `order = ...`: a list checked against a fixed layout, or
/// `windowed(...)` laid out now (fixed layout) or at construction.
fn schedule(cx: &mut Ctxt, arg: &parse::Arg<OrderArg>, model: &mut StructModel) {
    let names = model.chunk_names();
    let (order, microbatches) = match (&arg.value, names) {
        (OrderArg::List(list), Some(names)) => {
            let chunk_names: Vec<ChunkName> = names.iter().map(|(name, _, _)| ChunkName(name.clone())).collect();
            let Some((entries, microbatches)) = order(cx, list, &chunk_names) else { return };
            checkpointed_wgrads(cx, &entries, &names, model);
            (Order::List(entries), microbatches)
        }
        (OrderArg::List(_), None) => {
            let dynamic = model
                .fields
                .iter()
                .find(|field| field.fixed_len().is_none())
                .map_or_else(String::new, |field| format!("`{}`", field.name));
            cx.error_spanned_by(
                &arg.key,
                format_args!(
                    "`order = [...]` numbers the chunks at compile time, but the stack {dynamic} is counted only at construction (a `Vec`, or an array whose length is not an integer literal); use `order = windowed(microbatches = M, in_flight = K)`, or give `new` a schedule with GraphOptions::order"
                ),
            );
            return;
        }
        (OrderArg::Windowed(windowed), names) => {
            let (Some(microbatches), Some(in_flight)) = windowed_args(cx, windowed) else { return };
            match names {
                Some(names) => {
                    let span = windowed.name.span();
                    (Order::List(order::windowed(names.len(), microbatches, in_flight, span)), microbatches)
                }
                None => (Order::Windowed { in_flight }, microbatches),
            }
        }
    };
    model.whole_chains = match &order {
        Order::List(entries) => runs_whole_chains(entries, model.fixed_chunks().unwrap_or(0)),
        Order::Windowed { .. } => true,
    };
    model.order = Some(order);
    model.microbatches = microbatches;
}

/// `microbatches` and `in_flight` of `windowed(...)`, each a positive integer literal.
fn windowed_args(cx: &mut Ctxt, windowed: &parse::Windowed) -> (Option<usize>, Option<usize>) {
    let mut value = |arg: &Option<parse::Arg<syn::Expr>>, what: &str| -> Option<usize> {
        let Some(arg) = arg else {
            cx.error_spanned_by(
                &windowed.name,
                format_args!("`windowed` needs `{what} = N`: `order = windowed(microbatches = 4, in_flight = 2)`"),
            );
            return None;
        };
        match options::int_literal(&arg.value) {
            Some(Ok(n)) if n > 0 => usize::try_from(n).ok(),
            _ => {
                cx.error_spanned_by(&arg.value, format_args!("`{what}` is a positive integer"));
                None
            }
        }
    };
    let microbatches = value(&windowed.microbatches, "microbatches");
    let in_flight = value(&windowed.in_flight, "in_flight");
    (microbatches, in_flight)
}

/// A checkpointed chunk runs its whole backward after the recompute: `w(c)` entries for it are
/// errors on the entry.
fn checkpointed_wgrads(cx: &mut Ctxt, entries: &[Entry], names: &[(String, usize, usize)], model: &StructModel) {
    let mut reported = vec![false; names.len()];
    for entry in entries.iter().filter(|entry| entry.pass == Pass::Wgrad) {
        let (name, field, layer) = &names[entry.chunk - 1];
        let field = &model.fields[*field];
        if field.checkpoints(*layer) && !reported[entry.chunk - 1] {
            reported[entry.chunk - 1] = true;
            let c = entry.chunk;
            cx.error_at(
                entry.span,
                format_args!(
                    "`w({c})`: chunk {c} (`{name}`) is checkpointed (the #[graphed(...)] on `{}`), so it recomputes its forward inside its backward and runs its weight grads there too, with no separate step; drop the `w({c})` entries or the checkpoint",
                    field.name
                ),
            );
        }
    }
}

/// Whether each microbatch's forwards run through chunks 1..=n back to back and its backwards
/// n..=1 back to back, with no `w(c)` entries (then whole-model calls follow the schedule).
fn runs_whole_chains(entries: &[Entry], chunks: usize) -> bool {
    let mut iter = entries.iter();
    while let Some(first) = iter.next() {
        let order: Vec<usize> = match first.pass {
            Pass::Forward => (1..=chunks).collect(),
            Pass::Backward => (1..=chunks).rev().collect(),
            Pass::Wgrad => return false,
        };
        if first.chunk != order[0] {
            return false;
        }
        // FIFO per chunk: consecutive entries of one microbatch follow from the counts.
        for &chunk in &order[1..] {
            match iter.next() {
                Some(entry) if entry.pass == first.pass && entry.chunk == chunk => {}
                _ => return false,
            }
        }
    }
    true
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

/// An error when the impl lacks `forward` (an impl without `backward` is an inference module).
fn require_forward(cx: &mut Ctxt, item: &ItemImpl, has_forward: bool) {
    if !has_forward {
        cx.error_spanned_by(
            &item.self_ty,
            "#[graphed] impl is missing `fn forward(&self, cx: &mut Cx, <tensors>) -> Result<...>`",
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
    if let Some(chained) = &args.chained {
        cx.error_spanned_by(
            &chained.key,
            "`chained` belongs on a struct of chunks (`#[graphed(chained)] struct Model { embed: Embed, blocks: Vec<Block>, head: Head }`), not on a module's impl",
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
    require_forward(cx, item, forward.is_some());
    let forward_sig = forward.and_then(|method| forward_signature(cx, &method.sig));
    let backward_sig = backward.and_then(|method| backward_signature(cx, &method.sig));
    let forward_only = backward.is_none();
    let mut grad_outputs = Vec::new();
    let mut grad_inputs = forward_only.then(|| Returned { slots: Vec::new(), tuple: true, ty: syn::parse_quote!(()) });
    if let (Some(fwd), Some(bwd)) = (&forward_sig, backward_sig) {
        grad_outputs = check_grad_outputs(cx, fwd, bwd.args, backward.map(|m| &m.sig));
        grad_inputs = check_grad_inputs(cx, fwd, bwd.ret);
    }

    let model_hooks = model_hooks(cx, hooks);
    if forward_only {
        for hook in
            model_hooks.iter().filter(|h| matches!(h.kind, parse::HookKind::PreBackward | parse::HookKind::Backward))
        {
            cx.error_spanned_by(
                &hook.method,
                format_args!(
                    "a `{}` hook never runs on an impl without `backward` (an inference module)",
                    hook.kind.name()
                ),
            );
        }
    }
    let wgrad = method(item, wgrad::METHOD);
    if let (true, Some(method)) = (forward_only, wgrad) {
        cx.error_spanned_by(
            &method.sig.ident,
            "`backward_weights` is the second half of a split backward: this impl has no `backward` (an impl without one is an inference module)",
        );
    }
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
        forward_only,
        hooks: model_hooks,
        splits_backward,
    })
}
