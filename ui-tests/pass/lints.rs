//! The expansions compile without a warning under strict lints, in a crate whose public items
//! must all be documented.
#![deny(warnings, unused_qualifications, missing_docs, unused_imports, unreachable_pub)]
#![deny(clippy::all, clippy::pedantic)]

/// Public modules: every generated public item needs its doc comment.
pub mod layers {
    use graphed::{capture_time_hook, graphed, Cx, Result, Tensor};

    /// A documented public module.
    pub struct Block;

    #[graphed(warmup = 2, buckets(axis = 0, sizes = [4, 8], pad(1 = -1.0), above_largest = eager))]
    impl Block {
        /// The forward.
        pub fn forward(&self, _cx: &mut Cx, x: &Tensor, mask: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
            Ok((x.clone(), mask.cloned()))
        }

        /// The backward.
        pub fn backward(
            &mut self,
            _cx: &mut Cx,
            dy: &Tensor,
            dz: Option<&Tensor>,
        ) -> Result<(Option<Tensor>, Option<Tensor>)> {
            Ok((Some(dy.clone()), dz.cloned()))
        }

        #[capture_time_hook(pre_forward)]
        fn unshard(&mut self) {}

        #[capture_time_hook(backward, prepend)]
        fn reshard(&mut self) -> Result<()> {
            Ok(())
        }
    }

    /// A private module: its generated items stay private and unused without warnings.
    struct Hidden;

    #[graphed]
    impl Hidden {
        fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
            Ok(x.clone())
        }

        fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
            Ok(Some(dy.clone()))
        }
    }

    /// A module with parameters, nested, optional, repeated, generic and skipped.
    #[derive(graphed::Parameters)]
    pub struct Weights<T> {
        /// A weight.
        pub w: graphed::Param,
        /// Layers.
        pub layers: Vec<[graphed::Param; 2]>,
        /// A bias.
        pub b: Option<graphed::Param>,
        /// Generic parameters.
        pub extra: T,
        /// Not a parameter.
        pub scale: f32,
        /// Renamed.
        #[param(rename = "gain")]
        pub g: graphed::Param,
        /// Skipped.
        #[param(skip)]
        pub cache: graphed::Param,
    }

    /// One tensor in, one out: a chain link.
    pub struct Layer;

    #[graphed]
    impl Layer {
        /// The forward.
        pub fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
            Ok(x.clone())
        }

        /// The backward.
        pub fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
            Ok(Some(dy.clone()))
        }
    }

    /// A loss head: the previous output and targets.
    pub struct Loss;

    #[graphed]
    impl Loss {
        /// The forward.
        pub fn forward(&self, _cx: &mut Cx, x: &Tensor, _target: &Tensor) -> Result<Tensor> {
            Ok(x.clone())
        }

        /// The backward.
        pub fn backward(&mut self, _cx: &mut Cx, dloss: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
            Ok((Some(dloss.clone()), None))
        }
    }

    /// A whole model: stacks, chained, checkpointed layers, a schedule laid out at construction.
    #[graphed(chained, order = windowed(microbatches = 2, in_flight = 1), buckets(axis = 0, sizes = step(by = 4, max = 16)))]
    pub struct Model {
        /// The first chunk.
        pub first: Layer,
        /// A stack counted at construction.
        #[graphed(checkpoint_every = 2)]
        pub blocks: Vec<Layer>,
        /// A stack counted at compile time.
        #[graphed(checkpoint)]
        pub fixed: [Layer; 2],
        /// The last chunk.
        pub head: Loss,
    }

    /// A private model.
    #[graphed(chained, buckets(axis = 1, sizes = powers_of_two(min = 2, max = 8)))]
    struct PrivateModel {
        first: Layer,
        head: Loss,
    }

    /// Two chunks.
    #[graphed(warmup = 3, order = [1, 2, -2, -1])]
    pub struct TwoStage {
        /// The first chunk.
        pub first: Block,
        /// The second chunk.
        pub second: Block,
    }
}

fn main() {
    let _ = layers::TwoStage { first: layers::Block, second: layers::Block };
    let _ = layers::Model { first: layers::Layer, blocks: Vec::new(), fixed: [layers::Layer, layers::Layer], head: layers::Loss };
}
