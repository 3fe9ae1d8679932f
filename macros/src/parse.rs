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
pub const GRAPHED_KEYS: &[&str] = &["warmup", "order", "chained", "buckets", "allow_unused_input", "crate"];

/// The keys `buckets(...)` accepts, in the order error messages list them.
pub const BUCKETS_KEYS: &[&str] = &["axis", "sizes", "pad", "above_largest"];

/// The rules `sizes = ...` accepts besides a list.
pub const SIZE_RULES: &[&str] = &["powers_of_two", "step"];

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

/// `buckets(axis = A, sizes = ..., pad(i = v, ...), above_largest = eager)`: shape buckets
/// over one axis of the inputs, as `graphed::Buckets` builds them.
pub struct BucketsArgs {
    /// The `buckets` word, for spans.
    pub name: Ident,
    pub axis: Option<Arg<Expr>>,
    pub sizes: Option<Arg<SizesArg>>,
    pub pad: Option<Arg<Vec<PadEntry>>>,
    pub above_largest: Option<Arg<Ident>>,
    /// Whether an unknown sub-key was reported (a missing one is then likely misspelt, and
    /// not reported again).
    pub unknown_key: bool,
}

/// What `sizes = ...` gives: a list of sizes or a rule that lays them out.
pub enum SizesArg {
    /// `[128, 256, 512]`: its brackets' span and its entries, still unjudged.
    List { bracket_span: Span, entries: Vec<Expr> },
    /// `powers_of_two(min = 8, max = 256)` or `step(by = 64, max = 1024)`.
    Rule(Box<SizeRule>),
}

/// A rule of `sizes = ...`: its name and its two arguments (`min`/`by`, then `max`).
pub struct SizeRule {
    /// `powers_of_two` or `step`.
    pub name: Ident,
    /// `min = N` of `powers_of_two`, `by = N` of `step`.
    pub first: Option<Arg<Expr>>,
    pub max: Option<Arg<Expr>>,
    /// Whether an unknown argument was reported (as for [`BucketsArgs::unknown_key`]).
    pub unknown_key: bool,
}

impl SizeRule {
    /// The name of the rule's first argument.
    pub fn first_key(&self) -> &'static str {
        if self.name == "step" {
            "by"
        } else {
            "min"
        }
    }
}

/// One `input = value` of `pad(...)`: the input's index and the value it is padded with.
pub struct PadEntry {
    pub input: Expr,
    pub value: Expr,
}

