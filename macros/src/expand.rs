//! Stage 3: turn a validated model into code.
//!
//! Generated code reaches the runtime only through `<krate>::__private` (`::graphed` unless
//! `crate = "..."` says otherwise). Types a user can name (the wrapper and the surface structs)
//! are emitted next to the user's item with doc comments; every impl goes inside one
//! `const _: () = { ... };` so no helper leaks into the user's namespace.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, Item, ItemImpl, ItemStruct};

use crate::ctxt::Ctxt;
use crate::fallback;
use crate::parse;
use crate::validate::{self, ModuleModel, Returned, Slot, StructModel, TensorArg};

/// The one list of lints generated code allows: the wrapper may go unused, absolute paths
/// may be longer than the user's imports make necessary, and pedantic style lints do not
/// apply to code nobody wrote by hand.
fn allow_lints() -> TokenStream {
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
            match validate::graphed_impl(&mut cx, &parsed_args, &item, &hooks) {
                Some(model) if !cx.has_errors() => expand_impl(&item, &model),
                _ => fallback::graphed_impl(&item, &validate::krate_path(&parsed_args), cx.check()),
            }
        }
        Ok(Item::Struct(item)) => match validate::graphed_struct(&mut cx, &parsed_args, &item) {
            Some(model) if !cx.has_errors() => expand_struct(&item, &model),
            _ => fallback::item(item.into_token_stream(), cx.check()),
        },
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

fn doc(text: impl AsRef<str>) -> TokenStream {
    let text = format!(" {}", text.as_ref());
    quote!(#[doc = #text])
}

fn usize_lit(value: usize) -> Literal {
    Literal::usize_unsuffixed(value)
}

/// `__<prefix>0, __<prefix>1, ...`
fn locals(prefix: &str, count: usize) -> Vec<Ident> {
    (0..count).map(|index| format_ident!("__{}{}", prefix, index)).collect()
}

/// Destructures `value` by the shape of `returned`: a tuple pattern or one name.
fn destructure(returned: &Returned, names: &[Ident]) -> TokenStream {
    if returned.tuple {
        quote!((#(#names,)*))
    } else {
        quote!(#(#names)*)
    }
}

/// The static surface structs of a module: fields, docs and slot conversions.
struct Surface<'a> {
    name: Ident,
    doc: String,
    what: &'static str,
    fields: Vec<(Ident, Slot, String)>,
    model: &'a ModuleModel,
}

impl Surface<'_> {
    fn definition(&self) -> TokenStream {
        let krate = &self.model.options.krate;
        let vis = &self.model.vis;
        let name = &self.name;
        let allow = allow_lints();
        let struct_doc = doc(&self.doc);
        let fields = self.fields.iter().map(|(field, slot, field_doc)| {
            let field_doc = doc(field_doc);
            let ty = match slot {
                Slot::Required => quote!(#krate::__private::Tensor),
                Slot::Optional => quote!(#krate::__private::Option<#krate::__private::Tensor>),
            };
            quote! { #field_doc pub #field: #ty, }
        });
        quote! {
            #struct_doc
            #allow
            #[derive(Clone, Debug)]
            #vis struct #name {
                #(#fields)*
            }
        }
    }

    fn impls(&self) -> TokenStream {
        let krate = &self.model.options.krate;
        let module = self.model.ident.to_string();
        let name = &self.name;
        let what = self.what;
        let len = usize_lit(self.fields.len());
        let names = self.fields.iter().map(|(field, _, _)| field.to_string());
        let fields: Vec<&Ident> = self.fields.iter().map(|(field, _, _)| field).collect();
        let slots = locals("slot", self.fields.len());
        let field_names: Vec<String> = fields.iter().map(|field| field.to_string()).collect();
        quote! {
            #[automatically_derived]
            impl #name {
                /// The number of tensor slots.
                pub const LEN: usize = #len;
                /// The field names, in slot order.
                pub const NAMES: [&'static str; #len] = [#(#names),*];

                /// The positional slots the type-erased `Module` interface uses (`None` for an
                /// absent optional tensor), in field order.
                pub fn into_slots(self) -> #krate::__private::Vec<#krate::__private::Option<#krate::__private::Tensor>> {
                    #krate::__private::vec![#(#krate::__private::IntoSlot::into_slot(self.#fields)),*]
                }

                /// Reads positional slots; errors when their number differs or a required tensor is
                /// missing.
                pub fn from_slots(
                    slots: #krate::__private::Vec<#krate::__private::Option<#krate::__private::Tensor>>,
                ) -> #krate::__private::Result<Self> {
                    let [#(#slots),*] = #krate::__private::slots::<#len>(slots, #module, #what)?;
                    #krate::__private::Ok(Self {
                        #(#fields: #krate::__private::FromSlot::from_slot(#slots, #module, #field_names)?,)*
                    })
                }
            }
        }
    }
}

fn slot_doc(slot: Slot) -> &'static str {
    match slot {
        Slot::Required => "",
        Slot::Optional => " (`None` when absent)",
    }
}

