//! The struct form: `#[graphed(...)] struct S { embed: Embed, blocks: Vec<Block>, head: Head }`
//! becomes `GraphedS`, whose chunks are the fields in order (a stack's layers consecutive), and
//! `S::make_graphed`. Per-field calls take and return each chunk's own surface types; a chained
//! struct also gets whole-model calls (`chain`).

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemStruct};

use super::{allow_lints, buckets_fn, common_accessors, debug_impl, doc, options_text, usize_lit};
use crate::model::{Checkpointing, Field, Order, Pass, Stack, StructModel};

/// Names and paths one struct expansion shares.
pub(super) struct Names {
    pub private: TokenStream,
    pub ident: Ident,
    pub wrapper: Ident,
    /// The struct's name as a string, for messages.
    pub name: String,
    /// `__into_<struct>`: rebuilds the struct from its boxed chunks.
    pub rebuild: Ident,
}

/// The whole struct-form expansion.
pub(crate) fn expand(item: &ItemStruct, model: &StructModel) -> TokenStream {
    let krate = &model.options.krate;
    let ident = &model.ident;
    let names = Names {
        private: quote!(#krate::__private),
        ident: ident.clone(),
        wrapper: format_ident!("Graphed{}", ident, span = ident.span()),
        name: ident.to_string(),
        rebuild: format_ident!("__into_{}", ident),
    };
    let Names { private, wrapper, .. } = &names;
    let vis = &model.vis;
    let allow = allow_lints();
    let num_fields = usize_lit(model.fields.len());
    let wrapper_doc = wrapper_doc(model, &names);
    let consts = consts(model, &names);
    let (constructor, make_graphed) = constructor(model, &names);
    let rebuild = rebuild(model, &names);
    let field_methods = model.fields.iter().enumerate().map(|(index, field)| field_methods(index, field, private));
    let (wgrad_checks, wgrad_methods): (Vec<_>, Vec<_>) =
        model.fields.iter().enumerate().map(|(index, field)| wgrad_items(model, index, field, private)).unzip();
    let (chain_defs, chain_checks, chain_calls) = if model.chained {
        super::chain::expand(model, &names)
    } else {
        (TokenStream::new(), TokenStream::new(), TokenStream::new())
    };
    let common_accessors = common_accessors(private, !model.chained);
    let debug_impl = debug_impl(wrapper, private);
    let rebuild_fn = &names.rebuild;
    quote! {
        #item

        #chain_defs

        #wrapper_doc
        #allow
        #vis struct #wrapper {
            // Boxed: the wrapper stays small (enums holding it stay small).
            __modules: #private::Box<#private::GraphedModules>,
            /// The number of chunks of each field, in field order.
            __lens: [usize; #num_fields],
        }

        #allow
        const _: () = {
            #chain_checks

            #rebuild

            #make_graphed

            #[automatically_derived]
            impl #wrapper {
                #consts

                #constructor

                #chain_calls

                #(#field_methods)*

                #(#wgrad_methods)*

                /// Gives the struct back, its modules unchanged, dropping the graphs and their pool.
                pub fn into_module(self) -> #ident {
                    #rebuild_fn((*self.__modules).into_modules(), self.__lens)
                }

                #common_accessors
            }

            #debug_impl

            #(#wgrad_checks)*
        };
    }
}

/// "1 `embed`, 2 ..= 4 `blocks[0..3]`, 5 `head`" (fixed layout) or the same in words.
fn chunk_list(model: &StructModel) -> String {
    let mut parts = Vec::new();
    let mut next = Some(1usize);
    for field in &model.fields {
        let name = &field.name;
        let part = match (&field.stack, next, field.fixed_len()) {
            (Stack::Single, Some(c), _) => format!("{c} `{name}`"),
            (Stack::Single, None, _) => format!("then `{name}`"),
            (_, Some(c), Some(n)) => format!("{c} ..= {} `{name}[0..{n}]`", c + n - 1),
            (_, Some(c), None) => format!("{c} ..= {} + len `{name}[0..len]` (len: its length at construction)", c - 1),
            (_, None, _) => format!("then `{name}[0..]`"),
        };
        parts.push(part);
        next = next.zip(field.fixed_len()).map(|(c, n)| c + n);
    }
    parts.join(", ")
}

