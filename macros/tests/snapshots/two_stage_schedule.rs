// Input:
//
// #[graphed(warmup = 3, order = [1, 2, -2, 1, -1, 2, -2, -1])]
// pub struct TwoStage {
//     first: Block,
//     second: Block,
// }

// Expansion:

pub struct TwoStage {
    first: Block,
    second: Block,
}
/// [`TwoStage`] captured into graphs by `#[graphed]`, one chunk per field (chunks 1 `first`, 2 `second`); see [`Self::ORDER`] for the schedule that calls must follow.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub struct GraphedTwoStage {
    __modules: ::graphed::__private::Box<::graphed::__private::GraphedModules>,
}
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
const _: () = {
    #[automatically_derived]
    impl TwoStage {
        /// Warms up and captures the chunks (`warmup = 3`) following [`GraphedTwoStage::ORDER`]. `samples[chunk][microbatch][input]` are sample inputs; one microbatch entry per chunk is used for every microbatch.
        pub fn make_graphed(
            self,
            samples: ::graphed::__private::Vec<
                ::graphed::__private::Vec<
                    ::graphed::__private::Vec<
                        ::graphed::__private::Option<::graphed::__private::Tensor>,
                    >,
                >,
            >,
        ) -> ::graphed::__private::CaptureResult<GraphedTwoStage, TwoStage> {
            GraphedTwoStage::new(self, samples, GraphedTwoStage::options())
        }
    }
    #[automatically_derived]
    impl GraphedTwoStage {
        /// The schedule `#[graphed(order = [...])]` gives [`TwoStage`], in capture and replay order.
        ///
        /// `+c` runs the forward of chunk c for its next microbatch, `-c` the backward of its oldest outstanding one (2 chunks, 2 microbatches):
        ///
        /// 1. `+1`: forward of `first`, microbatch 1
        /// 2. `+2`: forward of `second`, microbatch 1
        /// 3. `-2`: backward of `second`, microbatch 1
        /// 4. `+1`: forward of `first`, microbatch 2
        /// 5. `-1`: backward of `first`, microbatch 1
        /// 6. `+2`: forward of `second`, microbatch 2
        /// 7. `-2`: backward of `second`, microbatch 2
        /// 8. `-1`: backward of `first`, microbatch 2
        pub const ORDER: &'static [::graphed::__private::OrderEntry] = &[
            ::graphed::__private::OrderEntry::Forward(1),
            ::graphed::__private::OrderEntry::Forward(2),
            ::graphed::__private::OrderEntry::Backward(2),
            ::graphed::__private::OrderEntry::Forward(1),
            ::graphed::__private::OrderEntry::Backward(1),
            ::graphed::__private::OrderEntry::Forward(2),
            ::graphed::__private::OrderEntry::Backward(2),
            ::graphed::__private::OrderEntry::Backward(1),
        ];
        /// The number of chunks (fields).
        pub const CHUNKS: usize = 2;
        /// The number of microbatches per chunk the schedule runs.
        pub const MICROBATCHES: usize = 2;
        /// The options `#[graphed(...)]` gives `TwoStage`, the schedule included.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new()
                .warmup(3)
                .order(::graphed::__private::Vec::from(Self::ORDER))
                .allow_unused_input(false)
        }
        /// Warms up and captures the chunks of `module` with `options`. On failure the
        /// error hands `module` back, chunks and all.
        pub fn new(
            module: TwoStage,
            samples: ::graphed::__private::Vec<
                ::graphed::__private::Vec<
                    ::graphed::__private::Vec<
                        ::graphed::__private::Option<::graphed::__private::Tensor>,
                    >,
                >,
            >,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, TwoStage> {
            let TwoStage { first, second } = module;
            match ::graphed::__private::make_graphed(
                ::graphed::__private::Vec::from([
                    ::graphed::__private::boxed::<Block>(first),
                    ::graphed::__private::boxed::<Block>(second),
                ]),
                samples,
                options,
            ) {
                ::graphed::__private::Ok(__modules) => {
                    ::graphed::__private::Ok(Self {
                        __modules: ::graphed::__private::Box::new(__modules),
                    })
                }
                ::graphed::__private::Err(__error) => {
                    ::graphed::__private::Err(
                        __error
                            .map(|__modules| {
                                let mut __modules = __modules.into_iter();
                                TwoStage {
                                    first: ::graphed::__private::unbox::<
                                        Block,
                                    >(__modules.next(), "first"),
                                    second: ::graphed::__private::unbox::<
                                        Block,
                                    >(__modules.next(), "second"),
                                }
                            }),
                    )
                }
            }
        }
        /// Replays the forward of chunk 1 (`first`) for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_first(
            &mut self,
            inputs: <Block as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Block as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __outputs = self
                .__modules
                .forward(0, &::graphed::__private::Slots::into_slots(inputs))?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of chunk 1 (`first`) for its oldest outstanding microbatch.
        pub fn backward_first(
            &mut self,
            grad_outputs: <Block as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Block as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __grads = self
                .__modules
                .backward(0, &::graphed::__private::Slots::into_slots(grad_outputs))?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of chunk 1 (`first`).
        pub fn module_first(&self) -> &Block {
            ::graphed::__private::expect_module(
                self.__modules.module::<Block>(0),
                "first",
            )
        }
        /// The module of chunk 1 (`first`), mutably.
        pub fn module_first_mut(&mut self) -> &mut Block {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<Block>(0),
                "first",
            )
        }
        /// Replays the forward of chunk 2 (`second`) for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_second(
            &mut self,
            inputs: <Block as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Block as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __outputs = self
                .__modules
                .forward(1, &::graphed::__private::Slots::into_slots(inputs))?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of chunk 2 (`second`) for its oldest outstanding microbatch.
        pub fn backward_second(
            &mut self,
            grad_outputs: <Block as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Block as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __grads = self
                .__modules
                .backward(1, &::graphed::__private::Slots::into_slots(grad_outputs))?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of chunk 2 (`second`).
        pub fn module_second(&self) -> &Block {
            ::graphed::__private::expect_module(
                self.__modules.module::<Block>(1),
                "second",
            )
        }
        /// The module of chunk 2 (`second`), mutably.
        pub fn module_second_mut(&mut self) -> &mut Block {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<Block>(1),
                "second",
            )
        }
        /// The type-erased graphs (pool, run-time hooks, ...).
        pub fn inner(&self) -> &::graphed::__private::GraphedModules {
            &self.__modules
        }
        /// The type-erased graphs, mutably.
        pub fn inner_mut(&mut self) -> &mut ::graphed::__private::GraphedModules {
            &mut self.__modules
        }
        /// Unwraps the type-erased graphs.
        pub fn into_inner(self) -> ::graphed::__private::GraphedModules {
            *self.__modules
        }
        /// Builds the one-launch step once (see `GraphedModules::fuse`).
        pub fn fuse(&mut self) -> ::graphed::__private::Result<()> {
            self.__modules.fuse()
        }
        /// Replays one whole iteration of the schedule as one launch, on the inputs and grad
        /// outputs bound to the static buffers (see `GraphedModules::step`); call
        /// [`Self::fuse`] once first.
        pub fn step(&mut self) -> ::graphed::__private::Result<()> {
            self.__modules.step()
        }
        /// Switches to training mode: calls replay the graphs if they were captured in it, and
        /// run the eager forward otherwise.
        pub fn train(&mut self) {
            self.__modules.train();
        }
        /// Switches to eval mode: calls replay the graphs if they were captured in it, and run
        /// the eager forward otherwise.
        pub fn eval(&mut self) {
            self.__modules.eval();
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::fmt::Debug for GraphedTwoStage {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
