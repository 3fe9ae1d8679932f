//! Stage 1: parse the attributes' syntax into typed argument structs.
//!
//! Nothing here judges values (is `warmup` positive, is `order` a valid schedule): that is
//! [`crate::validate`]'s job. This stage only reports what cannot be read at all, unknown keys
//! (listing the valid ones) and duplicate keys.

use proc_macro2::{Span, TokenStream};
use syn::meta::ParseNestedMeta;
use syn::parse::{ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, Ident, LitBool, LitStr, Meta, Token};

use crate::ctxt::Ctxt;

/// The keys `#[graphed(...)]` accepts, in the order error messages list them.
pub const GRAPHED_KEYS: &[&str] = &["warmup", "order", "chained", "allow_unused_input", "crate"];

/// The keys `#[graphed(...)]` accepts on a field of a `#[graphed]` struct.
pub const FIELD_KEYS: &[&str] = &["checkpoint", "checkpoint_every"];

/// The hook kinds `#[capture_time_hook(...)]` accepts, in the order they run.
pub const HOOK_KINDS: &[&str] = &["pre_forward", "forward", "pre_backward", "backward"];

/// One `key = value` of an attribute, remembering the key for spans.
pub struct Arg<T> {
    pub key: Ident,
    pub value: T,
}

/// The `order = [...]` list: its brackets' span and its entries, still unjudged.
pub struct OrderList {
    pub bracket_span: Span,
    pub entries: Vec<Expr>,
}

/// `order = windowed(microbatches = M, in_flight = K)`: the common pipeline schedule, laid out
/// once the chunks are counted.
pub struct Windowed {
    /// The `windowed` word, for spans.
    pub name: Ident,
    pub microbatches: Option<Arg<Expr>>,
    pub in_flight: Option<Arg<Expr>>,
}

/// What `order = ...` gives: a list of entries or a schedule by name.
pub enum OrderArg {
    List(OrderList),
    Windowed(Box<Windowed>),
}

/// `#[graphed(...)]` as written.
#[derive(Default)]
pub struct GraphedArgs {
    pub warmup: Option<Arg<Expr>>,
    pub order: Option<Arg<OrderArg>>,
    pub chained: Option<Arg<bool>>,
    pub allow_unused_input: Option<Arg<bool>>,
    pub krate: Option<Arg<LitStr>>,
}

/// `#[graphed(...)]` on a field of a `#[graphed]` struct, as written.
#[derive(Default)]
pub struct FieldArgs {
    /// `checkpoint` (or `checkpoint = bool`).
    pub checkpoint: Option<Arg<bool>>,
    /// `checkpoint_every = k`.
    pub checkpoint_every: Option<Arg<Expr>>,
}

/// Sets a key once; a second occurrence is an error on the second key (serde's `Attr::set`).
fn set_once<T>(cx: &mut Ctxt, slot: &mut Option<Arg<T>>, key: Ident, value: T) {
    if slot.is_some() {
        cx.error_spanned_by(&key, format_args!("duplicate `{key}` key in #[graphed]"));
    } else {
        *slot = Some(Arg { key, value });
    }
}

/// Lists names as "`a`, `b`, `c`" for messages.
pub fn list(names: &[&str]) -> String {
    names.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
}

/// The key as an identifier; `crate` and other keywords included.
fn key_ident(meta: &ParseNestedMeta) -> syn::Result<Ident> {
    match meta.path.get_ident() {
        Some(ident) => Ok(ident.clone()),
        None => Err(syn::Error::new_spanned(
            &meta.path,
            format_args!("expected one of {} as a #[graphed] key", list(GRAPHED_KEYS)),
        )),
    }
}

/// Consumes whatever value follows an unknown key so parsing can go on to the next key.
fn skip_value(input: ParseStream) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        while !input.is_empty() && !input.peek(Token![,]) {
            input.parse::<proc_macro2::TokenTree>()?;
        }
    } else if input.peek(syn::token::Paren) {
        input.parse::<proc_macro2::TokenTree>()?;
    }
    Ok(())
}

fn parse_order(cx: &mut Ctxt, input: ParseStream) -> syn::Result<OrderArg> {
    if input.peek(Ident) && input.peek2(syn::token::Paren) {
        let fork = input.fork();
        if fork.parse::<Ident>()? == "windowed" {
            return parse_windowed(cx, input).map(|windowed| OrderArg::Windowed(Box::new(windowed)));
        }
    }
    if !input.peek(syn::token::Bracket) {
        return Err(input.error(
            "`order` is a list of chunk numbers, `+c` a forward and `-c` a backward (and `w(c)` the weight grads of a chunk that splits its backward): `order = [1, 2, -2, -1]`; or the schedule `windowed(microbatches = M, in_flight = K)`",
        ));
    }
    let content;
    let bracket = syn::bracketed!(content in input);
    let entries = Punctuated::<Expr, Token![,]>::parse_terminated(&content)?;
    Ok(OrderArg::List(OrderList { bracket_span: bracket.span.join(), entries: entries.into_iter().collect() }))
}

