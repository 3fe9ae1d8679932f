//! Procedural macros of [`graphed`](https://docs.rs/graphed): `#[graphed]` and
//! `#[capture_time_hook]`.
//!
//! This crate is an implementation detail: depend on `graphed`, which re-exports both macros
//! and is versioned in lockstep with this crate. The macros work in three stages, each in its
//! own module: `parse` reads the attributes into typed arguments, `validate` judges them and
//! the annotated item and builds a model, `expand` turns the model into code. Every stage
//! collects its errors in a `ctxt::Ctxt` so one build reports all of them, and on error the
//! user's item is emitted unchanged next to the errors (`fallback`).

mod ctxt;
mod expand;
mod fallback;
mod model;
mod params;
mod parse;
mod validate;

#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Captures a module's forward and backward into CUDA graphs, or a struct of modules (a whole
/// model, a pipeline) into one schedule. See the `graphed` crate's README for the full DSL.
///
/// On an inherent impl (`#[graphed(warmup = 3)] impl Block { fn forward ... fn backward ... }`)
/// it implements `graphed::Module` for the type and generates the static surfaces
/// (`BlockInputs`, `BlockOutputs`, `BlockGradOutputs`, `BlockGradInputs`, and
/// `BlockExtraInputs` for the arguments after a first `&Tensor`), the typed wrapper
/// `GraphedBlock` and `Block::make_graphed`. An impl with `forward` and no `backward` is an
/// inference module: forward graphs only, no grad surfaces, no `backward` on the wrapper. On a
/// struct with named fields
/// (`#[graphed(warmup = 3, order = [1, 2, -2, -1])] struct TwoStage { first: Block, second: Block }`)
/// the fields are the chunks, in order; a field `blocks: [Block; N]` or `blocks: Vec<Block>` is
/// a stack of consecutive chunks. It generates `GraphedTwoStage` (per-field calls, `into_module`)
/// and `TwoStage::make_graphed`; with `chained`, also the whole-model `forward`, `backward` and
/// `step` and the aliases `TwoStageInputs`, `TwoStageExtraInputs`, `TwoStageOutputs`,
/// `TwoStageGradOutputs`, `TwoStageGradInputs`.
///
/// Keys: `warmup = N` (a positive integer, default 3), `order = [..]` or `order =
/// windowed(microbatches = M, in_flight = K)` (structs only), `chained` (structs only: chunk i's
/// output is chunk i + 1's first input), `buckets(axis = A, sizes = [..])` (shape buckets, as
/// `graphed::Buckets`; `sizes = powers_of_two(min = .., max = ..)` or `step(by = .., max = ..)`,
/// then optionally `pad(input = value, ..)` and `above_largest = eager | error`; the wrapper's
/// `buckets()`, used by `new` unless its options name others), `allow_unused_input` (a flag, or `= bool`), `crate =
/// "path"` (where the runtime is, default `::graphed`). On a struct's field:
/// `#[graphed(checkpoint)]` (recompute the chunk's forward inside its backward) or
/// `#[graphed(checkpoint_every = k)]` (layers k, 2k, ... of a stack).
///
/// Split backward: an impl may also define `fn backward_weights(&mut self, cx: &mut Cx) ->
/// Result<()>` (recognised by name, like `forward` and `backward`). Then `backward` computes
/// the input grads only, saving in `cx` what the weight grads need, and `backward_weights`
/// accumulates the parameter grads from that context (`Module::splits_backward` is true). In a
/// struct's `order`, `w(c)` runs the weight grads of chunk c for its oldest microbatch whose
/// backward (`-c`) ran, in a graph of its own (`order = [1, 2, -2, -1, w(2), w(1)]`); the
/// wrapper gets `backward_weights_<field>` for such chunks. A chunk without `w(c)` entries runs
/// both halves at `-c`. Wrong `w(c)` entries (before their backward, not one per microbatch,
/// for a chunk whose type has no `backward_weights`) are compile errors on the entry.
#[proc_macro_attribute]
pub fn graphed(args: TokenStream, input: TokenStream) -> TokenStream {
    expand::graphed(args.into(), input.into()).into()
}

/// Marks a method of a `#[graphed]` impl as a capture-time hook: `#[capture_time_hook(kind)]`
/// or `#[capture_time_hook(kind, prepend)]` with kind one of `pre_forward`, `forward`,
/// `pre_backward`, `backward`, on `fn name(&mut self)` returning `()` or `Result<()>`.
///
/// `#[graphed]` consumes these attributes; used anywhere else this macro only reports an error.
#[proc_macro_attribute]
pub fn capture_time_hook(args: TokenStream, input: TokenStream) -> TokenStream {
    expand::standalone_hook(args.into(), input.into()).into()
}

/// Implements `graphed::Parameters` for a struct: visits each field whose type implements
/// `Parameters` (`Param`, `Vec<Param>`, `Option<Param>`, `[Param; N]`, nested deriving
/// structs, ...) under its field path (`layers.0.w`). Field attributes: `#[param(skip)]`,
/// `#[param(rename = "name")]`, `#[param(nested)]` (require the impl); struct attribute:
/// `#[param(crate = "path")]`. See `graphed::Parameters`.
#[proc_macro_derive(Parameters, attributes(param))]
pub fn derive_parameters(input: TokenStream) -> TokenStream {
    params::derive(input.into()).into()
}
