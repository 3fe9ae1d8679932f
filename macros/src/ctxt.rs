//! Error collection, after serde_derive's `Ctxt`: every stage records its diagnostics here
//! instead of stopping at the first, so the user sees all of them in one build.

use std::fmt::Display;

use quote::ToTokens;

/// Collects `syn::Error`s; [`Ctxt::check`] combines them into one. A `Ctxt` must be checked:
/// dropping it unchecked is a bug in this crate and panics (as serde's does), so no stage can
/// lose the errors it recorded.
pub struct Ctxt {
    /// `None` once checked.
    errors: Option<Vec<syn::Error>>,
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if self.errors.is_some() && !std::thread::panicking() {
            panic!("graphed-macros: a Ctxt was dropped without checking its errors");
        }
    }
}

impl Ctxt {
    pub fn new() -> Self {
        Ctxt { errors: Some(Vec::new()) }
    }

    fn errors(&mut self) -> &mut Vec<syn::Error> {
        self.errors.get_or_insert_with(Vec::new)
    }

    /// Records an error spanned on `tokens` (first to last token).
    pub fn error_spanned_by<T: ToTokens>(&mut self, tokens: T, message: impl Display) {
        self.errors().push(syn::Error::new_spanned(tokens, message));
    }

    /// Records an error spanned on one span.
    pub fn error_at(&mut self, span: proc_macro2::Span, message: impl Display) {
        self.errors().push(syn::Error::new(span, message));
    }

    /// Records an error that syn produced (a parse error, for example).
    pub fn syn_error(&mut self, error: syn::Error) {
        self.errors().push(error);
    }

    /// How many errors are recorded so far.
    pub fn error_count(&self) -> usize {
        self.errors.as_ref().map_or(0, Vec::len)
    }

    /// All recorded errors combined into one, or `Ok` when there were none.
    pub fn check(mut self) -> syn::Result<()> {
        let mut errors = self.errors.take().unwrap_or_default().into_iter();
        let Some(mut combined) = errors.next() else { return Ok(()) };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}