/// `windowed(microbatches = M, in_flight = K)`.
fn parse_windowed(cx: &mut Ctxt, input: ParseStream) -> syn::Result<Windowed> {
    const KEYS: &[&str] = &["microbatches", "in_flight"];
    let name: Ident = input.parse()?;
    let content;
    syn::parenthesized!(content in input);
    let mut windowed = Windowed { name, microbatches: None, in_flight: None };
    let parser = syn::meta::parser(|meta| {
        let Some(key) = meta.path.get_ident().cloned() else {
            return Err(meta.error(format_args!("expected one of {} in `windowed(...)`", list(KEYS))));
        };
        let slot = match key.to_string().as_str() {
            "microbatches" => &mut windowed.microbatches,
            "in_flight" => &mut windowed.in_flight,
            _ => {
                cx.error_spanned_by(
                    &key,
                    format_args!("unknown `windowed` argument `{key}`; expected one of {}", list(KEYS)),
                );
                return skip_value(meta.input);
            }
        };
        let value: Expr = meta.value()?.parse()?;
        if slot.is_some() {
            cx.error_spanned_by(&key, format_args!("duplicate `{key}` in `windowed(...)`"));
        } else {
            *slot = Some(Arg { key, value });
        }
        Ok(())
    });
    parser.parse2(content.parse::<TokenStream>()?)?;
    Ok(windowed)
}

/// Parses the arguments of `#[graphed(...)]`. Reports every unknown or duplicate key; a
/// syntax error inside one value stops the parse (the rest could not be read reliably).
pub fn graphed_args(cx: &mut Ctxt, tokens: TokenStream) -> GraphedArgs {
    let mut args = GraphedArgs::default();
    let parser = syn::meta::parser(|meta| {
        let key = key_ident(&meta)?;
        match key.to_string().as_str() {
            "warmup" => {
                let value: Expr = meta.value()?.parse()?;
                set_once(cx, &mut args.warmup, key, value);
            }
            "order" => {
                let value = parse_order(cx, meta.value()?)?;
                set_once(cx, &mut args.order, key, value);
            }
            "chained" => {
                let value = if meta.input.peek(Token![=]) { meta.value()?.parse::<LitBool>()?.value } else { true };
                set_once(cx, &mut args.chained, key, value);
            }
            "allow_unused_input" => {
                let value = if meta.input.peek(Token![=]) { meta.value()?.parse::<LitBool>()?.value } else { true };
                set_once(cx, &mut args.allow_unused_input, key, value);
            }
            "crate" => {
                let value: LitStr = meta.value()?.parse()?;
                set_once(cx, &mut args.krate, key, value);
            }
            _ => {
                cx.error_spanned_by(
                    &key,
                    format_args!("unknown #[graphed] key `{key}`; expected one of {}", list(GRAPHED_KEYS)),
                );
                skip_value(meta.input)?;
            }
        }
        Ok(())
    });
    if let Err(error) = parser.parse2(tokens) {
        cx.syn_error(error);
    }
    args
}

/// Whether an attribute is `#[graphed(...)]` (any path ending in that name).
pub fn is_graphed_attr(attr: &Attribute) -> bool {
    attr.path().segments.last().is_some_and(|segment| segment.ident == "graphed")
}

/// Parses the `#[graphed(...)]` attributes of one field of a `#[graphed]` struct.
pub fn field_args(cx: &mut Ctxt, attrs: &[Attribute]) -> FieldArgs {
    let mut args = FieldArgs::default();
    for attr in attrs.iter().filter(|attr| is_graphed_attr(attr)) {
        if let Meta::Path(path) = &attr.meta {
            cx.error_spanned_by(
                path,
                format_args!("#[graphed] on a field takes one of {}: `#[graphed(checkpoint)]`", list(FIELD_KEYS)),
            );
            continue;
        }
        let result = attr.parse_nested_meta(|meta| {
            let Some(key) = meta.path.get_ident().cloned() else {
                return Err(meta.error(format_args!("expected one of {} as a field key", list(FIELD_KEYS))));
            };
            match key.to_string().as_str() {
                "checkpoint" => {
                    let value = if meta.input.peek(Token![=]) { meta.value()?.parse::<LitBool>()?.value } else { true };
                    set_field_once(cx, &mut args.checkpoint, key, value);
                }
                "checkpoint_every" => {
                    let value: Expr = meta.value()?.parse()?;
                    set_field_once(cx, &mut args.checkpoint_every, key, value);
                }
                _ => {
                    cx.error_spanned_by(
                        &key,
                        format_args!("unknown #[graphed] field key `{key}`; expected one of {}", list(FIELD_KEYS)),
                    );
                    skip_value(meta.input)?;
                }
            }
            Ok(())
        });
        if let Err(error) = result {
            cx.syn_error(error);
        }
    }
    args
}

