//! Stage 2: judge the parsed arguments and the annotated item, and build the model that
//! [`crate::expand`] turns into code.
//!
//! Every check records its error in the [`Ctxt`] and goes on, so one build reports every
//! problem; the model is only used when no error was recorded.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{
    Expr, Field, FnArg, GenericArgument, Ident, ImplItem, ImplItemFn, ItemImpl, ItemStruct, Lit, Pat, PathArguments,
    ReceiverKind, ReturnType, Signature, Type, UnOp, Visibility,
};

use crate::ctxt::Ctxt;
use crate::parse::{self, GraphedArgs, HookAttr, HookKind};

/// The default number of eager warm-up iterations, as in PyTorch's `make_graphed_callables`.
pub const DEFAULT_WARMUP: usize = 3;

/// Options shared by both forms of `#[graphed]`.
pub struct Options {
    pub warmup: usize,
    pub allow_unused_input: bool,
    /// The path generated code reaches the runtime through (`::graphed` unless overridden).
    pub krate: syn::Path,
}

/// Whether a tensor slot may be absent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// `&Tensor` / `Tensor`.
    Required,
    /// `Option<&Tensor>` / `Option<Tensor>`.
    Optional,
}

/// A tensor argument of the user's `forward` or `backward`.
pub struct TensorArg {
    /// The argument's name, or `input_<i>` / `grad_<i>` for a pattern that is not a name.
    pub name: Ident,
    pub slot: Slot,
    /// The type as the user wrote it (reused in the wrapper's signature).
    pub ty: Type,
}

/// A returned list of tensors: a single one or a tuple.
pub struct Returned {
    pub slots: Vec<Slot>,
    /// Whether it is written as a tuple (`(Tensor,)` is a tuple of one).
    pub tuple: bool,
    /// The `T` of `Result<T>` as the user wrote it.
    pub ty: Type,
}

/// A method marked `#[capture_time_hook]`.
pub struct Hook {
    pub method: Ident,
    pub kind: HookKind,
    pub prepend: bool,
}

/// Everything `expand` needs for `#[graphed] impl T { ... }`.
pub struct ModuleModel {
    pub options: Options,
    /// The visibility of the user's `forward`, given to every generated item.
    pub vis: Visibility,
    pub self_ty: Type,
    pub ident: Ident,
    /// The `cx` argument of forward: its name and type as written.
    pub cx_name: Ident,
    pub cx_ty: Type,
    pub inputs: Vec<TensorArg>,
    pub outputs: Returned,
    pub grad_outputs: Vec<TensorArg>,
    pub grad_inputs: Returned,
    pub hooks: Vec<Hook>,
}

/// One chunk of `#[graphed] struct S { ... }`: a field.
pub struct Chunk {
    pub name: Ident,
    pub ty: Type,
}

/// Everything `expand` needs for `#[graphed(order = [...])] struct S { ... }`.
pub struct StructModel {
    pub options: Options,
    pub vis: Visibility,
    pub ident: Ident,
    pub chunks: Vec<Chunk>,
    /// The schedule, when given: `+c` forward of chunk c, `-c` its backward.
    pub order: Option<Vec<i32>>,
    pub microbatches: usize,
}

/// The runtime's path: the `crate = "..."` override when it parses, else `::graphed`.
pub fn krate_path(args: &GraphedArgs) -> syn::Path {
    args.krate
        .as_ref()
        .and_then(|arg| arg.value.parse::<syn::Path>().ok())
        .unwrap_or_else(|| syn::parse_quote!(::graphed))
}

/// Validates the keys both forms share.
fn options(cx: &mut Ctxt, args: &GraphedArgs) -> Options {
    let warmup = args.warmup.as_ref().and_then(|arg| warmup(cx, &arg.value)).unwrap_or(DEFAULT_WARMUP);
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
    Options { warmup, allow_unused_input, krate }
}

/// Strips invisible groups that `macro_rules!` transcription leaves around expressions.
fn ungroup(mut expr: &Expr) -> &Expr {
    while let Expr::Group(group) = expr {
        expr = &group.expr;
    }
    expr
}

