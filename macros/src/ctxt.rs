//! Error collection, after serde_derive's `Ctxt`: every stage records its diagnostics here
//! instead of stopping at the first, so the user sees all of them in one build.

use std::fmt::Display;

use quote::ToTokens;

/// Collects `syn::Error`s; [`Ctxt::check`] combines them into one.
#[derive(Default)]
pub struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    pub fn new() -> Self {
        Ctxt::default()
    }

    /// Records an error spanned on `tokens` (first to last token).
    pub fn error_spanned_by<T: ToTokens>(&mut self, tokens: T, message: impl Display) {
        self.errors.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error spanned on one span.
    pub fn error_at(&mut self, span: proc_macro2::Span, message: impl Display) {
        self.errors.push(syn::Error::new(span, message));
    }

    /// Records an error that syn produced (a parse error, for example).
    pub fn syn_error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// All recorded errors combined into one, or `Ok` when there were none.
    pub fn check(self) -> syn::Result<()> {
        let mut errors = self.errors.into_iter();
        let Some(mut combined) = errors.next() else { return Ok(()) };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}
