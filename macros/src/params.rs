//! `#[derive(Parameters)]`: parse the `#[param(...)]` attributes, validate them, and expand to
//! an `impl Parameters` that visits each parameter field under its field path.
//!
//! A field is visited through autoref dispatch (`__private::ParamsProbe`), so any field whose
//! type implements `Parameters` is found without annotations and any other field is left out.
//! Fields whose type names a generic parameter are visited through the trait directly with a
//! `Parameters` bound added, since dispatch in generic code cannot see the concrete type.
//! On errors the derive emits them plus an impl that visits nothing, so no follow-on errors.

use std::collections::HashSet;

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Fields, Ident, LitStr};

use crate::ctxt::Ctxt;
use crate::parse::list;

const FIELD_KEYS: &[&str] = &["skip", "nested", "rename"];
const CONTAINER_KEYS: &[&str] = &["crate"];

/// What `#[param(...)]` says about one field.
#[derive(Default)]
struct FieldAttrs {
    skip: Option<Ident>,
    nested: Option<Ident>,
    rename: Option<LitStr>,
}

/// One field to visit.
struct Visited<'a> {
    member: TokenStream,
    name: String,
    ty: &'a syn::Type,
    /// Visit through the trait (a compile error when the type does not implement it).
    direct: bool,
    generic: bool,
}

