//! The static surface structs of a module (`XInputs`, `XOutputs`, `XGradOutputs`,
//! `XGradInputs`): fields, docs, slot conversions, and the `TypedModule` impl that names them.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::Ident;

use super::{allow_lints, doc, locals, usize_lit, ImplNames};
use crate::model::{ModuleModel, Slot, TensorArg};

/// The static surface structs of a module: fields, docs and slot conversions.
pub(crate) struct Surface<'a> {
    name: Ident,
    doc: String,
    what: &'static str,
    fields: Vec<(Ident, Slot, String)>,
    model: &'a ModuleModel,
}

impl Surface<'_> {
    pub(crate) fn definition(&self) -> TokenStream {
        let krate = &self.model.options.krate;
        // Always `pub`: they are the associated types of the module's `TypedModule` impl, which
        // must be at least as visible as the module type (E0446), whatever `forward`'s visibility.
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
            pub struct #name {
                #(#fields)*
            }
        }
    }

    pub(crate) fn impls(&self) -> TokenStream {
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

/// Whether the forward's first tensor argument is a `&Tensor` followed by others: the module
/// gets an `XExtraInputs` surface (its inputs besides a chained previous output).
pub(crate) fn has_extra_inputs(model: &ModuleModel) -> bool {
    model.inputs.len() > 1 && model.inputs[0].slot == Slot::Required
}

/// The surfaces of `model`: inputs, outputs, grad outputs, grad inputs, and the extra inputs
/// when it has some.
pub(crate) fn surfaces<'a>(names: &ImplNames, model: &'a ModuleModel) -> Vec<Surface<'a>> {
    let module = &names.module;
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
    let mut surfaces = vec![
        Surface {
            name: names.inputs_ty.clone(),
            doc: format!(
                "The static input surface of [`{module}`]: one field per tensor argument of `{module}::forward`, in order. Capture records the graphs on buffers of these shapes; each replay copies its inputs into them (unless an input already is that buffer)."
            ),
            what: "inputs",
            fields: arg_fields(&model.inputs, "forward"),
            model,
        },
        Surface {
            name: names.outputs_ty.clone(),
            doc: format!(
                "The static outputs of [`{module}`]'s forward graph, one field per element `{module}::forward` returns. A replay writes them in place; a handle from an earlier replay reports itself stale rather than change under its holder."
            ),
            what: "outputs",
            fields: output_fields,
            model,
        },
        Surface {
            name: names.grad_outputs_ty.clone(),
            doc: format!(
                "The static grad-output surface of [`{module}`]'s backward graph: one field per argument of `{module}::backward`, that is one grad per forward output."
            ),
            what: "grad outputs",
            fields: arg_fields(&model.grad_outputs, "backward"),
            model,
        },
        Surface {
            name: names.grad_inputs_ty.clone(),
            doc: format!(
                "The static grad-input surface of [`{module}`]'s backward graph: one grad per tensor argument of `{module}::forward`."
            ),
            what: "grad inputs",
            fields: grad_input_fields,
            model,
        },
    ];
    if model.forward_only {
        // An inference module: no backward, so no grad surfaces (its `TypedModule` names `()`).
        surfaces.truncate(2);
    }
    if has_extra_inputs(model) {
        surfaces.push(Surface {
            name: names.extra_inputs_ty.clone(),
            doc: format!(
                "The tensor arguments of `{module}::forward` after its first: what a `#[graphed(chained)]` struct's `forward` takes for [`{module}`] when it is the last chunk (its first argument is the previous chunk's output)."
            ),
            what: "extra inputs",
            fields: arg_fields(&model.inputs[1..], "forward"),
            model,
        });
    }
    surfaces
}

/// `impl TypedModule for X`: the surface types, so a struct of chunks can type its per-chunk
/// methods by them; and the chain traits the forward's signature allows.
pub(crate) fn typed_module_impl(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, self_ty, inputs_ty, outputs_ty, grad_outputs_ty, grad_inputs_ty, .. } = names;
    let mut surface_tys = vec![inputs_ty, outputs_ty];
    if !model.forward_only {
        surface_tys.extend([grad_outputs_ty, grad_inputs_ty]);
    }
    if has_extra_inputs(model) {
        surface_tys.push(&names.extra_inputs_ty);
    }
    let surfaces = surfaces(names, model);
    let slots = surface_tys.into_iter().zip(&surfaces).map(|(ty, surface)| {
        let fields = surface.fields.iter().map(|(field, _, _)| field);
        quote! {
            #[automatically_derived]
            impl #private::Slots for #ty {
                fn into_slots(self) -> #private::Vec<#private::Option<#private::Tensor>> {
                    #ty::into_slots(self)
                }
                fn from_slots(
                    slots: #private::Vec<#private::Option<#private::Tensor>>,
                ) -> #private::Result<Self> {
                    #ty::from_slots(slots)
                }
                fn with_slots<R>(self, f: impl FnOnce(&[#private::Option<#private::Tensor>]) -> R) -> R {
                    f(&[#(#private::IntoSlot::into_slot(self.#fields)),*])
                }
            }
        }
    });
    let chain = chain_impls(names, model);
    // Only when true: the trait's default is false.
    let splits = model.splits_backward.then(|| {
        quote!(
            const SPLITS_BACKWARD: bool = true;
        )
    });
    let (grad_outputs, grad_inputs) =
        if model.forward_only { (quote!(()), quote!(())) } else { (quote!(#grad_outputs_ty), quote!(#grad_inputs_ty)) };
    quote! {
        #(#slots)*

        #[automatically_derived]
        impl #private::TypedModule for #self_ty {
            type Inputs = #inputs_ty;
            type Outputs = #outputs_ty;
            type GradOutputs = #grad_outputs;
            type GradInputs = #grad_inputs;
            #splits
        }

        #chain
    }
}

/// `ChainOut` when the forward returns one `Tensor`, `ChainIn` when its first argument is a
/// `&Tensor`, `ChainLink` when both and it takes nothing else.
fn chain_impls(names: &ImplNames, model: &ModuleModel) -> TokenStream {
    let ImplNames { private, self_ty, .. } = names;
    let out = model.outputs.slots == [Slot::Required];
    let input = model.inputs.first().is_some_and(|arg| arg.slot == Slot::Required);
    let out_impl = out.then(|| {
        quote! {
            #[automatically_derived]
            impl #private::ChainOut for #self_ty {}
        }
    });
    let in_impl = input.then(|| {
        let extra = if has_extra_inputs(model) {
            let ty = &names.extra_inputs_ty;
            quote!(#ty)
        } else {
            quote!(())
        };
        quote! {
            #[automatically_derived]
            impl #private::ChainIn for #self_ty {
                type Extra = #extra;
            }
        }
    });
    let link_impl = (out && input && model.inputs.len() == 1).then(|| {
        quote! {
            #[automatically_derived]
            impl #private::ChainLink for #self_ty {}
        }
    });
    quote!(#out_impl #in_impl #link_impl)
}