/// As [`set_once`], for field keys.
fn set_field_once<T>(cx: &mut Ctxt, slot: &mut Option<Arg<T>>, key: Ident, value: T) {
    if slot.is_some() {
        cx.error_spanned_by(&key, format_args!("duplicate `{key}` key in the field's #[graphed]"));
    } else {
        *slot = Some(Arg { key, value });
    }
}

/// The kind of a capture-time hook, as `graphed::HookKind` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookKind {
    PreForward,
    Forward,
    PreBackward,
    Backward,
}

impl HookKind {
    pub const ALL: [HookKind; 4] = [HookKind::PreForward, HookKind::Forward, HookKind::PreBackward, HookKind::Backward];

    fn from_name(name: &str) -> Option<HookKind> {
        HookKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The name used in the attribute.
    pub fn name(self) -> &'static str {
        match self {
            HookKind::PreForward => "pre_forward",
            HookKind::Forward => "forward",
            HookKind::PreBackward => "pre_backward",
            HookKind::Backward => "backward",
        }
    }

    /// The variant of `graphed::HookKind`.
    pub fn variant(self) -> &'static str {
        match self {
            HookKind::PreForward => "PreForward",
            HookKind::Forward => "Forward",
            HookKind::PreBackward => "PreBackward",
            HookKind::Backward => "Backward",
        }
    }
}

/// `#[capture_time_hook(kind)]` or `#[capture_time_hook(kind, prepend)]` as written.
pub struct HookAttr {
    pub kind: HookKind,
    pub prepend: bool,
}

/// Whether an attribute is `#[capture_time_hook...]` (any path ending in that name, so
/// `#[graphed::capture_time_hook(...)]` counts too).
pub fn is_hook_attr(attr: &Attribute) -> bool {
    attr.path().segments.last().is_some_and(|segment| segment.ident == "capture_time_hook")
}

/// Parses one `#[capture_time_hook(...)]`; `None` after recording an error.
pub fn hook_attr(cx: &mut Ctxt, attr: &Attribute) -> Option<HookAttr> {
    let expected =
        format!("#[capture_time_hook] needs a kind: one of {} (optionally followed by `prepend`)", list(HOOK_KINDS));
    if let Meta::Path(path) = &attr.meta {
        cx.error_spanned_by(path, &expected);
        return None;
    }
    let mut kind: Option<(Ident, HookKind)> = None;
    let mut prepend: Option<Ident> = None;
    let mut failed = false;
    let result = attr.parse_nested_meta(|meta| {
        let Some(word) = meta.path.get_ident().cloned() else {
            failed = true;
            cx.error_spanned_by(&meta.path, &expected);
            return Ok(());
        };
        if word == "prepend" {
            if prepend.is_some() {
                cx.error_spanned_by(&word, "duplicate `prepend` in #[capture_time_hook]");
                failed = true;
            }
            prepend = Some(word);
        } else if let Some(parsed) = HookKind::from_name(&word.to_string()) {
            if let Some((first, _)) = &kind {
                cx.error_spanned_by(
                    &word,
                    format_args!(
                        "a hook has one kind and this one is already `{first}`; add a second #[capture_time_hook({word})] to run it at both points"
                    ),
                );
                failed = true;
            } else {
                kind = Some((word, parsed));
            }
        } else {
            cx.error_spanned_by(
                &word,
                format_args!(
                    "unknown capture-time hook kind `{word}`; expected one of {} (optionally followed by `prepend`)",
                    list(HOOK_KINDS)
                ),
            );
            failed = true;
        }
        Ok(())
    });
    if let Err(error) = result {
        cx.syn_error(error);
        return None;
    }
    match kind {
        Some((_, kind)) if !failed => Some(HookAttr { kind, prepend: prepend.is_some() }),
        Some(_) => None,
        None => {
            if !failed {
                cx.error_spanned_by(attr, &expected);
            }
            None
        }
    }
}
