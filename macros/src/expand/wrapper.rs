//! The impl form's typed wrapper `GraphedX` and `X::make_graphed`: the same argument and
//! return types as the user's `forward` and `backward`, replaying the graphs.

use proc_macro2::TokenStream;
use quote::quote;
use syn::Ident;

use super::{
    allow_lints, buckets_fn, build, common_accessors, debug_impl, doc, options_expr, options_text, usize_lit, ImplNames,
};
use crate::model::{ModuleModel, Slot};

/// The wrapper's definition (next to the user's item) and its impls (inside the `const _`).
pub(crate) fn expand(names: &ImplNames, model: &ModuleModel) -> (TokenStream, TokenStream) {
    let ImplNames { private, self_ty, module, wrapper, .. } = names;
    let vis = &model.vis;
    let allow = allow_lints();
    let wrapper_doc = doc(if model.forward_only {
        format!(
            "[`{module}`] captured into graphs by `#[graphed]`: an inference module (its impl has no `backward`), so only its forward is captured; `forward` takes and returns what `{module}::forward` does and replays the forward graph (the eager method runs instead in the mode the graph was not captured for)."
        )
    } else {
        format!(
            "[`{module}`] captured into graphs by `#[graphed]`: `forward` and `backward` take and return what `{module}::forward` and `{module}::backward` do, and replay the captured graphs (the eager methods run instead in the mode the graphs were not captured for)."
        )
    });
    let wrapper_def = quote! {
        #wrapper_doc
        ///
        /// Replays must follow capture order: one `forward`, then its `backward`, per step.
        #allow
        #vis struct #wrapper {
            // Boxed: the wrapper stays pointer-sized (enums holding it stay small).
            __modules: #private::Box<#private::GraphedModules>,
        }
    };
    let make_graphed = make_graphed(names, model);
    let constructor = constructor(names, model);
    let calls = calls(names, model);
    let common_accessors = common_accessors(private, true);
    let debug_impl = debug_impl(wrapper, private);
    let wrapper_impl = quote! {
        #make_graphed

        #[automatically_derived]
        impl #wrapper {
            #constructor

            #calls

            /// The captured module.
            pub fn module(&self) -> &#self_ty {
                #private::expect_module(self.__modules.module::<#self_ty>(0), #module)
            }

            /// The captured module, mutably (its parameters, for an optimizer step).
            pub fn module_mut(&mut self) -> &mut #self_ty {
                #private::expect_module(self.__modules.module_mut::<#self_ty>(0), #module)
            }

            /// Gives the module back, unchanged, dropping the graphs and their pool.
            pub fn into_module(self) -> #self_ty {
                #private::unbox::<#self_ty>((*self.__modules).into_modules().into_iter().next(), #module)
            }

            #common_accessors
        }

        #debug_impl
    };
    (wrapper_def, wrapper_impl)
}

/// `X::make_graphed(self, <forward's tensors>)`: the samples are the forward's arguments.
fn make_graphed(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, self_ty, wrapper, inputs_ty, .. } = names;
    let vis = &model.vis;
    let input_names: Vec<&Ident> = model.inputs.iter().map(|arg| &arg.name).collect();
    let input_tys: Vec<&syn::Type> = model.inputs.iter().map(|arg| &arg.ty).collect();
    let to_owned = model.inputs.iter().map(|arg| {
        let name = &arg.name;
        match arg.slot {
            Slot::Required => quote!(#private::Tensor::clone(#name)),
            Slot::Optional => quote!(#private::IntoSlot::into_slot(#name)),
        }
    });
    let make_graphed_doc = doc(format!(
        "Warms up and captures this module with the given tensors as samples ({}), and returns the typed graphed wrapper. The samples fix the shapes of the static input surface, [`{inputs_ty}`]. On failure the error hands the module back.",
        options_text(&model.options)
    ));
    quote! {
        #[automatically_derived]
        impl #self_ty {
            #make_graphed_doc
            #vis fn make_graphed(self, #(#input_names: #input_tys),*) -> #private::CaptureResult<#wrapper, #self_ty> {
                #wrapper::new(self, #inputs_ty { #(#input_names: #to_owned,)* }, #wrapper::options())
            }
        }
    }
}