fn expand_impl(item: &ItemImpl, model: &ModuleModel) -> TokenStream {
    let krate = &model.options.krate;
    let private = quote!(#krate::__private);
    let vis = &model.vis;
    let self_ty = &model.self_ty;
    let ident = &model.ident;
    let module = ident.to_string();
    let span = ident.span();
    let wrapper = format_ident!("Graphed{}", ident, span = span);
    let inputs_ty = format_ident!("{}Inputs", ident, span = span);
    let outputs_ty = format_ident!("{}Outputs", ident, span = span);
    let grad_outputs_ty = format_ident!("{}GradOutputs", ident, span = span);
    let grad_inputs_ty = format_ident!("{}GradInputs", ident, span = span);
    let allow = allow_lints();

    let input_names: Vec<&Ident> = model.inputs.iter().map(|arg| &arg.name).collect();
    let input_tys: Vec<&syn::Type> = model.inputs.iter().map(|arg| &arg.ty).collect();
    let grad_names: Vec<&Ident> = model.grad_outputs.iter().map(|arg| &arg.name).collect();
    let grad_tys: Vec<&syn::Type> = model.grad_outputs.iter().map(|arg| &arg.ty).collect();
    let num_inputs = usize_lit(model.inputs.len());
    let num_outputs = usize_lit(model.outputs.slots.len());

    // The static surfaces.
    let arg_fields = |args: &[TensorArg], method: &str| -> Vec<(Ident, Slot, String)> {
        args.iter()
            .map(|arg| {
                let doc = format!("The `{}` argument of `{module}::{method}`{}.", arg.name, slot_doc(arg.slot));
                (arg.name.clone(), arg.slot, doc)
            })
            .collect()
    };
    let output_fields: Vec<(Ident, Slot, String)> = model
        .outputs
        .slots
        .iter()
        .enumerate()
        .map(|(index, slot)| {
            let doc = format!("Output {index} of `{module}::forward`{}.", slot_doc(*slot));
            (format_ident!("output_{}", index), *slot, doc)
        })
        .collect();
    let grad_input_fields: Vec<(Ident, Slot, String)> = model
        .inputs
        .iter()
        .map(|arg| {
            let doc = format!(
                "The grad of input `{}`; `None` when that input needs no grad{}.",
                arg.name,
                if arg.slot == Slot::Optional { " or was absent" } else { "" }
            );
            (arg.name.clone(), Slot::Optional, doc)
        })
        .collect();
    let surfaces = [
        Surface {
            name: inputs_ty.clone(),
            doc: format!(
                "The static input surface of [`{module}`]: one field per tensor argument of `{module}::forward`, in order. Capture records the graphs on buffers of these shapes; each replay copies its inputs into them (unless an input already is that buffer)."
            ),
            what: "inputs",
            fields: arg_fields(&model.inputs, "forward"),
            model,
        },
        Surface {
            name: outputs_ty,
            doc: format!(
                "The static outputs of [`{module}`]'s forward graph, one field per element `{module}::forward` returns. A replay writes them in place; a handle from an earlier replay reports itself stale rather than change under its holder."
            ),
            what: "outputs",
            fields: output_fields,
            model,
        },
        Surface {
            name: grad_outputs_ty,
            doc: format!(
                "The static grad-output surface of [`{module}`]'s backward graph: one field per argument of `{module}::backward`, that is one grad per forward output."
            ),
            what: "grad outputs",
            fields: arg_fields(&model.grad_outputs, "backward"),
            model,
        },
        Surface {
            name: grad_inputs_ty,
            doc: format!(
                "The static grad-input surface of [`{module}`]'s backward graph: one grad per tensor argument of `{module}::forward`."
            ),
            what: "grad inputs",
            fields: grad_input_fields,
            model,
        },
    ];
    let surface_defs = surfaces.iter().map(Surface::definition);
    let surface_impls = surfaces.iter().map(Surface::impls);

    // `impl Module`: slices to the typed call and back.
    let in_locals = locals("input", model.inputs.len());
    let out_locals = locals("output", model.outputs.slots.len());
    let grad_locals = locals("grad_output", model.grad_outputs.len());
    let grad_in_locals = locals("grad_input", model.grad_inputs.slots.len());
    let out_pattern = destructure(&model.outputs, &out_locals);
    let grad_in_pattern = destructure(&model.grad_inputs, &grad_in_locals);
    let to_owned = model.inputs.iter().map(|arg| {
        let name = &arg.name;
        match arg.slot {
            Slot::Required => quote!(#private::Tensor::clone(#name)),
            Slot::Optional => quote!(#private::IntoSlot::into_slot(#name)),
        }
    });
    let input_names_str: Vec<String> = input_names.iter().map(|name| name.to_string()).collect();
    let grad_names_str: Vec<String> = grad_names.iter().map(|name| name.to_string()).collect();
    let num_grad_outputs = usize_lit(model.grad_outputs.len());

    let run_hooks = if model.hooks.is_empty() {
        TokenStream::new()
    } else {
        let arms = parse::HookKind::ALL.into_iter().map(|kind| {
            let variant = Ident::new(kind.variant(), Span::call_site());
            // Prepended hooks first, each group in declaration order.
            let ordered = model
                .hooks
                .iter()
                .filter(|hook| hook.kind == kind && hook.prepend)
                .chain(model.hooks.iter().filter(|hook| hook.kind == kind && !hook.prepend));
            let calls = ordered.map(|hook| {
                let method = &hook.method;
                let name = format!("{module}::{method}");
                quote_spanned! {method.span()=>
                    #private::hook(#self_ty::#method(self), #name)?;
                }
            });
            quote! { #private::HookKind::#variant => { #(#calls)* } }
        });
        quote! {
            fn run_hooks(&mut self, __kind: #private::HookKind) -> #private::Result<()> {
                match __kind {
                    #(#arms)*
                }
                #private::Ok(())
            }
        }
    };

    let module_impl = quote! {
        #[automatically_derived]
        impl #private::Module for #self_ty {
            fn name(&self) -> &'static str {
                #module
            }

            fn num_inputs(&self) -> usize {
                #num_inputs
            }

            fn forward(
                &self,
                __cx: &mut #private::Cx,
                __inputs: &[#private::Option<#private::Tensor>],
            ) -> #private::Result<#private::Vec<#private::Option<#private::Tensor>>> {
                let [#(#in_locals),*] = #private::slot_refs::<#num_inputs>(__inputs, #module, "inputs")?;
                let #out_pattern = #self_ty::forward(
                    self,
                    __cx,
                    #(#private::FromSlotRef::from_slot_ref(#in_locals, #module, #input_names_str)?,)*
                )?;
                #private::Ok(#private::vec![#(#private::IntoSlot::into_slot(#out_locals)),*])
            }

            fn backward(
                &mut self,
                __cx: &mut #private::Cx,
                __grad_outputs: &[#private::Option<#private::Tensor>],
            ) -> #private::Result<#private::Vec<#private::Option<#private::Tensor>>> {
                let [#(#grad_locals),*] =
                    #private::slot_refs::<#num_grad_outputs>(__grad_outputs, #module, "grad outputs")?;
                let #grad_in_pattern = #self_ty::backward(
                    self,
                    __cx,
                    #(#private::FromSlotRef::from_slot_ref(#grad_locals, #module, #grad_names_str)?,)*
                )?;
                #private::Ok(#private::vec![#(#private::IntoSlot::into_slot(#grad_in_locals)),*])
            }

            #run_hooks

            fn visit_params(&self, __f: &mut dyn FnMut(&str, &#private::Param)) {
                // Forwards to `Parameters` when the type implements it (autoref dispatch).
                #[allow(unused_imports)]
                use #private::{ParamsViaNothing as _, ParamsViaTrait as _};
                (&&#private::ParamsProbe(self)).__graphed_visit_params("", __f)
            }

            fn exposes_params(&self) -> bool {
                #[allow(unused_imports)]
                use #private::{ParamsViaNothing as _, ParamsViaTrait as _};
                (&&#private::ParamsProbe(self)).__graphed_has_params()
            }
        }
    };

    // The typed wrapper.
    let options = options_expr(&model.options, None);
    let options_doc = doc(format!("The options `#[graphed(...)]` gives `{module}`: {}.", options_text(&model.options)));
    let cx_name = &model.cx_name;
    let cx_ty = &model.cx_ty;
    let out_ty = &model.outputs.ty;
    let grad_ty = &model.grad_inputs.ty;
    let out_names: Vec<String> = (0..model.outputs.slots.len()).map(|index| format!("output {index}")).collect();
    let grad_in_names: Vec<String> = input_names.iter().map(|name| format!("grad of {name}")).collect();
    let out_build = build(&model.outputs, &out_locals, &private, &module, &out_names);
    let grad_build = build(&model.grad_inputs, &grad_in_locals, &private, &module, &grad_in_names);
    let num_grad_inputs = usize_lit(model.grad_inputs.slots.len());
    let wrapper_doc = doc(format!(
        "[`{module}`] captured into graphs by `#[graphed]`: `forward` and `backward` take and return what `{module}::forward` and `{module}::backward` do, and replay the captured graphs (the eager methods run instead in the mode the graphs were not captured for)."
    ));
    let make_graphed_doc = doc(format!(
        "Warms up and captures this module with the given tensors as samples ({}), and returns the typed graphed wrapper. The samples fix the shapes of the static input surface, [`{inputs_ty}`].",
        options_text(&model.options)
    ));

    let wrapper_def = quote! {
        #wrapper_doc
        ///
        /// Replays must follow capture order: one `forward`, then its `backward`, per step.
        #allow
        #vis struct #wrapper {
            __modules: #private::GraphedModules,
        }
    };

    let common_accessors = common_accessors(&private);
    let debug_impl = debug_impl(&wrapper, &private);
    let wrapper_impl = quote! {
        #[automatically_derived]
        impl #self_ty {
            #make_graphed_doc
            #vis fn make_graphed(self, #(#input_names: #input_tys),*) -> #private::CaptureResult<#wrapper, #self_ty> {
                #wrapper::new(
                    self,
                    #inputs_ty {
                        #(#input_names: #to_owned,)*
                    },
                    #wrapper::options(),
                )
            }
        }

        #[automatically_derived]
        impl #wrapper {
            #options_doc
            pub fn options() -> #private::GraphOptions {
                #options
            }

            /// Warms up and captures `module` on `sample` with `options` (see [`Self::options`]
            /// for the ones the attribute gives). On failure the error hands `module` back.
            pub fn new(
                module: #self_ty,
                sample: #inputs_ty,
                options: #private::GraphOptions,
            ) -> #private::CaptureResult<Self, #self_ty> {
                match #private::make_graphed(
                    #private::vec![#private::boxed(module)],
                    #private::vec![#private::vec![sample.into_slots()]],
                    options,
                ) {
                    #private::Ok(__modules) => #private::Ok(Self { __modules }),
                    #private::Err(__error) => #private::Err(__error.map(|__modules| {
                        let mut __modules = __modules.into_iter();
                        #private::unbox::<#self_ty>(__modules.next(), #module)
                    })),
                }
            }

            /// Replays the forward graph on these inputs and returns its static outputs.
            pub fn forward(&mut self, #cx_name: #cx_ty, #(#input_names: #input_tys),*) -> #private::Result<#out_ty> {
                let __outputs = self.__modules.forward(
                    0,
                    #cx_name,
                    &[#(#private::IntoSlot::into_slot(#input_names)),*],
                )?;
                let [#(#out_locals),*] = #private::slots::<#num_outputs>(__outputs, #module, "outputs")?;
                #private::Ok(#out_build)
            }

            /// Replays the backward graph of the oldest outstanding forward on these grads and
            /// returns the grads of the forward's inputs.
            pub fn backward(&mut self, #cx_name: #cx_ty, #(#grad_names: #grad_tys),*) -> #private::Result<#grad_ty> {
                let __grad_inputs = self.__modules.backward(
                    0,
                    #cx_name,
                    &[#(#private::IntoSlot::into_slot(#grad_names)),*],
                )?;
                let [#(#grad_in_locals),*] = #private::slots::<#num_grad_inputs>(__grad_inputs, #module, "grad inputs")?;
                #private::Ok(#grad_build)
            }

            /// The captured module.
            pub fn module(&self) -> &#self_ty {
                #private::expect_module(self.__modules.module::<#self_ty>(0), #module)
            }

            /// The captured module, mutably (its parameters, for an optimizer step).
            pub fn module_mut(&mut self) -> &mut #self_ty {
                #private::expect_module(self.__modules.module_mut::<#self_ty>(0), #module)
            }

            #common_accessors
        }

        #debug_impl
    };

    quote! {
        #item

        #(#surface_defs)*

        #wrapper_def

        #allow
        const _: () = {
            #module_impl

            #(#surface_impls)*

            #wrapper_impl
        };
    }
}