/// `#[derive(Parameters)]` on `input`.
pub fn derive(input: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(input) {
        Ok(input) => input,
        Err(error) => return error.into_compile_error(),
    };
    let mut cx = Ctxt::new();
    let krate = container_attrs(&mut cx, &input.attrs);
    let fields = match &input.data {
        Data::Struct(data) => visited_fields(&mut cx, &data.fields, &type_params(&input)),
        Data::Enum(data) => {
            cx.error_spanned_by(data.enum_token, "#[derive(Parameters)] goes on a struct; an enum's parameters depend on its variant, implement `graphed::Parameters` by hand");
            Vec::new()
        }
        Data::Union(data) => {
            cx.error_spanned_by(data.union_token, "#[derive(Parameters)] goes on a struct, not a union");
            Vec::new()
        }
    };
    match cx.check() {
        Ok(()) => expand(&input, &krate, &fields),
        Err(errors) => {
            let stub = expand(&input, &krate, &[]);
            let errors = errors.into_compile_error();
            quote!(#errors #stub)
        }
    }
}

fn type_params(input: &DeriveInput) -> HashSet<Ident> {
    input.generics.type_params().map(|p| p.ident.clone()).collect()
}

/// Whether `ty` names one of the generic type parameters.
fn mentions_generic(ty: &syn::Type, params: &HashSet<Ident>) -> bool {
    fn scan(tokens: TokenStream, params: &HashSet<Ident>) -> bool {
        tokens.into_iter().any(|token| match token {
            proc_macro2::TokenTree::Ident(ident) => params.contains(&ident),
            proc_macro2::TokenTree::Group(group) => scan(group.stream(), params),
            _ => false,
        })
    }
    !params.is_empty() && scan(ty.to_token_stream(), params)
}

fn visited_fields<'a>(cx: &mut Ctxt, fields: &'a Fields, generics: &HashSet<Ident>) -> Vec<Visited<'a>> {
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (index, field) in fields.iter().enumerate() {
        let attrs = field_attrs(cx, &field.attrs);
        if let Some(skip) = &attrs.skip {
            if attrs.nested.is_some() || attrs.rename.is_some() {
                cx.error_spanned_by(
                    skip,
                    "`skip` cannot be combined with `nested` or `rename`: a skipped field has no parameters",
                );
            }
            continue;
        }
        let (member, default_name) = match &field.ident {
            Some(ident) => (quote!(#ident), ident.to_string()),
            None => {
                let index = syn::Index::from(index);
                (quote!(#index), index.index.to_string())
            }
        };
        let name = attrs.rename.as_ref().map_or(default_name, LitStr::value);
        let span = attrs.rename.as_ref().map_or_else(|| field.span(), LitStr::span);
        if name.is_empty() || name.contains('.') {
            cx.error_at(
                span,
                format_args!("parameter name `{name}` must be non-empty and have no `.` (dots separate path segments)"),
            );
        } else if names.contains(&name) {
            cx.error_at(span, format_args!("a second field is named `{name}`; every parameter path must be unique"));
        }
        names.push(name.clone());
        let generic = mentions_generic(&field.ty, generics);
        out.push(Visited { member, name, ty: &field.ty, direct: attrs.nested.is_some() || generic, generic });
    }
    out
}

/// Consumes the `= value` of a key that is reported, so parsing goes on to the next key.
fn skip_value(meta: &syn::meta::ParseNestedMeta) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    }
    Ok(())
}

/// Reads the `#[param(...)]` attributes of a field, reporting unknown and duplicate keys.
fn field_attrs(cx: &mut Ctxt, attrs: &[Attribute]) -> FieldAttrs {
    let mut out = FieldAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("param")) {
        let result = attr.parse_nested_meta(|meta| {
            let Some(key) = meta.path.get_ident().cloned() else {
                return Err(meta.error(format_args!("expected one of {} in #[param(...)]", list(FIELD_KEYS))));
            };
            let duplicate = |cx: &mut Ctxt, set: bool| {
                if set {
                    cx.error_spanned_by(&key, format_args!("duplicate `{key}` in #[param(...)]"));
                }
            };
            match key.to_string().as_str() {
                "skip" => {
                    duplicate(cx, out.skip.is_some());
                    out.skip = Some(key.clone());
                }
                "nested" => {
                    duplicate(cx, out.nested.is_some());
                    out.nested = Some(key.clone());
                }
                "rename" => {
                    let value: LitStr = meta.value()?.parse()?;
                    duplicate(cx, out.rename.is_some());
                    out.rename = Some(value);
                }
                "crate" => {
                    cx.error_spanned_by(&key, "`crate` goes on the struct's #[param(...)], not on a field");
                    skip_value(&meta)?;
                }
                _ => {
                    cx.error_spanned_by(
                        &key,
                        format_args!("unknown key `{key}` in #[param(...)]; expected one of {}", list(FIELD_KEYS)),
                    );
                    skip_value(&meta)?;
                }
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    out
}

/// Reads the struct's `#[param(crate = "...")]`; the runtime's path.
fn container_attrs(cx: &mut Ctxt, attrs: &[Attribute]) -> syn::Path {
    let mut krate: Option<syn::Path> = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("param")) {
        let result = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let value: LitStr = meta.value()?.parse()?;
                if krate.is_some() {
                    cx.error_spanned_by(&meta.path, "duplicate `crate` in #[param(...)]");
                }
                match value.parse::<syn::Path>() {
                    Ok(path) => krate = Some(path),
                    Err(_) => cx.error_spanned_by(&value, "`crate` is a path, for example `crate = \"graphed\"`"),
                }
            } else if FIELD_KEYS.iter().any(|k| meta.path.is_ident(k)) {
                cx.error_spanned_by(&meta.path, "this key goes on a field's #[param(...)], not on the struct");
                skip_value(&meta)?;
            } else {
                cx.error_spanned_by(
                    &meta.path,
                    format_args!("unknown key in the struct's #[param(...)]; expected {}", list(CONTAINER_KEYS)),
                );
                skip_value(&meta)?;
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    krate.unwrap_or_else(|| syn::parse_quote!(::graphed))
}

fn expand(input: &DeriveInput, krate: &syn::Path, fields: &[Visited<'_>]) -> TokenStream {
    let private = quote!(#krate::__private);
    let ident = &input.ident;
    let mut generics = input.generics.clone();
    let where_clause = generics.make_where_clause();
    for field in fields.iter().filter(|f| f.generic) {
        let ty = field.ty;
        where_clause.predicates.push(syn::parse_quote!(#ty: #private::Parameters));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let visits = fields.iter().map(|field| {
        let (member, name, ty) = (&field.member, &field.name, field.ty);
        let path = quote!(&#private::param_path(__prefix, #name));
        if field.direct {
            quote_spanned! {ty.span()=>
                <#ty as #private::Parameters>::visit_params(&self.#member, #path, __f);
            }
        } else {
            quote! {
                (&&#private::ParamsProbe(&self.#member)).__graphed_visit_params(#path, __f);
            }
        }
    });
    quote! {
        #[allow(unused_qualifications, unused_imports, unused_variables, clippy::all, clippy::pedantic)]
        const _: () = {
            use #private::{ParamsViaNothing as _, ParamsViaTrait as _};
            #[automatically_derived]
            impl #impl_generics #private::Parameters for #ident #ty_generics #where_clause {
                fn visit_params(
                    &self,
                    __prefix: &str,
                    __f: &mut dyn FnMut(&str, &#private::Param),
                ) {
                    #(#visits)*
                }
            }
        };
    }
}