/// `options()` and `new(module, sample, options)`.
fn constructor(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, self_ty, module, inputs_ty, .. } = names;
    let options = options_expr(&model.options, None);
    let options_doc = doc(format!("The options `#[graphed(...)]` gives `{module}`: {}.", options_text(&model.options)));
    let buckets_fn = buckets_fn(private, &model.options, module);
    // The declared buckets complete the options `new` is given, as a struct's schedule does.
    let (buckets_doc, with_buckets) = match &model.options.buckets {
        Some(_) => (
            quote! {
                ///
                /// Without buckets of their own, `options` get [`Self::buckets`]; `sample` is
                /// then at the largest bucket's size.
            },
            quote!(let options = #private::attribute_buckets(options, Self::buckets);),
        ),
        None => (TokenStream::new(), TokenStream::new()),
    };
    quote! {
        #options_doc
        pub fn options() -> #private::GraphOptions {
            #options
        }

        #buckets_fn

        /// Warms up and captures `module` on `sample` with `options` (see [`Self::options`]
        /// for the ones the attribute gives). On failure the error hands `module` back.
        #buckets_doc
        pub fn new(
            module: #self_ty,
            sample: #inputs_ty,
            options: #private::GraphOptions,
        ) -> #private::CaptureResult<Self, #self_ty> {
            #with_buckets
            match #private::make_graphed(
                #private::vec![#private::boxed(module)],
                #private::vec![#private::vec![sample.into_slots()]],
                options,
            ) {
                #private::Ok(__modules) => #private::Ok(Self { __modules: #private::Box::new(__modules) }),
                #private::Err(__error) => #private::Err(__error.map(|__modules| {
                    let mut __modules = __modules.into_iter();
                    #private::unbox::<#self_ty>(__modules.next(), #module)
                })),
            }
        }
    }
}

/// The replaying `forward` and `backward`, typed like the user's.
fn calls(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, module, out_locals, grad_in_locals, .. } = names;
    let input_names: Vec<&Ident> = model.inputs.iter().map(|arg| &arg.name).collect();
    let input_tys: Vec<&syn::Type> = model.inputs.iter().map(|arg| &arg.ty).collect();
    let grad_names: Vec<&Ident> = model.grad_outputs.iter().map(|arg| &arg.name).collect();
    let grad_tys: Vec<&syn::Type> = model.grad_outputs.iter().map(|arg| &arg.ty).collect();
    let (out_ty, grad_ty) = (&model.outputs.ty, &model.grad_inputs.ty);
    let num_outputs = usize_lit(model.outputs.slots.len());
    let num_grad_inputs = usize_lit(model.grad_inputs.slots.len());
    let out_names: Vec<String> = (0..model.outputs.slots.len()).map(|index| format!("output {index}")).collect();
    let grad_in_names: Vec<String> = input_names.iter().map(|name| format!("grad of {name}")).collect();
    let out_build = build(&model.outputs, out_locals, private, module, &out_names);
    let grad_build = build(&model.grad_inputs, grad_in_locals, private, module, &grad_in_names);
    let backward = (!model.forward_only).then(|| {
        quote! {
            /// Replays the backward graph of the oldest outstanding forward on these grads and
            /// returns the grads of the forward's inputs.
            pub fn backward(&mut self, #(#grad_names: #grad_tys),*) -> #private::Result<#grad_ty> {
                let __grad_inputs = self.__modules.backward(0, &[#(#private::IntoSlot::into_slot(#grad_names)),*])?;
                let [#(#grad_in_locals),*] = #private::slots::<#num_grad_inputs>(__grad_inputs, #module, "grad inputs")?;
                #private::Ok(#grad_build)
            }
        }
    });
    quote! {
        /// Replays the forward graph on these inputs and returns its static outputs. No context
        /// is taken: the graphs keep what the forward saved until its backward.
        pub fn forward(&mut self, #(#input_names: #input_tys),*) -> #private::Result<#out_ty> {
            let __outputs = self.__modules.forward(0, &[#(#private::IntoSlot::into_slot(#input_names)),*])?;
            let [#(#out_locals),*] = #private::slots::<#num_outputs>(__outputs, #module, "outputs")?;
            #private::Ok(#out_build)
        }

        #backward
    }
}
