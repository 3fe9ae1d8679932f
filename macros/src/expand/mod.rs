//! Stage 3: turn a validated model into code.
//!
//! Generated code reaches the runtime only through `<krate>::__private` (`::graphed` unless
//! `crate = "..."` says otherwise). Types a user can name (the wrapper and the surface structs)
//! are emitted next to the user's item with doc comments; every impl goes inside one
//! `const _: () = { ... };` so no helper leaks into the user's namespace.
//!
//! - `surface`: the static surface structs (`XInputs`, ...) and their slot conversions;
//! - `module_impl`: `impl Module for X`, from positional slots to the typed methods and back;
//! - `wrapper`: `GraphedX` and `X::make_graphed` for the impl form;
//! - `pipeline`: `GraphedS` for the struct form, its schedule and per-chunk methods.

mod chain;
mod module_impl;
mod structs;
mod surface;
mod wrapper;

use proc_macro2::{Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, Item, ItemImpl};

use crate::ctxt::Ctxt;
use crate::fallback;
use crate::model::{BucketSizes, Buckets, ModuleModel, Options, Returned};
use crate::{parse, validate};

/// The one list of lints generated code allows: the wrapper may go unused, absolute paths
/// may be longer than the user's imports make necessary, and pedantic style lints do not
/// apply to code nobody wrote by hand.
pub(crate) fn allow_lints() -> TokenStream {
    quote! {
        #[allow(
            dead_code,
            unused_qualifications,
            non_camel_case_types,
            non_snake_case,
            clippy::all,
            clippy::pedantic,
            clippy::nursery,
        )]
    }
}

/// `#[graphed(args)] item`.
pub fn graphed(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::new();
    let parsed_args = parse::graphed_args(&mut cx, args);
    let item_tokens = item.clone();
    match syn::parse2::<Item>(item) {
        Ok(Item::Impl(mut item)) => {
            let hooks = validate::take_hook_attrs(&mut item);
            // With a valid item, the generated API is emitted even when only the attribute's
            // arguments are wrong (defaults stand in), so no follow-on errors appear.
            match validate::graphed_impl(&mut cx, &parsed_args, &item, &hooks) {
                Some(model) => with_errors(expand_impl(&item, &model), cx),
                None => fallback::graphed_impl(&item, &validate::krate_path(&parsed_args), cx.check()),
            }
        }
        Ok(Item::Struct(item)) => {
            // The fields' `#[graphed(...)]` attributes are read from `item` and never emitted.
            let stripped = validate::strip_field_attrs(&item);
            match validate::graphed_struct(&mut cx, &parsed_args, &item) {
                Some(model) => with_errors(structs::expand(&stripped, &model), cx),
                None => fallback::item(stripped.into_token_stream(), cx.check()),
            }
        }
        Ok(other) => {
            cx.error_spanned_by(
                item_keyword(&other),
                "#[graphed] goes on the inherent impl of a module (`impl Block { fn forward ... fn backward ... }`) or on a struct of chunks (`struct TwoStage { first: Block, second: Block }`)",
            );
            fallback::item(other.into_token_stream(), cx.check())
        }
        Err(error) => {
            cx.syn_error(error);
            fallback::item(item_tokens, cx.check())
        }
    }
}

/// The expansion followed by the errors recorded, if any.
fn with_errors(mut tokens: TokenStream, cx: Ctxt) -> TokenStream {
    if let Err(errors) = cx.check() {
        tokens.extend(errors.into_compile_error());
    }
    tokens
}

/// `#[graphed] impl X { ... }`: surfaces, `impl Module`, the wrapper.
fn expand_impl(item: &ItemImpl, model: &ModuleModel) -> TokenStream {
    let names = ImplNames::new(model);
    let surfaces = surface::surfaces(&names, model);
    let surface_defs = surfaces.iter().map(surface::Surface::definition);
    let surface_impls = surfaces.iter().map(surface::Surface::impls);
    let typed = surface::typed_module_impl(&names, model);
    let module_impl = module_impl::expand(&names, model);
    let (wrapper_def, wrapper_impl) = wrapper::expand(&names, model);
    let allow = allow_lints();
    quote! {
        #item

        #(#surface_defs)*

        #wrapper_def

        #allow
        const _: () = {
            #module_impl

            #(#surface_impls)*

            #typed

            #wrapper_impl
        };
    }
}

/// The names an impl-form expansion uses, computed once.
pub(crate) struct ImplNames {
    /// `<krate>::__private`.
    pub private: TokenStream,
    pub self_ty: syn::Type,
    /// The module's name as a string, for messages.
    pub module: String,
    pub wrapper: Ident,
    pub inputs_ty: Ident,
    pub outputs_ty: Ident,
    pub grad_outputs_ty: Ident,
    pub grad_inputs_ty: Ident,
    /// `XExtraInputs`: the forward's tensor arguments after a first `&Tensor` (what a chain
    /// gives a chunk besides the previous chunk's output); generated only when there are some.
    pub extra_inputs_ty: Ident,
    /// Slot locals: `__input0..`, `__output0..`, `__grad_output0..`, `__grad_input0..`.
    pub in_locals: Vec<Ident>,
    pub out_locals: Vec<Ident>,
    pub grad_locals: Vec<Ident>,
    pub grad_in_locals: Vec<Ident>,
}