/// An integer literal, with or without a leading minus (syn reads `-2` in an expression as
/// negation of `2`; a literal token made by a macro may also carry the minus itself).
fn int_literal(expr: &Expr) -> Option<syn::Result<i64>> {
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

fn warmup(cx: &mut Ctxt, expr: &Expr) -> Option<usize> {
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

// ---------------------------------------------------------------------------------------------
// The struct form.

/// Validates `#[graphed(...)] struct S { chunk: M, ... }`.
pub fn graphed_struct(cx: &mut Ctxt, args: &GraphedArgs, item: &ItemStruct) -> Option<StructModel> {
    let options = options(cx, args);
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
    let (order, microbatches) = match &args.order {
        Some(arg) if !chunks.is_empty() => match order(cx, &arg.value, &chunks) {
            Some((order, microbatches)) => (Some(order), microbatches),
            None => (None, 1),
        },
        _ => (None, 1),
    };
    if cx.has_errors() {
        return None;
    }
    Some(StructModel { options, vis: item.vis.clone(), ident: item.ident.clone(), chunks, order, microbatches })
}

/// Validates a schedule against the chunks; returns it with its number of microbatches.
fn order(cx: &mut Ctxt, list: &parse::OrderList, chunks: &[Chunk]) -> Option<(Vec<i32>, usize)> {
    let num_chunks = chunks.len();
    let names = chunks.iter().map(|chunk| format!("`{}`", chunk.name)).collect::<Vec<_>>().join(", ");
    // First every entry on its own: a number naming a chunk. Counting is only meaningful
    // once all of them are.
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
    if entries.len() != list.entries.len() {
        return None;
    }
    // Then the schedule: a backward needs an outstanding forward of its chunk.
    let mut forwards = vec![0usize; num_chunks];
    let mut backwards = vec![0usize; num_chunks];
    let mut ok = true;
    for (value, expr) in &entries {
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
    if !ok {
        return None;
    }
    let len = entries.len();
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
    let microbatches = len / per_microbatch;
    for (index, chunk) in chunks.iter().enumerate() {
        let (f, b) = (forwards[index], backwards[index]);
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
    if cx.has_errors() {
        return None;
    }
    Some((entries.into_iter().map(|(value, _)| value).collect(), microbatches))
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

/// Validates `#[graphed(...)] impl T { ... }`; `item` has its hook attributes stripped
/// already and `hooks` holds them.
pub fn graphed_impl(
    cx: &mut Ctxt,
    args: &GraphedArgs,
    item: &ItemImpl,
    hooks: &[(syn::Attribute, ImplItemFn)],
) -> Option<ModuleModel> {
    let options = options(cx, args);
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

    let find = |name: &str| {
        item.items.iter().find_map(|impl_item| match impl_item {
            ImplItem::Fn(method) if method.sig.ident == name => Some(method),
            _ => None,
        })
    };
    let forward = find("forward");
    let backward = find("backward");
    if forward.is_none() {
        cx.error_spanned_by(
            &item.self_ty,
            "#[graphed] impl is missing `fn forward(&self, cx: &mut Cx, <tensors>) -> Result<...>`",
        );
    }
    if backward.is_none() {
        cx.error_spanned_by(
            &item.self_ty,
            "#[graphed] impl is missing `fn backward(&mut self, cx: &mut Cx, <grad per output>) -> Result<...>`",
        );
    }

    let forward_sig = forward.and_then(|method| forward_signature(cx, &method.sig));
    let backward_sig = backward.and_then(|method| backward_signature(cx, &method.sig));
    let mut grad_outputs = Vec::new();
    let mut grad_inputs = None;
    if let (Some(fwd), Some(bwd)) = (&forward_sig, backward_sig) {
        grad_outputs = check_grad_outputs(cx, fwd, bwd.args, backward.map(|m| &m.sig));
        grad_inputs = check_grad_inputs(cx, fwd, bwd.ret);
    }

    let mut model_hooks = Vec::new();
    for (attr, method) in hooks {
        let parsed = parse::hook_attr(cx, attr);
        let signature_ok = hook_signature(cx, &method.sig);
        if let (Some(HookAttr { kind, prepend }), true) = (parsed, signature_ok) {
            model_hooks.push(Hook { method: method.sig.ident.clone(), kind, prepend });
        }
    }

    if cx.has_errors() {
        return None;
    }
    let (forward, forward_sig, grad_inputs, ident) = (forward?, forward_sig?, grad_inputs?, ident?);
    Some(ModuleModel {
        options,
        vis: forward.vis.clone(),
        self_ty: (*item.self_ty).clone(),
        ident,
        cx_name: forward_sig.cx_name,
        cx_ty: forward_sig.cx_ty,
        inputs: forward_sig.inputs,
        outputs: forward_sig.outputs,
        grad_outputs,
        grad_inputs,
        hooks: model_hooks,
    })
}

/// The last identifier of a plain path type (`Block`, `crate::layers::Block`).
fn type_ident(ty: &Type) -> Option<Ident> {
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

fn ungroup_ty(mut ty: &Type) -> &Type {
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
fn generic_of<'a>(ty: &'a Type, name: &str, exactly_one: bool) -> Option<&'a Type> {
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
fn is_tensor(ty: &Type) -> bool {
    matches!(ungroup_ty(ty), Type::Path(path)
        if path.qself.is_none()
            && path.path.segments.last().is_some_and(|last| last.ident == "Tensor" && last.arguments.is_none()))
}

/// `&Tensor` (shared, any lifetime).
fn is_tensor_ref(ty: &Type) -> bool {
    matches!(ungroup_ty(ty), Type::Reference(reference) if reference.mutability.is_none() && is_tensor(&reference.elem))
}

/// `&Tensor` → Required, `Option<&Tensor>` → Optional.
fn tensor_ref_slot(ty: &Type) -> Option<Slot> {
    if is_tensor_ref(ty) {
        Some(Slot::Required)
    } else if generic_of(ty, "Option", true).is_some_and(is_tensor_ref) {
        Some(Slot::Optional)
    } else {
        None
    }
}

/// `Tensor` → Required, `Option<Tensor>` → Optional.
fn tensor_slot(ty: &Type) -> Option<Slot> {
    if is_tensor(ty) {
        Some(Slot::Required)
    } else if generic_of(ty, "Option", true).is_some_and(is_tensor) {
        Some(Slot::Optional)
    } else {
        None
    }
}

/// The name of an argument pattern, when it is a plain name.
fn pat_name(pat: &Pat) -> Option<Ident> {
    match pat {
        Pat::Ident(ident) if ident.subpat.is_none() && ident.by_ref.is_none() => Some(ident.ident.clone()),
        _ => None,
    }
}

/// Rejects what the generated glue cannot call: generics, `async`, `const`, variadics.
fn plain_fn(cx: &mut Ctxt, sig: &Signature, what: &str) -> bool {
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
enum Receiver {
    Shared,
    Mutable,
    Other(Span),
    Missing,
}

fn receiver(sig: &Signature) -> Receiver {
    match sig.inputs.first() {
        Some(FnArg::Receiver(receiver)) => match &receiver.kind {
            ReceiverKind::Reference(_, _, None) => Receiver::Shared,
            ReceiverKind::Reference(_, _, Some(_)) => Receiver::Mutable,
            _ => Receiver::Other(receiver.span()),
        },
        _ => Receiver::Missing,
    }
}

struct ForwardSig {
    cx_name: Ident,
    cx_ty: Type,
    inputs: Vec<TensorArg>,
    outputs: Returned,
}

/// The typed arguments after the receiver: the context, then the rest.
fn cx_and_rest<'a>(cx: &mut Ctxt, sig: &'a Signature, what: &str) -> Option<(Ident, Type, Vec<&'a syn::PatType>)> {
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
fn result_ok<'a>(cx: &mut Ctxt, sig: &'a Signature, what: &str, expected: &str) -> Option<&'a Type> {
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
fn returned(cx: &mut Ctxt, ty: &Type, what: &str) -> Option<Returned> {
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

fn forward_signature(cx: &mut Ctxt, sig: &Signature) -> Option<ForwardSig> {
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
    let (cx_name, cx_ty, rest) = cx_and_rest(cx, sig, "a graphed `forward`")?;
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
    ok.then_some(ForwardSig { cx_name, cx_ty, inputs, outputs })
}

struct BackwardSig<'a> {
    args: Vec<&'a syn::PatType>,
    ret: &'a Type,
}

fn backward_signature<'a>(cx: &mut Ctxt, sig: &'a Signature) -> Option<BackwardSig<'a>> {
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
fn check_grad_outputs(
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
fn check_grad_inputs(cx: &mut Ctxt, forward: &ForwardSig, ret: &Type) -> Option<Returned> {
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
fn hook_signature(cx: &mut Ctxt, sig: &Signature) -> bool {
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