/// `#[graphed(...)]` as written.
#[derive(Default)]
pub struct GraphedArgs {
    pub warmup: Option<Arg<Expr>>,
    pub order: Option<Arg<OrderArg>>,
    pub chained: Option<Arg<bool>>,
    pub buckets: Option<Arg<BucketsArgs>>,
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

/// `buckets(...)`, after the `buckets` word: the parenthesised sub-keys. Unknown and duplicate
/// sub-keys are recorded and parsing goes on; whether the values make sense is `validate`'s.
fn parse_buckets(cx: &mut Ctxt, name: Ident, input: ParseStream) -> syn::Result<BucketsArgs> {
    if !input.peek(syn::token::Paren) {
        return Err(syn::Error::new_spanned(
            &name,
            "`buckets` takes its sizes in parentheses: `buckets(axis = 1, sizes = [128, 256, 512])`",
        ));
    }
    let content;
    syn::parenthesized!(content in input);
    let mut args = BucketsArgs { name, axis: None, sizes: None, pad: None, above_largest: None, unknown_key: false };
    let parser = syn::meta::parser(|meta| {
        let Some(key) = meta.path.get_ident().cloned() else {
            return Err(meta.error(format_args!("expected one of {} in `buckets(...)`", list(BUCKETS_KEYS))));
        };
        match key.to_string().as_str() {
            "axis" => {
                let value: Expr = meta.value()?.parse()?;
                set_sub_once(cx, &mut args.axis, key, value);
            }
            "sizes" => {
                let value = parse_sizes(cx, meta.value()?)?;
                let is_list = |sizes: &SizesArg| matches!(sizes, SizesArg::List { .. });
                match &args.sizes {
                    // A list and a rule: say so rather than only "duplicate".
                    Some(first) if is_list(&first.value) != is_list(&value) => cx.error_spanned_by(
                        &key,
                        "the bucket sizes are a list (`sizes = [128, 256]`) or a rule (`sizes = powers_of_two(min = 8, max = 256)`), not both: keep one `sizes`",
                    ),
                    _ => set_sub_once(cx, &mut args.sizes, key, value),
                }
            }
            "pad" => {
                let value = parse_pad(meta.input)?;
                set_sub_once(cx, &mut args.pad, key, value);
            }
            "above_largest" => {
                let value: Ident = meta.value()?.parse()?;
                set_sub_once(cx, &mut args.above_largest, key, value);
            }
            _ => {
                args.unknown_key = true;
                cx.error_spanned_by(
                    &key,
                    format_args!("unknown `buckets` argument `{key}`; expected one of {}", list(BUCKETS_KEYS)),
                );
                skip_value(meta.input)?;
            }
        }
        Ok(())
    });
    parser.parse2(content.parse::<TokenStream>()?)?;
    Ok(args)
}

/// As [`set_once`], for the sub-keys of `buckets(...)`.
fn set_sub_once<T>(cx: &mut Ctxt, slot: &mut Option<Arg<T>>, key: Ident, value: T) {
    if slot.is_some() {
        cx.error_spanned_by(&key, format_args!("duplicate `{key}` in `buckets(...)`"));
    } else {
        *slot = Some(Arg { key, value });
    }
}

/// `sizes = [..]`, `sizes = powers_of_two(min = .., max = ..)` or `sizes = step(by = .., max = ..)`.
fn parse_sizes(cx: &mut Ctxt, input: ParseStream) -> syn::Result<SizesArg> {
    const FORMS: &str = "`sizes` is a list (`sizes = [128, 256, 512]`) or a rule: `sizes = powers_of_two(min = 8, max = 256)` or `sizes = step(by = 64, max = 1024)`";
    if input.peek(syn::token::Bracket) {
        let content;
        let bracket = syn::bracketed!(content in input);
        let entries = Punctuated::<Expr, Token![,]>::parse_terminated(&content)?;
        return Ok(SizesArg::List { bracket_span: bracket.span.join(), entries: entries.into_iter().collect() });
    }
    if !(input.peek(Ident) && input.peek2(syn::token::Paren)) {
        return Err(input.error(FORMS));
    }
    let name: Ident = input.parse()?;
    if !SIZE_RULES.iter().any(|rule| name == rule) {
        return Err(syn::Error::new_spanned(
            &name,
            format_args!("unknown rule `{name}` for the bucket sizes; expected a list or one of {}", list(SIZE_RULES)),
        ));
    }
    let content;
    syn::parenthesized!(content in input);
    let mut rule = SizeRule { name, first: None, max: None, unknown_key: false };
    let keys = [rule.first_key(), "max"];
    let rule_name = rule.name.clone();
    let parser = syn::meta::parser(|meta| {
        let Some(key) = meta.path.get_ident().cloned() else {
            return Err(meta.error(format_args!("expected one of {} in `{rule_name}(...)`", list(&keys))));
        };
        let slot = if key == keys[0] {
            &mut rule.first
        } else if key == "max" {
            &mut rule.max
        } else {
            rule.unknown_key = true;
            cx.error_spanned_by(
                &key,
                format_args!("unknown `{rule_name}` argument `{key}`; expected one of {}", list(&keys)),
            );
            return skip_value(meta.input);
        };
        let value: Expr = meta.value()?.parse()?;
        if slot.is_some() {
            cx.error_spanned_by(&key, format_args!("duplicate `{key}` in `{rule_name}(...)`"));
        } else {
            *slot = Some(Arg { key, value });
        }
        Ok(())
    });
    parser.parse2(content.parse::<TokenStream>()?)?;
    Ok(SizesArg::Rule(Box::new(rule)))
}

/// `pad(1 = -100.0, 2 = 0)`: input index `=` value, comma-separated (each pair reads as an
/// assignment expression, so a negative value needs no quoting).
fn parse_pad(input: ParseStream) -> syn::Result<Vec<PadEntry>> {
    const FORM: &str = "`pad` lists input = value pairs: `pad(1 = -100.0)` pads input 1 with -100.0";
    if !input.peek(syn::token::Paren) {
        return Err(input.error(FORM));
    }
    let content;
    syn::parenthesized!(content in input);
    let pairs = Punctuated::<Expr, Token![,]>::parse_terminated(&content)?;
    pairs
        .into_iter()
        .map(|pair| match pair {
            Expr::Assign(assign) => Ok(PadEntry { input: *assign.left, value: *assign.right }),
            other => Err(syn::Error::new_spanned(other, FORM)),
        })
        .collect()
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
            "buckets" => {
                let value = parse_buckets(cx, key.clone(), meta.input)?;
                set_once(cx, &mut args.buckets, key, value);
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