impl ImplNames {
    fn new(model: &ModuleModel) -> ImplNames {
        let krate = &model.options.krate;
        let ident = &model.ident;
        let span = ident.span();
        ImplNames {
            private: quote!(#krate::__private),
            self_ty: model.self_ty.clone(),
            module: ident.to_string(),
            wrapper: format_ident!("Graphed{}", ident, span = span),
            inputs_ty: format_ident!("{}Inputs", ident, span = span),
            outputs_ty: format_ident!("{}Outputs", ident, span = span),
            grad_outputs_ty: format_ident!("{}GradOutputs", ident, span = span),
            grad_inputs_ty: format_ident!("{}GradInputs", ident, span = span),
            extra_inputs_ty: format_ident!("{}ExtraInputs", ident, span = span),
            in_locals: locals("input", model.inputs.len()),
            out_locals: locals("output", model.outputs.slots.len()),
            grad_locals: locals("grad_output", model.grad_outputs.len()),
            grad_in_locals: locals("grad_input", model.grad_inputs.slots.len()),
        }
    }
}

/// The tokens to point at for an item of the wrong kind: its keyword and name, not its body.
fn item_keyword(item: &Item) -> TokenStream {
    match item {
        Item::Fn(item) => {
            let (fn_token, ident) = (&item.sig.fn_token, &item.sig.ident);
            quote!(#fn_token #ident)
        }
        Item::Enum(item) => {
            let (enum_token, ident) = (&item.enum_token, &item.ident);
            quote!(#enum_token #ident)
        }
        Item::Trait(item) => {
            let (trait_token, ident) = (&item.trait_token, &item.ident);
            quote!(#trait_token #ident)
        }
        Item::Mod(item) => {
            let (mod_token, ident) = (&item.mod_token, &item.ident);
            quote!(#mod_token #ident)
        }
        other => {
            let span = other.span();
            quote_spanned!(span=> item)
        }
    }
}

/// `#[capture_time_hook(...)]` outside a `#[graphed]` impl: the item back, plus an error.
pub fn standalone_hook(args: TokenStream, item: TokenStream) -> TokenStream {
    if matches!(args.clone().into_iter().next(), Some(proc_macro2::TokenTree::Ident(ident)) if ident == validate::CONSUMED_MARKER)
    {
        // Already read by the enclosing `#[graphed]` impl.
        return item;
    }
    let span = args.clone().into_iter().next().map_or_else(Span::call_site, |token| token.span());
    let mut cx = Ctxt::new();
    cx.error_at(
        span,
        "#[capture_time_hook] is only allowed on methods inside a #[graphed] impl (put #[graphed] on the impl block, or register the hook at run time with GraphedModules::register_hook)",
    );
    fallback::item(item, cx.check())
}

pub(crate) fn doc(text: impl AsRef<str>) -> TokenStream {
    let text = format!(" {}", text.as_ref());
    quote!(#[doc = #text])
}

pub(crate) fn usize_lit(value: usize) -> Literal {
    Literal::usize_unsuffixed(value)
}

/// `__<prefix>0, __<prefix>1, ...`
pub(crate) fn locals(prefix: &str, count: usize) -> Vec<Ident> {
    (0..count).map(|index| format_ident!("__{}{}", prefix, index)).collect()
}

/// Destructures `value` by the shape of `returned`: a tuple pattern or one name.
pub(crate) fn destructure(returned: &Returned, names: &[Ident]) -> TokenStream {
    if returned.tuple {
        quote!((#(#names,)*))
    } else {
        quote!(#(#names)*)
    }
}

/// Builds the typed value from slot locals: a tuple or one value.
pub(crate) fn build(
    returned: &Returned,
    locals: &[Ident],
    private: &TokenStream,
    module: &str,
    names: &[String],
) -> TokenStream {
    let values =
        locals.iter().zip(names).map(|(local, name)| quote!(#private::FromSlot::from_slot(#local, #module, #name)?));
    if returned.tuple {
        quote!((#(#values,)*))
    } else {
        quote!(#(#values)*)
    }
}

/// `GraphOptions::new().warmup(3)...` for the attribute's options.
pub(crate) fn options_expr(options: &Options, order: Option<TokenStream>) -> TokenStream {
    let krate = &options.krate;
    let warmup = usize_lit(options.warmup);
    let allow_unused_input = options.allow_unused_input;
    let order = order.map(|order| quote!(.order(#order)));
    let buckets = options.buckets.as_ref().map(|_| quote!(.buckets(Self::buckets())));
    quote! {
        #krate::__private::GraphOptions::new()
            .warmup(#warmup)
            #order
            #buckets
            .allow_unused_input(#allow_unused_input)
    }
}

pub(crate) fn options_text(options: &Options) -> String {
    let mut text = format!("`warmup = {}`", options.warmup);
    if let Some(buckets) = &options.buckets {
        text.push_str(&format!(", shape buckets {}", buckets_text(buckets)));
    }
    if options.allow_unused_input {
        text.push_str(", `allow_unused_input`");
    }
    text
}

/// The buckets in words, for doc comments: "along axis 1 (128, 256), ...".
fn buckets_text(buckets: &Buckets) -> String {
    let sizes = match &buckets.sizes {
        BucketSizes::List(sizes) => {
            let mut sizes = sizes.clone();
            sizes.sort_unstable();
            sizes.dedup();
            sizes.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
        }
        BucketSizes::PowersOfTwo { min, max } => format!("powers of two from {min} up to {max}"),
        BucketSizes::Step { by, max } => format!("every {by} up to {max}"),
    };
    let mut text = format!("along axis {} ({sizes})", buckets.axis);
    for (input, value) in &buckets.pads {
        text.push_str(&format!(", input {input} padded with {value:?}"));
    }
    if buckets.eager_above {
        text.push_str(", eager above the largest");
    }
    text
}

/// `Buckets::new(axis, [..])` (or the rule), then its pads and what happens above the largest,
/// as the attribute's `buckets(...)` says.
fn buckets_expr(private: &TokenStream, buckets: &Buckets) -> TokenStream {
    let axis = usize_lit(buckets.axis);
    let sizes = match &buckets.sizes {
        BucketSizes::List(sizes) => {
            let sizes = sizes.iter().map(|size| usize_lit(*size));
            quote!(#private::Buckets::new(#axis, [#(#sizes),*]))
        }
        BucketSizes::PowersOfTwo { min, max } => {
            let (min, max) = (usize_lit(*min), usize_lit(*max));
            quote!(#private::Buckets::powers_of_two(#axis, #min, #max))
        }
        BucketSizes::Step { by, max } => {
            let (by, max) = (usize_lit(*by), usize_lit(*max));
            quote!(#private::Buckets::step(#axis, #by, #max))
        }
    };
    let pads = buckets.pads.iter().map(|(input, value)| {
        let input = usize_lit(*input);
        // An unsuffixed literal is never negative: the sign is its own token.
        let magnitude = Literal::f32_unsuffixed(value.abs());
        let sign = value.is_sign_negative().then(|| quote!(-));
        quote!(.pad(#input, #sign #magnitude))
    });
    let above = buckets.eager_above.then(|| quote!(.above_largest(#private::AboveLargest::Eager)));
    quote!(#sizes #(#pads)* #above)
}

/// `buckets()`, the buckets the attribute declares, on a wrapper whose attribute has some.
pub(crate) fn buckets_fn(private: &TokenStream, options: &Options, name: &str) -> TokenStream {
    let Some(buckets) = &options.buckets else { return TokenStream::new() };
    let expr = buckets_expr(private, buckets);
    let buckets_doc = doc(format!(
        "The shape buckets `#[graphed(buckets(...))]` declares for `{name}`, {}. `new` captures with them unless its options name buckets of their own; samples are at the largest bucket's size.",
        buckets_text(buckets)
    ));
    quote! {
        #buckets_doc
        pub fn buckets() -> #private::Buckets {
            #expr
        }
    }
}

/// `Debug` for a wrapper: its graphs, as `GraphedModules` prints them.
pub(crate) fn debug_impl(wrapper: &Ident, private: &TokenStream) -> TokenStream {
    quote! {
        #[automatically_derived]
        impl #private::fmt::Debug for #wrapper {
            fn fmt(&self, f: &mut #private::fmt::Formatter<'_>) -> #private::fmt::Result {
                #private::fmt::Debug::fmt(&self.__modules, f)
            }
        }
    }
}

/// The accessors every graphed wrapper has, over its `__modules` field; `step()` on the
/// bound buffers unless the wrapper has a typed one.
pub(crate) fn common_accessors(private: &TokenStream, with_step: bool) -> TokenStream {
    let step = with_step.then(|| {
        quote! {
            /// Replays one whole iteration of the schedule as one launch, on the inputs and grad
            /// outputs bound to the static buffers (see `GraphedModules::step`); call
            /// [`Self::fuse`] once first.
            pub fn step(&mut self) -> #private::Result<()> {
                self.__modules.step()
            }
        }
    });
    quote! {
        /// The type-erased graphs (pool, run-time hooks, ...).
        pub fn inner(&self) -> &#private::GraphedModules {
            &self.__modules
        }

        /// The type-erased graphs, mutably.
        pub fn inner_mut(&mut self) -> &mut #private::GraphedModules {
            &mut self.__modules
        }

        /// Unwraps the type-erased graphs.
        pub fn into_inner(self) -> #private::GraphedModules {
            *self.__modules
        }

        /// Builds the one-launch step once (see `GraphedModules::fuse`).
        pub fn fuse(&mut self) -> #private::Result<()> {
            self.__modules.fuse()
        }

        #step

        /// Switches to training mode: calls replay the graphs if they were captured in it, and
        /// run the eager forward otherwise.
        pub fn train(&mut self) {
            self.__modules.train();
        }

        /// Switches to eval mode: calls replay the graphs if they were captured in it, and run
        /// the eager forward otherwise.
        pub fn eval(&mut self) {
            self.__modules.eval();
        }
    }
}
