//! `impl Module for X`: the type-erased interface `make_graphed` drives, written once here
//! (the fallback's stub uses [`signature`] too). Positional slots go in, the user's typed
//! `forward`/`backward` run, slots come out.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;

use super::{destructure, usize_lit, ImplNames};
use crate::model::ModuleModel;
use crate::parse;

/// The `forward`/`backward` signatures of `Module`, as generated impls spell them.
pub(crate) fn signature(private: &TokenStream) -> (TokenStream, TokenStream) {
    (
        quote! {
            fn forward(
                &self,
                __cx: &mut #private::Cx,
                __inputs: &[#private::Option<#private::Tensor>],
            ) -> #private::Result<#private::Vec<#private::Option<#private::Tensor>>>
        },
        quote! {
            fn backward(
                &mut self,
                __cx: &mut #private::Cx,
                __grad_outputs: &[#private::Option<#private::Tensor>],
            ) -> #private::Result<#private::Vec<#private::Option<#private::Tensor>>>
        },
    )
}

/// The module's `impl Module`.
pub(crate) fn expand(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, self_ty, module, in_locals, out_locals, grad_locals, grad_in_locals, .. } = names;
    let (forward_sig, backward_sig) = signature(private);
    let num_inputs = usize_lit(model.inputs.len());
    let num_grad_outputs = usize_lit(model.grad_outputs.len());
    let out_pattern = destructure(&model.outputs, out_locals);
    let grad_in_pattern = destructure(&model.grad_inputs, grad_in_locals);
    let input_names_str: Vec<String> = model.inputs.iter().map(|arg| arg.name.to_string()).collect();
    let grad_names_str: Vec<String> = model.grad_outputs.iter().map(|arg| arg.name.to_string()).collect();
    let run_hooks = run_hooks(names, model);
    let wgrad = backward_weights(names, model);
    let backward = if model.forward_only {
        quote! {
            #backward_sig {
                let _ = (__cx, __grad_outputs);
                #private::Err(#private::Error::ForwardOnly { module: #private::String::from(#module) })
            }

            fn has_backward(&self) -> bool {
                false
            }
        }
    } else {
        quote! {
            #backward_sig {
                let [#(#grad_locals),*] =
                    #private::slot_refs::<#num_grad_outputs>(__grad_outputs, #module, "grad outputs")?;
                let #grad_in_pattern = #self_ty::backward(
                    self,
                    __cx,
                    #(#private::FromSlotRef::from_slot_ref(#grad_locals, #module, #grad_names_str)?,)*
                )?;
                #private::Ok(#private::vec![#(#private::IntoSlot::into_slot(#grad_in_locals)),*])
            }
        }
    };
    quote! {
        #[automatically_derived]
        impl #private::Module for #self_ty {
            fn name(&self) -> &'static str {
                #module
            }

            fn num_inputs(&self) -> usize {
                #num_inputs
            }

            #forward_sig {
                let [#(#in_locals),*] = #private::slot_refs::<#num_inputs>(__inputs, #module, "inputs")?;
                let #out_pattern = #self_ty::forward(
                    self,
                    __cx,
                    #(#private::FromSlotRef::from_slot_ref(#in_locals, #module, #input_names_str)?,)*
                )?;
                #private::Ok(#private::vec![#(#private::IntoSlot::into_slot(#out_locals)),*])
            }

            #backward

            #run_hooks

            #wgrad

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
    }
}

/// `run_hooks`: the declared hooks of each kind, prepended ones first, each group in
/// declaration order; nothing when the module declares none (the trait's default).
fn run_hooks(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, self_ty, module, .. } = names;
    if model.hooks.is_empty() {
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
    }
}

/// `splits_backward` and `backward_weights`, calling the user's `backward_weights`; nothing
/// when the impl has none (the trait's defaults: an unsplit backward).
fn backward_weights(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, self_ty, .. } = names;
    if !model.splits_backward {
        return TokenStream::new();
    }
    quote! {
        fn splits_backward(&self) -> bool {
            true
        }

        fn backward_weights(&mut self, __cx: &mut #private::Cx) -> #private::Result<()> {
            #self_ty::backward_weights(self, __cx)
        }
    }
}