fn wrapper_doc(model: &StructModel, names: &Names) -> TokenStream {
    let name = &names.name;
    let order = if model.fixed_chunks().is_some() {
        "see [`Self::ORDER`] for the schedule calls must follow"
    } else {
        "the schedule is laid out at construction, once the stacks are counted"
    };
    let mut lines = vec![format!(
        "[`{name}`] captured into graphs by `#[graphed]`: one chunk per field, a stack's layers consecutive (chunks {}); {order}.",
        chunk_list(model)
    )];
    if model.chained {
        lines.push(String::new());
        lines.push(
            "Chained: each chunk's output is the next chunk's first input, in the same buffer (no copy between chunks). `forward`, `backward` and `step` run the whole model; the per-field calls run one chunk."
                .into(),
        );
    }
    let checkpointed: Vec<String> = model
        .fields
        .iter()
        .filter_map(|field| match field.checkpoint {
            Checkpointing::None => None,
            Checkpointing::Every(1) => Some(format!("`{}`", field.name)),
            Checkpointing::Every(k) => Some(format!("layers {k}, {}, ... of `{}` (1-indexed)", 2 * k, field.name)),
        })
        .collect();
    if !checkpointed.is_empty() {
        lines.push(String::new());
        lines.push(format!(
            "Checkpointed by default (their forward recomputed inside their backward; `GraphOptions::checkpoint` overrides): {}.",
            checkpointed.join(", ")
        ));
    }
    let docs = lines.iter().map(doc);
    quote!(#(#docs)*)
}

/// `ORDER` (a fixed layout's schedule, one doc line per step), `CHUNKS`, `MICROBATCHES`,
/// `options()` and the spec `new` completes options from.
fn consts(model: &StructModel, names: &Names) -> TokenStream {
    let Names { private, name, .. } = names;
    let microbatches = usize_lit(model.microbatches);
    let fixed = model.fixed_chunks();
    let order_const = match (&model.order, fixed) {
        (Some(Order::List(entries)), Some(_)) => {
            let docs = order_docs(model, entries).into_iter().map(doc);
            let entries = entries.iter().map(|entry| {
                let variant = format_ident!("{}", format!("{:?}", entry.pass));
                let chunk = usize_lit(entry.chunk);
                quote!(#private::OrderEntry::#variant(#chunk))
            });
            quote! {
                #(#docs)*
                pub const ORDER: &'static [#private::OrderEntry] = &[#(#entries),*];
            }
        }
        (None, Some(_)) => quote! {
            /// No `order` was given: forwards run in chunk order, then backwards in reverse, one
            /// microbatch.
            pub const ORDER: &'static [#private::OrderEntry] = &[];
        },
        _ => TokenStream::new(),
    };
    let chunks_const = fixed.map(|n| {
        let n = usize_lit(n);
        quote! {
            /// The number of chunks (a stack counts its layers).
            pub const CHUNKS: usize = #n;
        }
    });
    let spec_order = match (&model.order, fixed) {
        (Some(Order::List(_)), Some(_)) => quote!(#private::SpecOrder::List(Self::ORDER)),
        (Some(Order::Windowed { in_flight }), _) => {
            let in_flight = usize_lit(*in_flight);
            quote!(#private::SpecOrder::Windowed(#in_flight))
        }
        _ => quote!(#private::SpecOrder::None),
    };
    let fields = model.fields.iter().map(|field| {
        let field_name = field.name.to_string();
        let stack = !matches!(field.stack, Stack::Single);
        let every = usize_lit(match field.checkpoint {
            Checkpointing::None => 0,
            Checkpointing::Every(k) => k,
        });
        quote!(#private::FieldSpec { name: #field_name, stack: #stack, checkpoint_every: #every })
    });
    let chained = model.chained;
    let spec_buckets = match &model.options.buckets {
        Some(_) => quote!(#private::Some(Self::buckets)),
        None => quote!(#private::None),
    };
    let buckets_fn = buckets_fn(private, &model.options, name);
    let options = options_expr(model, names);
    let options_doc = doc(format!(
        "The options `#[graphed(...)]` gives `{name}` ({}): what `new` captures with unless told otherwise.",
        options_text(&model.options)
    ));
    quote! {
        #order_const

        #chunks_const

        /// The number of microbatches per chunk the schedule runs.
        pub const MICROBATCHES: usize = #microbatches;

        /// What the attribute says, for `new` to complete the options it is given.
        const __SPEC: #private::StructSpec = #private::StructSpec {
            name: #name,
            fields: &[#(#fields),*],
            chained: #chained,
            microbatches: Self::MICROBATCHES,
            order: #spec_order,
            buckets: #spec_buckets,
        };

        #options_doc
        pub fn options() -> #private::GraphOptions {
            #options
        }

        #buckets_fn
    }
}

/// The options expression: the shared keys, then what the struct's layout fixes at compile time.
fn options_expr(model: &StructModel, names: &Names) -> TokenStream {
    let private = &names.private;
    let warmup = usize_lit(model.options.warmup);
    let allow_unused_input = model.options.allow_unused_input;
    let chained = model.chained.then(|| quote!(.chained(true)));
    let buckets = model.options.buckets.as_ref().map(|_| quote!(.buckets(Self::buckets())));
    let order = match (&model.order, model.fixed_chunks()) {
        (Some(Order::List(_)), Some(_)) => Some(quote!(.order(Self::ORDER.iter().copied()))),
        _ => None,
    };
    // The checkpointed chunks, where the layout is fixed (otherwise `new` counts them).
    let checkpoint = model.chunk_names().and_then(|chunks| {
        let list: Vec<_> = chunks
            .iter()
            .enumerate()
            .filter(|(_, (_, field, layer))| model.fields[*field].checkpoints(*layer))
            .map(|(index, _)| usize_lit(index + 1))
            .collect();
        (!list.is_empty()).then(|| quote!(.checkpoint([#(#list),*])))
    });
    quote! {
        #private::GraphOptions::new()
            .warmup(#warmup)
            #chained
            #order
            #checkpoint
            #buckets
            .allow_unused_input(#allow_unused_input)
    }
}

/// One line per step of a fixed schedule.
fn order_docs(model: &StructModel, entries: &[crate::model::Entry]) -> Vec<String> {
    let name = &model.ident;
    let chunk_names = model.chunk_names().unwrap_or_default();
    let mut lines = vec![
        format!("The schedule `#[graphed(order = ...)]` gives [`{name}`], in capture and replay order."),
        String::new(),
        format!(
            "`+c` runs the forward of chunk c for its next microbatch, `-c` the backward of its oldest outstanding one{} ({} chunks, {} microbatches):",
            if entries.iter().any(|entry| entry.pass == Pass::Wgrad) {
                ", `w(c)` the weight grads of its oldest microbatch whose backward ran"
            } else {
                ""
            },
            chunk_names.len(),
            model.microbatches
        ),
        String::new(),
    ];
    let mut seen = vec![[0usize; 3]; chunk_names.len()];
    for (step, entry) in entries.iter().enumerate() {
        let index = entry.chunk - 1;
        let deferred = entries.iter().any(|e| e.pass == Pass::Wgrad && e.chunk == entry.chunk);
        let (written, what) = match entry.pass {
            Pass::Forward => (format!("+{}", entry.chunk), "forward"),
            Pass::Backward if deferred => (format!("-{}", entry.chunk), "input grads"),
            Pass::Backward => (format!("-{}", entry.chunk), "backward"),
            Pass::Wgrad => (format!("w({})", entry.chunk), "weight grads"),
        };
        seen[index][entry.pass as usize] += 1;
        let count = seen[index][entry.pass as usize];
        let chunk = chunk_names.get(index).map_or("?", |(name, _, _)| name.as_str());
        lines.push(format!("{}. `{written}`: {what} of `{chunk}`, microbatch {count}", step + 1));
    }
    lines
}

/// Each field's chunk count, from the module being captured.
fn lens(model: &StructModel) -> Vec<TokenStream> {
    model
        .fields
        .iter()
        .map(|field| match &field.stack {
            Stack::Single => quote!(1),
            Stack::Array { len_expr, .. } => quote!(#len_expr),
            Stack::Vec => {
                let name = &field.name;
                quote!(module.#name.len())
            }
        })
        .collect()
}

/// `fn __into_S(modules, lens) -> S`: the struct rebuilt from its boxed chunks (a failed
/// capture, `into_module`).
fn rebuild(model: &StructModel, names: &Names) -> TokenStream {
    let Names { private, ident, rebuild, .. } = names;
    let num_fields = usize_lit(model.fields.len());
    let fields = model.fields.iter().enumerate().map(|(index, field)| {
        let (name, ty) = (&field.name, &field.module);
        let name_str = name.to_string();
        let unbox = quote!(#private::unbox::<#ty>(__modules.next(), #name_str));
        let index = usize_lit(index);
        match &field.stack {
            Stack::Single => quote!(#name: #unbox),
            Stack::Array { .. } => quote!(#name: #private::array::from_fn(|_| #unbox)),
            Stack::Vec => quote!(#name: (0..__lens[#index]).map(|_| #unbox).collect()),
        }
    });
    quote! {
        /// The struct from its chunks, in field order.
        fn #rebuild(
            __modules: #private::Vec<#private::Box<dyn #private::Module>>,
            __lens: [usize; #num_fields],
        ) -> #ident {
            let _ = __lens;
            let mut __modules = __modules.into_iter();
            #ident { #(#fields,)* }
        }
    }
}

/// `new` (and `S::make_graphed`): count the chunks, complete the options, box the chunks in
/// order, capture; a failure hands the struct back.
fn constructor(model: &StructModel, names: &Names) -> (TokenStream, TokenStream) {
    let Names { private, ident, wrapper, rebuild, .. } = names;
    let vis = &model.vis;
    let fields: Vec<&Ident> = model.fields.iter().map(|field| &field.name).collect();
    let lens = lens(model);
    let push = model.fields.iter().map(|field| {
        let (name, ty) = (&field.name, &field.module);
        let boxed = quote_spanned!(field.ty.span()=> #private::boxed::<#ty>);
        match field.stack {
            Stack::Single => quote!(__chunks.push(#boxed(#name));),
            _ => quote!(__chunks.extend(#private::IntoIterator::into_iter(#name).map(#boxed));),
        }
    });
    let (sample_params, sample_args, samples, sample_doc) = if model.chained {
        let (inputs, extras) = (format_ident!("{}Inputs", ident), format_ident!("{}ExtraInputs", ident));
        (
            quote!(inputs: #inputs, extras: #extras,),
            quote!(inputs, extras,),
            quote! {
                let samples = #private::chain_samples(
                    __chunks.len(),
                    #private::Slots::into_slots(inputs),
                    #private::Slots::into_slots(extras),
                );
            },
            "`inputs` (the first chunk's) and `extras` (the last chunk's inputs after its first) are samples: their shapes and dtypes are the static surfaces', and `requires_grad` on an input says whether its grad is computed. Every later chunk's first input is the previous chunk's output, whose grad is always computed.".to_string(),
        )
    } else {
        (
            quote!(samples: #private::Vec<#private::Vec<#private::Vec<#private::Option<#private::Tensor>>>>,),
            quote!(samples,),
            quote! {
                if let #private::Err(__error) = #private::check_pipeline_samples(&__chunks, &samples) {
                    return #private::Err(#private::CaptureError::new(__error, #rebuild(__chunks, __lens)));
                }
            },
            "`samples[chunk][microbatch][input]` are sample inputs, chunks numbered in field order (a stack's layers consecutive); one microbatch entry per chunk stands for all. A chunk after the first reads the previous chunk's input grad in its backward, so its first sample input must require a grad (`Error::SampleNeedsGrad` otherwise).".into(),
        )
    };
    let make_graphed_doc = doc(format!(
        "Warms up and captures the chunks with [`{wrapper}::options`] ({}). {sample_doc} On failure the error hands the struct back.",
        options_text(&model.options)
    ));
    let new_doc = doc(format!("Warms up and captures the chunks of `module` with `options`. {sample_doc}"));
    let make_graphed = quote! {
        #[automatically_derived]
        impl #ident {
            #make_graphed_doc
            #vis fn make_graphed(self, #sample_params) -> #private::CaptureResult<#wrapper, #ident> {
                #wrapper::new(self, #sample_args #wrapper::options())
            }
        }
    };
    let new = quote! {
        #new_doc
        ///
        /// `options` is any `GraphOptions`; what it leaves unset comes from the
        /// attribute, as in [`Self::options`]: the schedule (`order`, laid out for the stacks'
        /// lengths), the checkpointed chunks (the fields' `#[graphed(checkpoint...)]`;
        /// `GraphOptions::checkpoint` and `no_checkpoint` override them) and the shape buckets
        /// (`buckets(...)`, unless `GraphOptions::buckets` names others). `warmup`,
        /// `allow_unused_input`, `reuse_buffers`, `capture_mode`, `pool`, `hooks` and `inference`
        /// are taken as given.
        ///
        /// Refused before anything runs, handing `module` back: an empty `Vec` stack
        /// (`Error::EmptyStack`), and whatever `make_graphed` refuses. On a failed capture the
        /// error hands `module` back too, chunks and all.
        pub fn new(
            module: #ident,
            #sample_params
            options: #private::GraphOptions,
        ) -> #private::CaptureResult<Self, #ident> {
            let __lens = [#(#lens),*];
            let __options = match #private::struct_options(&Self::__SPEC, &__lens, options) {
                #private::Ok(options) => options,
                #private::Err(__error) => return #private::Err(#private::CaptureError::new(__error, module)),
            };
            let #ident { #(#fields),* } = module;
            let mut __chunks: #private::Vec<#private::Box<dyn #private::Module>> =
                #private::Vec::with_capacity(__lens.iter().sum());
            #(#push)*
            #samples
            match #private::make_graphed(__chunks, samples, __options) {
                #private::Ok(__modules) => {
                    #private::Ok(Self { __modules: #private::Box::new(__modules), __lens })
                }
                #private::Err(__error) => {
                    #private::Err(__error.map(|__modules| #rebuild(__modules, __lens)))
                }
            }
        }
    };
    (new, make_graphed)
}

/// Per field: `forward_<f>`, `backward_<f>`, `module_<f>`, `module_<f>_mut`, typed by the
/// chunk's own surfaces (`<M as TypedModule>::Inputs`, ...); a stack's take the layer, and it
/// gets `len_<f>`.
fn field_methods(index: usize, field: &Field, private: &TokenStream) -> TokenStream {
    let (name, ty) = (&field.name, &field.module);
    let field_index = usize_lit(index);
    let name_str = name.to_string();
    let forward = format_ident!("forward_{}", name);
    let backward = format_ident!("backward_{}", name);
    let module = format_ident!("module_{}", name);
    let module_mut = format_ident!("module_{}_mut", name);
    let typed = quote_spanned!(field.ty.span()=> <#ty as #private::TypedModule>);
    if matches!(field.stack, Stack::Single) {
        let forward_doc = doc(format!(
            "Replays the forward of `{name}` for its next microbatch: the chunk's own inputs in, its outputs out."
        ));
        let backward_doc = doc(format!("Replays the backward of `{name}` for its oldest outstanding microbatch."));
        let module_doc = doc(format!("The module of `{name}`."));
        let module_mut_doc = doc(format!("The module of `{name}`, mutably."));
        return quote! {
            #forward_doc
            pub fn #forward(&mut self, inputs: #typed::Inputs) -> #private::Result<#typed::Outputs> {
                let __chunk = #private::chunk_of(&self.__lens, #field_index, 0)?;
                let __outputs = #private::Slots::with_slots(inputs, |inputs| self.__modules.forward(__chunk, inputs))?;
                #private::Slots::from_slots(__outputs)
            }

            #backward_doc
            pub fn #backward(&mut self, grad_outputs: #typed::GradOutputs) -> #private::Result<#typed::GradInputs> {
                let __chunk = #private::chunk_of(&self.__lens, #field_index, 0)?;
                let __grads = #private::Slots::with_slots(grad_outputs, |grads| self.__modules.backward(__chunk, grads))?;
                #private::Slots::from_slots(__grads)
            }

            #module_doc
            pub fn #module(&self) -> &#ty {
                let __chunk = #private::chunk_of(&self.__lens, #field_index, 0).ok();
                #private::expect_module(__chunk.and_then(|__chunk| self.__modules.module::<#ty>(__chunk)), #name_str)
            }

            #module_mut_doc
            pub fn #module_mut(&mut self) -> &mut #ty {
                let __chunk = #private::chunk_of(&self.__lens, #field_index, 0).ok();
                #private::expect_module(__chunk.and_then(|__chunk| self.__modules.module_mut::<#ty>(__chunk)), #name_str)
            }
        };
    }
    let len = format_ident!("len_{}", name);
    let forward_doc = doc(format!(
        "Replays the forward of layer `layer` of `{name}` (0-indexed) for its next microbatch: the layer's own inputs in, its outputs out. A layer out of range is `Error::ChunkOutOfRange`."
    ));
    let backward_doc =
        doc(format!("Replays the backward of layer `layer` of `{name}` for its oldest outstanding microbatch."));
    let module_doc = doc(format!("Layer `layer` of `{name}`, if the stack has it."));
    let module_mut_doc = doc(format!("Layer `layer` of `{name}`, mutably, if the stack has it."));
    let len_doc = doc(format!("The number of layers of `{name}` (its chunks)."));
    quote! {
        #forward_doc
        pub fn #forward(&mut self, layer: usize, inputs: #typed::Inputs) -> #private::Result<#typed::Outputs> {
            let __chunk = #private::chunk_of(&self.__lens, #field_index, layer)?;
            let __outputs = #private::Slots::with_slots(inputs, |inputs| self.__modules.forward(__chunk, inputs))?;
            #private::Slots::from_slots(__outputs)
        }

        #backward_doc
        pub fn #backward(&mut self, layer: usize, grad_outputs: #typed::GradOutputs) -> #private::Result<#typed::GradInputs> {
            let __chunk = #private::chunk_of(&self.__lens, #field_index, layer)?;
            let __grads = #private::Slots::with_slots(grad_outputs, |grads| self.__modules.backward(__chunk, grads))?;
            #private::Slots::from_slots(__grads)
        }

        #module_doc
        pub fn #module(&self, layer: usize) -> #private::Option<&#ty> {
            let __chunk = #private::chunk_of(&self.__lens, #field_index, layer).ok()?;
            self.__modules.module::<#ty>(__chunk)
        }

        #module_mut_doc
        pub fn #module_mut(&mut self, layer: usize) -> #private::Option<&mut #ty> {
            let __chunk = #private::chunk_of(&self.__lens, #field_index, layer).ok()?;
            self.__modules.module_mut::<#ty>(__chunk)
        }

        #len_doc
        pub fn #len(&self) -> usize {
            self.__lens[#field_index]
        }
    }
}

/// For a field with `w(c)` entries (a fixed layout's list): a compile-time check, spanned on
/// its first `w(c)`, that its module splits its backward, and `backward_weights_<f>`.
fn wgrad_items(model: &StructModel, index: usize, field: &Field, private: &TokenStream) -> (TokenStream, TokenStream) {
    let (Some(Order::List(entries)), Some(chunks)) = (&model.order, model.chunk_names()) else {
        return (TokenStream::new(), TokenStream::new());
    };
    let Some(first) = entries.iter().find(|entry| entry.pass == Pass::Wgrad && chunks[entry.chunk - 1].1 == index)
    else {
        return (TokenStream::new(), TokenStream::new());
    };
    let (name, ty) = (&field.name, &field.module);
    let number = first.chunk;
    let drop = if matches!(field.stack, Stack::Single) {
        format!("the `w({number})` entries")
    } else {
        format!("the `w(c)` entries of `{name}`")
    };
    let message = format!(
        "`w({number})` in `order`: chunk {number} (`{}`) does not split its backward; give its #[graphed] impl a `fn backward_weights(&mut self, cx: &mut Cx) -> Result<()>`, or drop {drop}",
        chunks[number - 1].0
    );
    let check = quote_spanned! {first.span=>
        const _: () = ::core::assert!(<#ty as #private::TypedModule>::SPLITS_BACKWARD, #message);
    };
    let method = format_ident!("backward_weights_{}", name);
    let field_index = usize_lit(index);
    let call = if matches!(field.stack, Stack::Single) {
        let method_doc = doc(format!(
            "Replays the weight grads (`w({number})`) of `{name}` for its oldest microbatch whose backward ran."
        ));
        quote! {
            #method_doc
            pub fn #method(&mut self) -> #private::Result<()> {
                let __chunk = #private::chunk_of(&self.__lens, #field_index, 0)?;
                self.__modules.backward_weights(__chunk)
            }
        }
    } else {
        let method_doc = doc(format!(
            "Replays the weight grads (`w(c)`) of layer `layer` of `{name}` for its oldest microbatch whose backward ran."
        ));
        quote! {
            #method_doc
            pub fn #method(&mut self, layer: usize) -> #private::Result<()> {
                let __chunk = #private::chunk_of(&self.__lens, #field_index, layer)?;
                self.__modules.backward_weights(__chunk)
            }
        }
    };
    (check, call)
}
