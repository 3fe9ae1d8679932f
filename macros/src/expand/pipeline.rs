//! The struct form: `#[graphed(order = [...])] struct S { first: A, second: B }` becomes
//! `GraphedS`, whose per-chunk methods take and return each chunk's own surface types, and
//! `S::make_graphed`, which captures the whole schedule.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemStruct};

use super::{allow_lints, common_accessors, debug_impl, doc, options_expr, options_text, usize_lit};
use crate::model::{Chunk, Pass, StructModel};

/// The whole struct-form expansion.
pub(crate) fn expand(item: &ItemStruct, model: &StructModel) -> TokenStream {
    let krate = &model.options.krate;
    let private = quote!(#krate::__private);
    let vis = &model.vis;
    let ident = &model.ident;
    let name = ident.to_string();
    let wrapper = format_ident!("Graphed{}", ident, span = ident.span());
    let allow = allow_lints();
    let (order_const, options) = schedule(model, &private);
    let chunk_methods = model.chunks.iter().enumerate().map(|(index, chunk)| chunk_methods(index, chunk, &private));
    let (wgrad_checks, wgrad_methods): (Vec<_>, Vec<_>) =
        model.chunks.iter().enumerate().map(|(index, chunk)| wgrad_items(model, index, chunk, &private)).unzip();
    let constructor = constructor(model, &private, &options);
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
    let num_chunks = usize_lit(model.chunks.len());
    let microbatches = usize_lit(model.microbatches);
    let common_accessors = common_accessors(&private);
    let debug_impl = debug_impl(&wrapper, &private);
    quote! {
        #item

        #wrapper_doc
        #allow
        #vis struct #wrapper {
            // Boxed: the wrapper stays pointer-sized (enums holding it stay small).
            __modules: #private::Box<#private::GraphedModules>,
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

                #constructor

                #(#chunk_methods)*

                #(#wgrad_methods)*

                #common_accessors
            }

            #debug_impl

            #(#wgrad_checks)*
        };
    }
}

