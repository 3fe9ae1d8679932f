//! A chained struct (`#[graphed(chained)] struct S { ... }`): the whole-model types
//! (`SInputs`, `SExtraInputs`, `SOutputs`, `SGradOutputs`, `SGradInputs`, aliases of the first
//! and last chunks' surfaces), the compile-time checks that neighbouring chunks fit (each
//! spanned on the field), and the typed `forward`, `backward` and `step`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use super::structs::Names;
use super::{allow_lints, doc, usize_lit};
use crate::model::{Field, Stack, StructModel};

/// The aliases (next to the struct), the checks (inside the `const _`) and the calls (in the
/// wrapper's impl).
pub(super) fn expand(model: &StructModel, names: &Names) -> (TokenStream, TokenStream, TokenStream) {
    let (Some(first), Some(last)) = (model.fields.first(), model.fields.last()) else {
        return (TokenStream::new(), TokenStream::new(), TokenStream::new());
    };
    (aliases(model, names, first, last), checks(model, names), calls(model, names))
}

fn aliases(model: &StructModel, names: &Names, first: &Field, last: &Field) -> TokenStream {
    let Names { private, ident, wrapper, .. } = names;
    let vis = &model.vis;
    let allow = allow_lints();
    let (first_ty, last_ty) = (&first.module, &last.module);
    let (first_name, last_name) = (&first.name, &last.name);
    let alias = |suffix: &str, ty: TokenStream, text: String| {
        let alias = format_ident!("{}{}", ident, suffix);
        let text = doc(text);
        quote! {
            #text
            #allow
            #vis type #alias = #ty;
        }
    };
    let typed = |ty: &syn::Type, assoc: &str| {
        let assoc = format_ident!("{}", assoc);
        quote!(<#ty as #private::TypedModule>::#assoc)
    };
    [
        alias(
            "Inputs",
            typed(first_ty, "Inputs"),
            format!("What [`{wrapper}::forward`] takes: the inputs of the first chunk (`{first_name}`)."),
        ),
        alias(
            "ExtraInputs",
            quote!(<#last_ty as #private::ChainIn>::Extra),
            format!(
                "What [`{wrapper}::forward`] takes for the last chunk (`{last_name}`) besides the previous chunk's output (its forward's other tensor arguments; `()` when it has none)."
            ),
        ),
        alias(
            "Outputs",
            typed(last_ty, "Outputs"),
            format!("What [`{wrapper}::forward`] returns: the outputs of the last chunk (`{last_name}`)."),
        ),
        alias(
            "GradOutputs",
            typed(last_ty, "GradOutputs"),
            format!("What [`{wrapper}::backward`] takes: the grads of the last chunk's (`{last_name}`) outputs."),
        ),
        alias(
            "GradInputs",
            typed(first_ty, "GradInputs"),
            format!("What [`{wrapper}::backward`] returns: the grads of the first chunk's (`{first_name}`) inputs."),
        ),
    ]
    .into_iter()
    .collect()
}

/// Chunk i's output is chunk i + 1's first input: the first field's module returns one
/// `Tensor`, the last one's takes a `&Tensor` first, the ones between (and every stack's
/// layers) both and nothing else. Each a trait bound checked at compile time, spanned on the
/// field's type, whose unmet bound reads as the trait's `on_unimplemented` message.
fn checks(model: &StructModel, names: &Names) -> TokenStream {
    let private = &names.private;
    let count = model.fields.len();
    let checks = model.fields.iter().enumerate().map(|(index, field)| {
        let ty = &field.module;
        let check = match (&field.stack, index) {
            (Stack::Single, 0) => quote!(chain_out),
            (Stack::Single, i) if i + 1 == count => quote!(chain_in),
            _ => quote!(chain_link),
        };
        quote_spanned! {field.ty.span()=>
            const _: () = #private::#check::<#ty>();
        }
    });
    quote!(#(#checks)*)
}

/// `forward` and `backward` (when the schedule runs whole chains) and the typed `step`.
fn calls(model: &StructModel, names: &Names) -> TokenStream {
    let Names { private, ident, name, .. } = names;
    let [inputs, extras, outputs, grad_outputs, grad_inputs] =
        ["Inputs", "ExtraInputs", "Outputs", "GradOutputs", "GradInputs"]
            .map(|suffix| format_ident!("{}{}", ident, suffix));
    let whole = model.whole_chains.then(|| {
        quote! {
            /// Replays the forward of every chunk, in order, for the next microbatch: the first
            /// chunk's `inputs` and the last chunk's `extras` in (copied into the static inputs
            /// unless they are those buffers), the last chunk's outputs out. Between chunks nothing
            /// is copied. Checked before the first chunk runs; a refused call changes nothing.
            pub fn forward(&mut self, inputs: #inputs, extras: #extras) -> #private::Result<#outputs> {
                let __modules = &mut self.__modules;
                let __outputs = #private::Slots::with_slots(inputs, |inputs| {
                    #private::Slots::with_slots(extras, |extras| __modules.forward_chain(inputs, extras))
                })?;
                #private::Slots::from_slots(__outputs)
            }

            /// Replays the backward of every chunk, last first, for the oldest outstanding
            /// microbatch: the grads of the last chunk's outputs in, the grads of the first chunk's
            /// inputs out (`None` for an input that needs none). Parameter grads accumulate.
            pub fn backward(&mut self, grad_outputs: #grad_outputs) -> #private::Result<#grad_inputs> {
                let __grads = #private::Slots::with_slots(grad_outputs, |grads| self.__modules.backward_chain(grads))?;
                #private::Slots::from_slots(__grads)
            }
        }
    });
    let step = if model.microbatches == 1 {
        quote! {
            /// Replays one whole step (every chunk's forward, then every backward) as one launch:
            /// `inputs`, `extras` and `grad_outputs` are copied into the step's buffers (unless
            /// they are those buffers), the last chunk's outputs come back. Call [`Self::fuse`]
            /// once first. Checked before the first copy; a refused step changes nothing.
            pub fn step(
                &mut self,
                inputs: #inputs,
                extras: #extras,
                grad_outputs: #grad_outputs,
            ) -> #private::Result<#outputs> {
                let __modules = &mut self.__modules;
                let __outputs = #private::Slots::with_slots(inputs, |inputs| {
                    #private::Slots::with_slots(extras, |extras| {
                        #private::Slots::with_slots(grad_outputs, |grads| {
                            __modules.step_chain(&[inputs], &[extras], &[grads])
                        })
                    })
                })?;
                let [__outputs] = #private::array_of::<_, 1>(__outputs, #name)?;
                #private::Slots::from_slots(__outputs)
            }
        }
    } else {
        let m = usize_lit(model.microbatches);
        let text = doc(format!(
            "Replays one whole step of the schedule ({} microbatches) as one launch: for each microbatch its `inputs`, `extras` and `grad_outputs`, copied into the step's buffers (unless they are those buffers); each microbatch's outputs of the last chunk come back. Call [`Self::fuse`] once first. Checked before the first copy; a refused step changes nothing.",
            model.microbatches
        ));
        quote! {
            #text
            pub fn step(
                &mut self,
                microbatches: [(#inputs, #extras, #grad_outputs); #m],
            ) -> #private::Result<[#outputs; #m]> {
                let __slots = microbatches.map(|(inputs, extras, grad_outputs)| {
                    (
                        #private::Slots::into_slots(inputs),
                        #private::Slots::into_slots(extras),
                        #private::Slots::into_slots(grad_outputs),
                    )
                });
                let __inputs: [&[#private::Option<#private::Tensor>]; #m] =
                    #private::array::from_fn(|m| __slots[m].0.as_slice());
                let __extras: [&[#private::Option<#private::Tensor>]; #m] =
                    #private::array::from_fn(|m| __slots[m].1.as_slice());
                let __grads: [&[#private::Option<#private::Tensor>]; #m] =
                    #private::array::from_fn(|m| __slots[m].2.as_slice());
                let __outputs = self.__modules.step_chain(&__inputs, &__extras, &__grads)?;
                let __outputs = __outputs
                    .into_iter()
                    .map(#private::Slots::from_slots)
                    .collect::<#private::Result<#private::Vec<#outputs>>>()?;
                #private::array_of::<_, #m>(__outputs, #name)
            }
        }
    };
    quote! {
        #whole

        #step
    }
}
