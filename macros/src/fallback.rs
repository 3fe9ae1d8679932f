//! What to emit when `#[graphed]` finds errors: the user's item unchanged (less the hook
//! attributes it consumed) plus the errors, and a stub `Module` impl where the impl form was
//! meant, so the user sees the real errors and not follow-ons about a missing impl (as
//! thiserror's `fallback.rs` does).

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemImpl;

/// The item, then the errors.
pub fn item(item: TokenStream, errors: syn::Result<()>) -> TokenStream {
    let errors = errors.err().map(syn::Error::into_compile_error);
    quote! {
        #item
        #errors
    }
}

/// The impl (hook attributes stripped), the errors, and a stub `Module` impl when the impl
/// names a plain, non-generic type and is not a trait impl (otherwise the stub would only add
/// errors of its own).
pub fn graphed_impl(item: &ItemImpl, krate: &syn::Path, errors: syn::Result<()>) -> TokenStream {
    let stub = if item.trait_.is_none()
        && item.generics.params.is_empty()
        && matches!(&*item.self_ty, syn::Type::Path(path) if path.qself.is_none())
    {
        let self_ty = &item.self_ty;
        quote! {
            #[allow(unused_qualifications, unused_variables)]
            const _: () = {
                #[automatically_derived]
                impl #krate::__private::Module for #self_ty {
                    fn name(&self) -> &'static str {
                        ::core::unreachable!()
                    }
                    fn num_inputs(&self) -> usize {
                        ::core::unreachable!()
                    }
                    fn forward(
                        &self,
                        cx: &mut #krate::__private::Cx,
                        inputs: &[#krate::__private::Option<#krate::__private::Tensor>],
                    ) -> #krate::__private::Result<#krate::__private::Vec<#krate::__private::Option<#krate::__private::Tensor>>> {
                        ::core::unreachable!()
                    }
                    fn backward(
                        &mut self,
                        cx: &mut #krate::__private::Cx,
                        grad_outputs: &[#krate::__private::Option<#krate::__private::Tensor>],
                    ) -> #krate::__private::Result<#krate::__private::Vec<#krate::__private::Option<#krate::__private::Tensor>>> {
                        ::core::unreachable!()
                    }
                }
            };
        }
    } else {
        TokenStream::new()
    };
    let item = quote!(#item);
    let mut out = self::item(item, errors);
    out.extend(stub);
    out
}
