//! Snapshot tests of the expansion: each case's expansion pretty-printed (as `cargo expand`
//! shows it) and compared with `macros/tests/snapshots/<case>.rs`. Refresh with
//! `UPDATE_EXPECT=1 cargo test -p graphed-macros`.

use proc_macro2::TokenStream;
use quote::quote;

use crate::expand;

/// Pretty-prints an expansion; tokens that do not parse as a file are shown raw.
fn pretty(tokens: TokenStream) -> String {
    match syn::parse2::<syn::File>(tokens.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        Err(error) => format!("// does not parse as a file: {error}\n{tokens}\n"),
    }
}

fn snapshot(args: TokenStream, item: TokenStream) -> String {
    let input = pretty(quote!(#[graphed(#args)] #item));
    let input: String = input.lines().map(|line| format!("// {line}\n")).collect();
    format!("// Input:\n//\n{input}\n// Expansion:\n\n{}", pretty(expand::graphed(args, item)))
}

#[test]
fn block_with_hooks() {
    let expansion = snapshot(
        quote!(warmup = 3),
        quote! {
            impl Block {
                pub fn forward(&self, cx: &mut Cx, x: &Tensor, mask: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
                    todo!()
                }
                pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor, dz: Option<&Tensor>) -> Result<(Option<Tensor>, Option<Tensor>)> {
                    todo!()
                }
                #[capture_time_hook(pre_forward)]
                fn unshard(&mut self) -> Result<()> {
                    Ok(())
                }
                #[capture_time_hook(backward)]
                fn reshard(&mut self) {}
                #[capture_time_hook(backward, prepend)]
                fn flush(&mut self) {}
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/block_with_hooks.rs"].assert_eq(&expansion);
}

#[test]
fn linear_single_tensor() {
    let expansion = snapshot(
        quote!(warmup = 2, allow_unused_input),
        quote! {
            impl Linear {
                fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
                    todo!()
                }
                fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
                    todo!()
                }
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/linear_single_tensor.rs"].assert_eq(&expansion);
}

#[test]
fn inference_module() {
    let expansion = snapshot(
        quote!(warmup = 1),
        quote! {
            impl DecodeStep {
                pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
                    todo!()
                }
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/inference_module.rs"].assert_eq(&expansion);
}

#[test]
fn renamed_crate() {
    let expansion = snapshot(
        quote!(crate = "renamed"),
        quote! {
            impl Scale {
                pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
                    todo!()
                }
                pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
                    todo!()
                }
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/renamed_crate.rs"].assert_eq(&expansion);
    let code = expansion.split("// Expansion:").nth(1).unwrap_or_default();
    assert!(!code.contains("::graphed"), "the override reaches every path:\n{code}");
    assert!(code.contains("renamed::__private::Module"));
}

#[test]
fn two_stage_schedule() {
    let expansion = snapshot(
        quote!(warmup = 3, order = [1, 2, -2, 1, -1, 2, -2, -1]),
        quote! {
            pub struct TwoStage {
                first: Block,
                second: Block,
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/two_stage_schedule.rs"].assert_eq(&expansion);
}

#[test]
fn chained_model() {
    let expansion = snapshot(
        quote!(warmup = 2, chained),
        quote! {
            pub struct Gpt {
                pub embed: Embed,
                #[graphed(checkpoint_every = 2)]
                pub blocks: Vec<Block>,
                pub head: Head,
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/chained_model.rs"].assert_eq(&expansion);
    let code = expansion.split("// Expansion:").nth(1).unwrap_or_default();
    assert!(!code.lines().any(|line| line.trim_start().starts_with("#[graphed")), "field attributes are consumed");
}

#[test]
fn bucketed_loss() {
    let expansion = snapshot(
        quote!(buckets(axis = 0, sizes = powers_of_two(min = 8, max = 256), pad(1 = -100.0), above_largest = eager)),
        quote! {
            impl Loss {
                pub fn forward(&self, cx: &mut Cx, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
                    todo!()
                }
                pub fn backward(&mut self, cx: &mut Cx, dloss: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
                    todo!()
                }
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/bucketed_loss.rs"].assert_eq(&expansion);
}

#[test]
fn bucketed_model() {
    let expansion = snapshot(
        quote!(chained, buckets(axis = 1, sizes = [512, 128, 256])),
        quote! {
            pub struct Gpt {
                pub embed: Embed,
                pub blocks: Vec<Block>,
                pub head: Head,
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/bucketed_model.rs"].assert_eq(&expansion);
    let code = expansion.split("// Expansion:").nth(1).unwrap_or_default();
    assert!(code.contains("buckets: ::graphed::__private::Some(Self::buckets)"), "{code}");
}

#[test]
fn bucket_rules_and_pads_reach_the_runtime_api() {
    let code = |args: TokenStream| pretty(expand::graphed(args, ok_impl()));
    let step = code(quote!(buckets(axis = 1, sizes = step(by = 64, max = 1024))));
    assert!(step.contains("::graphed::__private::Buckets::step(1, 64, 1024)"), "{step}");
    let pads = code(quote!(buckets(axis = 0, sizes = [4], pad(0 = 1.5, 2 = -100), above_largest = error)));
    assert!(pads.contains("Buckets::new(0, [4]).pad(0, 1.5).pad(2, -100.0)\n"), "{pads}");
    assert!(!pads.contains("AboveLargest"), "`error` is the default: {pads}");
    let renamed = code(quote!(crate = "renamed", buckets(axis = 0, sizes = [4], above_largest = eager)));
    assert!(renamed.contains("renamed::__private::AboveLargest::Eager"), "{renamed}");
    assert!(!renamed.contains("::graphed"), "{renamed}");
}

#[test]
fn bucket_checks() {
    let one = |buckets: TokenStream| {
        let messages = errors(quote!(buckets #buckets), ok_impl());
        assert_eq!(messages.len(), 1, "{buckets}: {messages:#?}");
        messages.into_iter().next().unwrap_or_default()
    };
    assert_eq!(errors(quote!(buckets(axis = 1, sizes = [128, 256])), ok_impl()), Vec::<String>::new());
    assert_eq!(
        errors(quote!(buckets(axis = 0, sizes = powers_of_two(min = 8, max = 8), pad(1 = -1))), ok_impl()),
        Vec::<String>::new()
    );
    assert!(one(quote!((sizes = [128]))).starts_with("`buckets` needs `axis = N`"));
    assert!(one(quote!((axis = 1))).starts_with("`buckets` needs its sizes"));
    assert!(one(quote!((axis = 1, sizes = []))).starts_with("`sizes` lists no bucket"));
    assert!(one(quote!((axis = 1, sizes = [128, 0]))).contains("0 is not a size"));
    assert!(one(quote!((axis = 1, sizes = [128, -4]))).contains("not -4"));
    assert!(one(quote!((axis = 1, sizes = [n]))).contains("an integer literal"));
    assert!(one(quote!((axis = -1, sizes = [8]))).starts_with("`axis` is the index"));
    assert!(one(quote!((axis = 1, sizes = [8], sizes = step(by = 8, max = 64)))).contains("not both"));
    assert!(one(quote!((axis = 1, sizes = [8], sizes = [16]))).starts_with("duplicate `sizes` in `buckets(...)`"));
    assert!(one(quote!((axis = 1, axis = 2, sizes = [8]))).starts_with("duplicate `axis`"));
    assert!(one(quote!((axis = 1, sizes = powers_of_two(min = 512, max = 256))))
        .starts_with("`min = 512` is above `max = 256`"));
    assert!(one(quote!((axis = 1, sizes = step(by = 0, max = 256)))).contains("0 is not a size"));
    assert!(one(quote!((axis = 1, sizes = step(by = 64)))).starts_with("`step` needs `by = N` and `max = N`"));
    assert!(one(quote!((axis = 1, sizes = step(min = 64, max = 128)))).starts_with("unknown `step` argument `min`"));
    assert!(one(quote!((axis = 1, sizes = halves(min = 64, max = 128)))).starts_with("unknown rule `halves`"));
    let unknown = one(quote!((axis = 1, sizes = [8], padding(1 = 0.0))));
    assert_eq!(
        unknown,
        "unknown `buckets` argument `padding`; expected one of `axis`, `sizes`, `pad`, `above_largest`"
    );
    assert!(one(quote!((axis = 1, sizes = [8], pad(1 = 0.0, 1 = 2.0)))).starts_with("input 1 is padded twice"));
    assert!(one(quote!((axis = 1, sizes = [8], pad(1 = x)))).contains("a number literal"));
    assert!(one(quote!((axis = 1, sizes = [8], pad(1)))).starts_with("`pad` lists input = value pairs"));
    assert!(one(quote!((axis = 1, sizes = [8], above_largest = pad))).contains("one of `error`, `eager`"));
    assert!(one(quote!()).starts_with("`buckets` takes its sizes in parentheses"));
    // Every problem at once, the rest of the attribute still read.
    let all = errors(quote!(buckets(sizes = [0]), warmup = 0, colour = 1), ok_impl());
    assert_eq!(all.len(), 4, "{all:#?}");
    // A misspelt sub-key is reported once, not again as a missing one.
    assert!(one(quote!((axs = 1, sizes = [8]))).starts_with("unknown `buckets` argument `axs`"));
}

#[test]
fn a_renamed_crate_reaches_every_path_of_a_model() {
    let tokens = expand::graphed(
        quote!(crate = "renamed", chained, order = [1, 2, 3, -3, -2, -1, w(2)]),
        quote! {
            struct M {
                a: A,
                #[graphed(checkpoint)]
                b: [B; 1],
                c: C,
            }
        },
    );
    let code = pretty(tokens);
    assert!(!code.contains("::graphed"), "{code}");
    assert!(code.contains("renamed::__private::chain_link::<B>"), "{code}");
}

#[test]
fn fixed_stack_pipeline() {
    let expansion = snapshot(
        quote!(chained, order = windowed(microbatches = 2, in_flight = 1)),
        quote! {
            struct Stages {
                #[graphed(checkpoint)]
                first: Stage,
                rest: [Stage; 2],
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/fixed_stack_pipeline.rs"].assert_eq(&expansion);
}

#[test]
fn wgrad_schedule() {
    let expansion = snapshot(
        quote!(order = [1, 2, -2, -1, w(2), w(1)]),
        quote! {
            struct Split {
                first: Layer,
                second: Layer,
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/wgrad_schedule.rs"].assert_eq(&expansion);
}

#[test]
fn errors_keep_the_item() {
    let expansion = snapshot(
        quote!(warmup = 0, bogus = 1),
        quote! {
            impl Block {
                fn forward(&self, cx: &mut Cx, x: &Tensor, n: usize) -> Result<Tensor> {
                    todo!()
                }
                fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
                    todo!()
                }
                #[capture_time_hook(pre_forwrd)]
                fn unshard(&self) -> usize {
                    0
                }
            }
        },
    );
    expect_test::expect_file!["../tests/snapshots/errors_keep_the_item.rs"].assert_eq(&expansion);
}

/// The messages of the errors an expansion carries, in order.
fn errors(args: TokenStream, item: TokenStream) -> Vec<String> {
    let tokens = expand::graphed(args, item);
    let mut messages = Vec::new();
    let mut iter = tokens.into_iter().peekable();
    while let Some(token) = iter.next() {
        if let proc_macro2::TokenTree::Ident(ident) = &token {
            if ident == "compile_error" {
                // `compile_error ! { "message" }` (syn may emit `:: core :: compile_error`).
                iter.next();
                if let Some(proc_macro2::TokenTree::Group(group)) = iter.next() {
                    if let Ok(lit) = syn::parse2::<syn::LitStr>(group.stream()) {
                        messages.push(lit.value());
                    }
                }
            }
        }
    }
    messages
}

const OK_IMPL: &str = "impl Block {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> { todo!() }
    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> { todo!() }
}";

fn ok_impl() -> TokenStream {
    OK_IMPL.parse().unwrap_or_default()
}

fn order_errors(order: TokenStream) -> Vec<String> {
    errors(
        quote!(order = #order),
        quote!(
            struct S {
                a: A,
                b: B,
            }
        ),
    )
}

#[test]
fn valid_items_have_no_errors() {
    assert_eq!(errors(quote!(warmup = 3), ok_impl()), Vec::<String>::new());
    assert_eq!(order_errors(quote!([1, 2, -2, -1])), Vec::<String>::new());
    assert_eq!(order_errors(quote!([1, 2, -2, -1, 1, 2, -2, -1])), Vec::<String>::new());
    let broken = order_errors(quote!([1, -1, 2, -2]));
    assert_eq!(broken.len(), 1, "{broken:#?}");
    assert!(broken[0].starts_with("`-1` breaks the data flow"), "{broken:#?}");
}

#[test]
fn all_errors_are_reported_at_once() {
    let messages = errors(quote!(warmup = 0, bogus, warmup = 2), ok_impl());
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert!(messages[0].starts_with("unknown #[graphed] key `bogus`"), "{messages:#?}");
    assert!(messages[1].starts_with("duplicate `warmup`"), "{messages:#?}");
    assert!(messages[2].contains("not 0"), "{messages:#?}");
}

#[test]
fn order_checks() {
    let one = |order: TokenStream| {
        let messages = order_errors(order);
        assert_eq!(messages.len(), 1, "{messages:#?}");
        messages.into_iter().next().unwrap_or_default()
    };
    assert!(one(quote!([1, 2, 0, -2, -1])).contains("0 is not a chunk"));
    assert!(one(quote!([1, 2, 3, -2, -1])).starts_with("chunk 3 is out of range"));
    assert!(one(quote!([1, -2, 2, -1])).starts_with("backward of chunk 2"));
    assert!(one(quote!([1, 2, -2])).starts_with("`order` has 3 entries"));
    assert!(one(quote!([])).starts_with("`order` has 0 entries"));
    assert!(one(quote!([1, 2, -2, -1, 1, 2, -2, 1])).contains("chunk 1 (`a`) has 3 forwards and 1 backward"));
    assert!(one(quote!([1, x, -1, 2, -2])).starts_with("an `order` entry is a chunk number"));
}

#[test]
fn stack_and_field_checks() {
    let errors_of = |args: TokenStream, fields: TokenStream| errors(args, quote!(struct S { #fields }));
    let one = |args: TokenStream, fields: TokenStream| {
        let messages = errors_of(args, fields);
        assert_eq!(messages.len(), 1, "{messages:#?}");
        messages.into_iter().next().unwrap_or_default()
    };
    // A fixed stack's layers are chunks: 2 + 3 here.
    assert_eq!(
        errors_of(quote!(order = [1, 2, 3, 4, 5, -5, -4, -3, -2, -1]), quote!(a: A, b: [B; 4])),
        Vec::<String>::new()
    );
    let past = errors_of(quote!(order = [1, 2, 3, -3, -2, -1, 4, -4]), quote!(a: A, b: [B; 2]));
    assert!(
        past.iter().all(|m| m.contains("chunk 4 is out of range: this struct has 3 chunks (`a`, `b[0]`, `b[1]`)")),
        "{past:#?}"
    );
    assert!(one(quote!(order = [1, -1]), quote!(a: A, b: Vec<B>)).contains("counted only at construction"));
    assert!(one(quote!(order = [1, -1]), quote!(a: A, b: [B; N])).contains("counted only at construction"));
    assert_eq!(
        errors_of(quote!(order = windowed(microbatches = 4, in_flight = 2)), quote!(a: A, b: Vec<B>)),
        Vec::<String>::new()
    );
    assert!(one(quote!(order = windowed(microbatches = 4)), quote!(a: A)).contains("`windowed` needs `in_flight = N`"));
    assert!(one(quote!(order = windowed(microbatches = 0, in_flight = 1)), quote!(a: A))
        .contains("`microbatches` is a positive integer"));
    assert!(one(quote!(order = windowed(microbatches = 1, in_flight = 1, depth = 2)), quote!(a: A))
        .starts_with("unknown `windowed` argument `depth`"));
    assert!(one(quote!(), quote!(b: [B; 0])).starts_with("the stack `b` is empty"));
    assert!(one(quote!(chained), quote!(a: A)).contains("this struct has one chunk"));
    assert_eq!(errors_of(quote!(chained), quote!(a: Vec<A>)), Vec::<String>::new());
    assert!(
        one(quote!(), quote!(#[graphed(checkpoint_every = 2)] a: A)).starts_with("`checkpoint_every` is for a stack")
    );
    assert!(one(quote!(), quote!(#[graphed(checkpoint, checkpoint_every = 2)] a: Vec<A>)).contains("keep one"));
    assert!(one(quote!(), quote!(#[graphed(checkpoint, checkpoint)] a: A)).starts_with("duplicate `checkpoint`"));
    assert!(one(quote!(), quote!(#[graphed] a: A)).contains("takes one of `checkpoint`, `checkpoint_every`"));
    // A checkpointed chunk has no separate weight grads.
    let w = one(quote!(order = [1, 2, -2, -1, w(2)]), quote!(a: A, #[graphed(checkpoint_every = 1)] b: [B; 1]));
    assert!(w.starts_with("`w(2)`: chunk 2 (`b[0]`) is checkpointed"), "{w}");
    // Data flow through a stack.
    let flow = one(quote!(order = [1, 3, 2, -3, -2, -1]), quote!(a: [A; 3]));
    assert!(flow.starts_with("`3` breaks the data flow: the forward of chunk 3 (`a[2]`)"), "{flow}");
}

#[test]
fn wgrad_order_checks() {
    assert_eq!(order_errors(quote!([1, 2, -2, -1, w(2), w(1)])), Vec::<String>::new());
    assert_eq!(order_errors(quote!([1, 2, -2, w(2), -1])), Vec::<String>::new());
    let one = |order: TokenStream| {
        let messages = order_errors(order);
        assert_eq!(messages.len(), 1, "{messages:#?}");
        messages.into_iter().next().unwrap_or_default()
    };
    assert!(one(quote!([1, 2, w(2), -2, -1])).starts_with("weight grads of chunk 2 (`b`) before its backward"));
    assert!(one(quote!([1, 2, -2, -1, w(3)])).starts_with("chunk 3 is out of range"));
    assert!(one(quote!([1, 2, -2, -1, w(0)])).starts_with("`w(c)` takes a chunk number from 1"));
    assert!(one(quote!([1, 2, -2, -1, v(1)])).starts_with("an `order` entry is a chunk number"));
    assert!(one(quote!([1, 2, -2, -1, w(1), w(1)])).starts_with("weight grads of chunk 1"));
    assert!(one(quote!([1, 1, 2, 2, -2, -2, -1, -1, w(2)])).contains("`w(2)` none or 2 times"));
    assert!(one(quote!([1, 2, -2, w(2)])).starts_with("`order` has 3 forward and backward entries"));
}

#[test]
fn hook_checks() {
    let hook = |attr: TokenStream, sig: TokenStream| {
        let mut item = ok_impl();
        item = {
            let impl_item: syn::ItemImpl = match syn::parse2(item) {
                Ok(item) => item,
                Err(error) => return vec![error.to_string()],
            };
            let items = &impl_item.items;
            quote!(impl Block { #(#items)* #[capture_time_hook #attr] #sig {} })
        };
        errors(quote!(), item)
    };
    assert_eq!(hook(quote!((forward)), quote!(fn h(&mut self))), Vec::<String>::new());
    assert_eq!(hook(quote!((forward, prepend)), quote!(fn h(&mut self) -> Result<()>)), Vec::<String>::new());
    let first = |messages: Vec<String>| messages.into_iter().next().unwrap_or_default();
    assert!(first(hook(quote!((forwards)), quote!(fn h(&mut self)))).starts_with("unknown capture-time hook kind"));
    assert!(first(hook(quote!(), quote!(fn h(&mut self)))).contains("needs a kind"));
    assert!(first(hook(quote!((prepend)), quote!(fn h(&mut self)))).contains("needs a kind"));
    assert!(first(hook(quote!((forward, backward)), quote!(fn h(&mut self)))).starts_with("a hook has one kind"));
    assert!(first(hook(quote!((forward)), quote!(fn h(&self)))).contains("`&mut self`"));
    assert!(first(hook(quote!((forward)), quote!(fn h(&mut self, n: usize)))).contains("no arguments"));
    assert!(first(hook(quote!((forward)), quote!(fn h(&mut self) -> usize))).contains("not a value"));
    assert!(first(hook(quote!((forward)), quote!(fn h(&mut self) -> Result<usize>))).contains("not a value"));
}

#[test]
fn standalone_hook_is_an_error() {
    let tokens = expand::standalone_hook(
        quote!(forward),
        quote!(
            fn h(&mut self) {}
        ),
    );
    let text = tokens.to_string();
    assert!(text.contains("only allowed on methods inside a #[graphed] impl"), "{text}");
    assert!(text.contains("fn h"), "{text}");
}

/// The `compile_error!` messages of a `#[derive(Parameters)]` expansion.
fn derive_errors(item: TokenStream) -> Vec<String> {
    let mut messages = Vec::new();
    let mut iter = crate::params::derive(item).into_iter();
    while let Some(token) = iter.next() {
        if matches!(&token, proc_macro2::TokenTree::Ident(ident) if ident == "compile_error") {
            iter.next();
            if let Some(proc_macro2::TokenTree::Group(group)) = iter.next() {
                if let Ok(lit) = syn::parse2::<syn::LitStr>(group.stream()) {
                    messages.push(lit.value());
                }
            }
        }
    }
    messages
}

#[test]
fn derive_parameters() {
    let item = quote! {
        struct Net<T> {
            layers: Vec<Layer>,
            #[param(nested)]
            mlp: Mlp,
            #[param(rename = "head")]
            out: Param,
            #[param(skip)]
            cache: Param,
            inner: T,
        }
    };
    let input = pretty(quote!(#[derive(Parameters)] #item));
    let input: String = input.lines().map(|line| format!("// {line}\n")).collect();
    let expansion = format!("// Input:\n//\n{input}\n// Expansion:\n\n{}", pretty(crate::params::derive(item)));
    expect_test::expect_file!["../tests/snapshots/derive_parameters.rs"].assert_eq(&expansion);
}

#[test]
fn derive_parameters_errors_are_all_reported() {
    let messages = derive_errors(quote! {
        #[param(krate = "x")]
        struct Net {
            #[param(skip, rename = "a")]
            a: Param,
            #[param(nested, nested)]
            b: Param,
            #[param(frozen)]
            c: Param,
            #[param(rename = "d.e")]
            d: Param,
            #[param(rename = "b")]
            e: Param,
        }
    });
    assert_eq!(messages.len(), 6, "{messages:#?}");
    assert!(messages[0].starts_with("unknown key in the struct's #[param(...)]"), "{messages:#?}");
    assert!(messages[1].starts_with("`skip` cannot be combined"), "{messages:#?}");
    assert!(messages[2].starts_with("duplicate `nested`"), "{messages:#?}");
    assert!(messages[3].contains("expected one of `skip`, `nested`, `rename`"), "{messages:#?}");
    assert!(messages[4].contains("no `.`"), "{messages:#?}");
    assert!(messages[5].contains("a second field is named `b`"), "{messages:#?}");
    let messages = derive_errors(quote!(
        enum E {
            A(Param),
        }
    ));
    assert!(messages.len() == 1 && messages[0].contains("goes on a struct"), "{messages:#?}");
}