/// `ORDER` with a doc line per step, and the options expression that passes it.
fn schedule(model: &StructModel, private: &TokenStream) -> (TokenStream, TokenStream) {
    let Some(order) = &model.order else {
        let order_const = quote! {
            /// No `order` was given: forwards run in chunk order, then backwards in reverse, one
            /// microbatch.
            pub const ORDER: &'static [#private::OrderEntry] = &[];
        };
        return (order_const, options_expr(&model.options, None));
    };
    let name = model.ident.to_string();
    let entries = order.iter().map(|entry| {
        let variant = format_ident!("{}", format!("{:?}", entry.pass));
        let chunk = usize_lit(entry.chunk);
        quote!(#private::OrderEntry::#variant(#chunk))
    });
    let mut lines = vec![
        format!("The schedule `#[graphed(order = [...])]` gives [`{name}`], in capture and replay order."),
        String::new(),
        format!(
            "`+c` runs the forward of chunk c for its next microbatch, `-c` the backward of its oldest outstanding one{} ({} chunks, {} microbatches):",
            if order.iter().any(|entry| entry.pass == Pass::Wgrad) {
                ", `w(c)` the weight grads of its oldest microbatch whose backward ran"
            } else {
                ""
            },
            model.chunks.len(),
            model.microbatches
        ),
        String::new(),
    ];
    let mut seen = vec![[0usize; 3]; model.chunks.len()];
    for (step, entry) in order.iter().enumerate() {
        let index = entry.chunk - 1;
        let (written, what) = match entry.pass {
            Pass::Forward => (format!("+{}", entry.chunk), "forward"),
            Pass::Backward if deferred(model, entry.chunk) => (format!("-{}", entry.chunk), "input grads"),
            Pass::Backward => (format!("-{}", entry.chunk), "backward"),
            Pass::Wgrad => (format!("w({})", entry.chunk), "weight grads"),
        };
        seen[index][entry.pass as usize] += 1;
        let count = seen[index][entry.pass as usize];
        lines.push(format!("{}. `{written}`: {what} of `{}`, microbatch {count}", step + 1, model.chunks[index].name));
    }
    let docs = lines.iter().map(doc);
    let order_const = quote! {
        #(#docs)*
        pub const ORDER: &'static [#private::OrderEntry] = &[#(#entries),*];
    };
    (order_const, options_expr(&model.options, Some(quote!(#private::Vec::from(Self::ORDER)))))
}

/// Whether chunk `number` (1-indexed) has `w(c)` entries in the schedule.
fn deferred(model: &StructModel, number: usize) -> bool {
    model.order.iter().flatten().any(|entry| entry.pass == Pass::Wgrad && entry.chunk == number)
}

/// For a chunk with `w(c)` entries: a compile-time check, spanned on its first `w(c)`, that its
/// module splits its backward, and `backward_weights_<field>`.
fn wgrad_items(model: &StructModel, index: usize, chunk: &Chunk, private: &TokenStream) -> (TokenStream, TokenStream) {
    let number = index + 1;
    let Some(first) = model.order.iter().flatten().find(|entry| entry.pass == Pass::Wgrad && entry.chunk == number)
    else {
        return (TokenStream::new(), TokenStream::new());
    };
    let (field, ty) = (&chunk.name, &chunk.ty);
    let message = format!(
        "`w({number})` in `order`: chunk {number} (`{field}`) does not split its backward; give its #[graphed] impl a `fn backward_weights(&mut self, cx: &mut Cx) -> Result<()>`, or drop the `w({number})` entries"
    );
    let check = quote_spanned! {first.span=>
        const _: () = ::core::assert!(<#ty as #private::TypedModule>::SPLITS_BACKWARD, #message);
    };
    let method = format_ident!("backward_weights_{}", field);
    let index_lit = usize_lit(index);
    let method_doc = doc(format!(
        "Replays the weight grads (`w({number})`) of chunk {number} (`{field}`) for its oldest microbatch whose backward ran."
    ));
    let call = quote! {
        #method_doc
        pub fn #method(&mut self) -> #private::Result<()> {
            self.__modules.backward_weights(#index_lit)
        }
    };
    (check, call)
}

/// `options()` and `new(..)`: boxes the chunks, captures, and on failure rebuilds the struct.
fn constructor(model: &StructModel, private: &TokenStream, options: &TokenStream) -> TokenStream {
    let ident = &model.ident;
    let fields: Vec<&Ident> = model.chunks.iter().map(|chunk| &chunk.name).collect();
    let field_tys: Vec<_> = model.chunks.iter().map(|chunk| &chunk.ty).collect();
    let field_names: Vec<String> = model.chunks.iter().map(|chunk| chunk.name.to_string()).collect();
    let boxed = model.chunks.iter().map(|chunk| {
        let (field, ty) = (&chunk.name, &chunk.ty);
        quote_spanned!(ty.span()=> #private::boxed::<#ty>(#field))
    });
    let options_doc = doc(format!("The options `#[graphed(...)]` gives `{ident}`, the schedule included."));
    quote! {
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
            match #private::make_graphed(#private::Vec::from([#(#boxed),*]), samples, options) {
                #private::Ok(__modules) => #private::Ok(Self { __modules: #private::Box::new(__modules) }),
                #private::Err(__error) => #private::Err(__error.map(|__modules| {
                    let mut __modules = __modules.into_iter();
                    #ident { #(#fields: #private::unbox::<#field_tys>(__modules.next(), #field_names),)* }
                })),
            }
        }
    }
}

/// `forward_<field>`, `backward_<field>`, `module_<field>` and `module_<field>_mut`: typed by
/// the chunk's own surfaces (`<Ty as TypedModule>::Inputs`, ...).
fn chunk_methods(index: usize, chunk: &Chunk, private: &TokenStream) -> TokenStream {
    let (field, ty) = (&chunk.name, &chunk.ty);
    let index_lit = usize_lit(index);
    let number = index + 1;
    let forward = format_ident!("forward_{}", field);
    let backward = format_ident!("backward_{}", field);
    let module = format_ident!("module_{}", field);
    let module_mut = format_ident!("module_{}_mut", field);
    let forward_doc = doc(format!(
        "Replays the forward of chunk {number} (`{field}`) for its next microbatch: the chunk's own inputs in, its outputs out."
    ));
    let backward_doc =
        doc(format!("Replays the backward of chunk {number} (`{field}`) for its oldest outstanding microbatch."));
    let module_doc = doc(format!("The module of chunk {number} (`{field}`)."));
    let module_mut_doc = doc(format!("The module of chunk {number} (`{field}`), mutably."));
    let field_name = field.to_string();
    let typed = quote_spanned!(ty.span()=> <#ty as #private::TypedModule>);
    quote! {
        #forward_doc
        pub fn #forward(&mut self, inputs: #typed::Inputs) -> #private::Result<#typed::Outputs> {
            let __outputs = self.__modules.forward(#index_lit, &#private::Slots::into_slots(inputs))?;
            #private::Slots::from_slots(__outputs)
        }

        #backward_doc
        pub fn #backward(&mut self, grad_outputs: #typed::GradOutputs) -> #private::Result<#typed::GradInputs> {
            let __grads = self.__modules.backward(#index_lit, &#private::Slots::into_slots(grad_outputs))?;
            #private::Slots::from_slots(__grads)
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
}