/// Builds the typed value from slot locals: a tuple or one value.
fn build(returned: &Returned, locals: &[Ident], private: &TokenStream, module: &str, names: &[String]) -> TokenStream {
    let values =
        locals.iter().zip(names).map(|(local, name)| quote!(#private::FromSlot::from_slot(#local, #module, #name)?));
    if returned.tuple {
        quote!((#(#values,)*))
    } else {
        quote!(#(#values)*)
    }
}

/// `GraphOptions::new().warmup(3)...` for the attribute's options.
fn options_expr(options: &validate::Options, order: Option<TokenStream>) -> TokenStream {
    let krate = &options.krate;
    let warmup = usize_lit(options.warmup);
    let allow_unused_input = options.allow_unused_input;
    let order = order.map(|order| quote!(.order(#order)));
    quote! {
        #krate::__private::GraphOptions::new()
            .warmup(#warmup)
            #order
            .allow_unused_input(#allow_unused_input)
    }
}

fn options_text(options: &validate::Options) -> String {
    let mut text = format!("`warmup = {}`", options.warmup);
    if options.allow_unused_input {
        text.push_str(", `allow_unused_input`");
    }
    text
}

fn expand_struct(item: &ItemStruct, model: &StructModel) -> TokenStream {
    let krate = &model.options.krate;
    let private = quote!(#krate::__private);
    let vis = &model.vis;
    let ident = &model.ident;
    let name = ident.to_string();
    let wrapper = format_ident!("Graphed{}", ident, span = ident.span());
    let allow = allow_lints();
    let num_chunks = usize_lit(model.chunks.len());
    let microbatches = usize_lit(model.microbatches);

    let (order_const, options) = match &model.order {
        Some(order) => {
            let entries = order.iter().map(|value| {
                let literal = Literal::i32_unsuffixed(*value);
                quote!(#literal)
            });
            let mut lines = vec![
                format!("The schedule `#[graphed(order = [...])]` gives [`{name}`], in capture and replay order."),
                String::new(),
                format!("`+c` runs the forward of chunk c for its next microbatch, `-c` the backward of its oldest outstanding one ({} chunks, {} microbatches):", model.chunks.len(), model.microbatches),
                String::new(),
            ];
            let mut seen_forward = vec![0usize; model.chunks.len()];
            let mut seen_backward = vec![0usize; model.chunks.len()];
            for (step, value) in order.iter().enumerate() {
                let index = value.unsigned_abs() as usize - 1;
                let (what, count) = if *value > 0 {
                    seen_forward[index] += 1;
                    ("forward", seen_forward[index])
                } else {
                    seen_backward[index] += 1;
                    ("backward", seen_backward[index])
                };
                lines.push(format!(
                    "{}. `{value:+}`: {what} of `{}`, microbatch {count}",
                    step + 1,
                    model.chunks[index].name
                ));
            }
            let docs = lines.iter().map(doc);
            (
                quote! {
                    #(#docs)*
                    pub const ORDER: &'static [i32] = &[#(#entries),*];
                },
                options_expr(&model.options, Some(quote!(#private::Vec::from(Self::ORDER)))),
            )
        }
        None => (
            quote! {
                /// No `order` was given: forwards run in chunk order, then backwards in reverse, one
                /// microbatch.
                pub const ORDER: &'static [i32] = &[];
            },
            options_expr(&model.options, None),
        ),
    };

    let fields: Vec<&Ident> = model.chunks.iter().map(|chunk| &chunk.name).collect();
    let field_tys: Vec<_> = model.chunks.iter().map(|chunk| &chunk.ty).collect();
    let field_names: Vec<String> = model.chunks.iter().map(|chunk| chunk.name.to_string()).collect();
    let boxed = model.chunks.iter().map(|chunk| {
        let (field, ty) = (&chunk.name, &chunk.ty);
        quote_spanned!(ty.span()=> #private::boxed::<#ty>(#field))
    });
    let chunk_methods = model.chunks.iter().enumerate().map(|(index, chunk)| {
        let (field, ty) = (&chunk.name, &chunk.ty);
        let index_lit = usize_lit(index);
        let number = index + 1;
        let forward = format_ident!("forward_{}", field);
        let backward = format_ident!("backward_{}", field);
        let module = format_ident!("module_{}", field);
        let module_mut = format_ident!("module_{}_mut", field);
        let forward_doc = doc(format!("Replays the forward of chunk {number} (`{field}`) for its next microbatch."));
        let backward_doc =
            doc(format!("Replays the backward of chunk {number} (`{field}`) for its oldest outstanding microbatch."));
        let module_doc = doc(format!("The module of chunk {number} (`{field}`)."));
        let module_mut_doc = doc(format!("The module of chunk {number} (`{field}`), mutably."));
        let field_name = field.to_string();
        quote! {
            #forward_doc
            pub fn #forward(
                &mut self,
                cx: &mut #private::Cx,
                inputs: &[#private::Option<#private::Tensor>],
            ) -> #private::Result<#private::Vec<#private::Option<#private::Tensor>>> {
                self.__modules.forward(#index_lit, cx, inputs)
            }

            #backward_doc
            pub fn #backward(
                &mut self,
                cx: &mut #private::Cx,
                grad_outputs: &[#private::Option<#private::Tensor>],
            ) -> #private::Result<#private::Vec<#private::Option<#private::Tensor>>> {
                self.__modules.backward(#index_lit, cx, grad_outputs)
            }

            #module_doc
            pub fn #module(&self) -> &#ty {
                #private::expect_module(self.__modules.module::<#ty>(#index_lit), #field_name)
            }

            #module_mut_doc
            pub fn #module_mut(&mut self) -> &mut #ty {
                #private::expect_module(self.__modules.module_mut::<#ty>(#index_lit), #field_name)
            }
        }
    });
    let chunk_list = model
        .chunks
        .iter()
        .enumerate()
        .map(|(index, chunk)| format!("{} `{}`", index + 1, chunk.name))
        .collect::<Vec<_>>()
        .join(", ");
    let wrapper_doc = doc(format!(
        "[`{name}`] captured into graphs by `#[graphed]`, one chunk per field (chunks {chunk_list}); see [`Self::ORDER`] for the schedule that calls must follow."
    ));
    let make_graphed_doc = doc(format!(
        "Warms up and captures the chunks ({}) following [`{wrapper}::ORDER`]. `samples[chunk][microbatch][input]` are sample inputs; one microbatch entry per chunk is used for every microbatch.",
        options_text(&model.options)
    ));
    let options_doc = doc(format!("The options `#[graphed(...)]` gives `{name}`, the schedule included."));
    let common_accessors = common_accessors(&private);
    let debug_impl = debug_impl(&wrapper, &private);

    quote! {
        #item

        #wrapper_doc
        #allow
        #vis struct #wrapper {
            __modules: #private::GraphedModules,
        }

        #allow
        const _: () = {
            #[automatically_derived]
            impl #ident {
                #make_graphed_doc
                #vis fn make_graphed(
                    self,
                    samples: #private::Vec<#private::Vec<#private::Vec<#private::Option<#private::Tensor>>>>,
                ) -> #private::CaptureResult<#wrapper, #ident> {
                    #wrapper::new(self, samples, #wrapper::options())
                }
            }

            #[automatically_derived]
            impl #wrapper {
                #order_const

                /// The number of chunks (fields).
                pub const CHUNKS: usize = #num_chunks;

                /// The number of microbatches per chunk the schedule runs.
                pub const MICROBATCHES: usize = #microbatches;

                #options_doc
                pub fn options() -> #private::GraphOptions {
                    #options
                }

                /// Warms up and captures the chunks of `module` with `options`. On failure the
                /// error hands `module` back, chunks and all.
                pub fn new(
                    module: #ident,
                    samples: #private::Vec<#private::Vec<#private::Vec<#private::Option<#private::Tensor>>>>,
                    options: #private::GraphOptions,
                ) -> #private::CaptureResult<Self, #ident> {
                    let #ident { #(#fields),* } = module;
                    match #private::make_graphed(
                        #private::Vec::from([#(#boxed),*]),
                        samples,
                        options,
                    ) {
                        #private::Ok(__modules) => #private::Ok(Self { __modules }),
                        #private::Err(__error) => #private::Err(__error.map(|__modules| {
                            let mut __modules = __modules.into_iter();
                            #ident { #(#fields: #private::unbox::<#field_tys>(__modules.next(), #field_names),)* }
                        })),
                    }
                }

                #(#chunk_methods)*

                #common_accessors
            }

            #debug_impl
        };
    }
}

/// `Debug` for a wrapper: its graphs, as `GraphedModules` prints them.
fn debug_impl(wrapper: &Ident, private: &TokenStream) -> TokenStream {
    quote! {
        #[automatically_derived]
        impl #private::fmt::Debug for #wrapper {
            fn fmt(&self, f: &mut #private::fmt::Formatter<'_>) -> #private::fmt::Result {
                #private::fmt::Debug::fmt(&self.__modules, f)
            }
        }
    }
}

/// The accessors every graphed wrapper has, over its `__modules` field.
fn common_accessors(private: &TokenStream) -> TokenStream {
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
            self.__modules
        }

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
