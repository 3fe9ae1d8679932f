// Input:
//
// #[graphed(order = [1, 2, -2, -1, w(2), w(1)])]
// struct Split {
//     first: Layer,
//     second: Layer,
// }

// Expansion:

struct Split {
    first: Layer,
    second: Layer,
}
/// [`Split`] captured into graphs by `#[graphed]`, one chunk per field (chunks 1 `first`, 2 `second`); see [`Self::ORDER`] for the schedule that calls must follow.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
struct GraphedSplit {
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
    impl Split {
        /// Warms up and captures the chunks (`warmup = 3`) following [`GraphedSplit::ORDER`]. `samples[chunk][microbatch][input]` are sample inputs; one microbatch entry per chunk is used for every microbatch.
        fn make_graphed(
            self,
            samples: ::graphed::__private::Vec<
                ::graphed::__private::Vec<
                    ::graphed::__private::Vec<
                        ::graphed::__private::Option<::graphed::__private::Tensor>,
                    >,
                >,
            >,
        ) -> ::graphed::__private::CaptureResult<GraphedSplit, Split> {
            GraphedSplit::new(self, samples, GraphedSplit::options())
        }
    }
    #[automatically_derived]
    impl GraphedSplit {
        /// The schedule `#[graphed(order = [...])]` gives [`Split`], in capture and replay order.
        ///
        /// `+c` runs the forward of chunk c for its next microbatch, `-c` the backward of its oldest outstanding one, `w(c)` the weight grads of its oldest microbatch whose backward ran (2 chunks, 1 microbatches):
        ///
        /// 1. `+1`: forward of `first`, microbatch 1
        /// 2. `+2`: forward of `second`, microbatch 1
        /// 3. `-2`: input grads of `second`, microbatch 1
        /// 4. `-1`: input grads of `first`, microbatch 1
        /// 5. `w(2)`: weight grads of `second`, microbatch 1
        /// 6. `w(1)`: weight grads of `first`, microbatch 1
        pub const ORDER: &'static [::graphed::__private::OrderEntry] = &[
            ::graphed::__private::OrderEntry::Forward(1),
            ::graphed::__private::OrderEntry::Forward(2),
            ::graphed::__private::OrderEntry::Backward(2),
            ::graphed::__private::OrderEntry::Backward(1),
            ::graphed::__private::OrderEntry::Wgrad(2),
            ::graphed::__private::OrderEntry::Wgrad(1),
        ];
        /// The number of chunks (fields).
        pub const CHUNKS: usize = 2;
        /// The number of microbatches per chunk the schedule runs.
        pub const MICROBATCHES: usize = 1;
        /// The options `#[graphed(...)]` gives `Split`, the schedule included.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new()
                .warmup(3)
                .order(::graphed::__private::Vec::from(Self::ORDER))
                .allow_unused_input(false)
        }
        /// Warms up and captures the chunks of `module` with `options`. On failure the
        /// error hands `module` back, chunks and all.
        pub fn new(
            module: Split,
            samples: ::graphed::__private::Vec<
                ::graphed::__private::Vec<
                    ::graphed::__private::Vec<
                        ::graphed::__private::Option<::graphed::__private::Tensor>,
                    >,
                >,
            >,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, Split> {
            let Split { first, second } = module;
            match ::graphed::__private::make_graphed(
                ::graphed::__private::Vec::from([
                    ::graphed::__private::boxed::<Layer>(first),
                    ::graphed::__private::boxed::<Layer>(second),
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
                                Split {
                                    first: ::graphed::__private::unbox::<
                                        Layer,
                                    >(__modules.next(), "first"),
                                    second: ::graphed::__private::unbox::<
                                        Layer,
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
            inputs: <Layer as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __outputs = self
                .__modules
                .forward(0, &::graphed::__private::Slots::into_slots(inputs))?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of chunk 1 (`first`) for its oldest outstanding microbatch.
        pub fn backward_first(
            &mut self,
            grad_outputs: <Layer as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __grads = self
                .__modules
                .backward(0, &::graphed::__private::Slots::into_slots(grad_outputs))?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of chunk 1 (`first`).
        pub fn module_first(&self) -> &Layer {
            ::graphed::__private::expect_module(
                self.__modules.module::<Layer>(0),
                "first",
            )
        }
        /// The module of chunk 1 (`first`), mutably.
        pub fn module_first_mut(&mut self) -> &mut Layer {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<Layer>(0),
                "first",
            )
        }
        /// Replays the forward of chunk 2 (`second`) for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_second(
            &mut self,
            inputs: <Layer as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __outputs = self
                .__modules
                .forward(1, &::graphed::__private::Slots::into_slots(inputs))?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of chunk 2 (`second`) for its oldest outstanding microbatch.
        pub fn backward_second(
            &mut self,
            grad_outputs: <Layer as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __grads = self
                .__modules
                .backward(1, &::graphed::__private::Slots::into_slots(grad_outputs))?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of chunk 2 (`second`).
        pub fn module_second(&self) -> &Layer {
            ::graphed::__private::expect_module(
                self.__modules.module::<Layer>(1),
                "second",
            )
        }
        /// The module of chunk 2 (`second`), mutably.
        pub fn module_second_mut(&mut self) -> &mut Layer {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<Layer>(1),
                "second",
            )
        }
        /// Replays the weight grads (`w(1)`) of chunk 1 (`first`) for its oldest microbatch whose backward ran.
        pub fn backward_weights_first(&mut self) -> ::graphed::__private::Result<()> {
            self.__modules.backward_weights(0)
        }
        /// Replays the weight grads (`w(2)`) of chunk 2 (`second`) for its oldest microbatch whose backward ran.
        pub fn backward_weights_second(&mut self) -> ::graphed::__private::Result<()> {
            self.__modules.backward_weights(1)
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
    impl ::graphed::__private::fmt::Debug for GraphedSplit {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
    const _: () = ::core::assert!(
        < Layer as ::graphed::__private::TypedModule > ::SPLITS_BACKWARD,
        "`w(1)` in `order`: chunk 1 (`first`) does not split its backward; give its #[graphed] impl a `fn backward_weights(&mut self, cx: &mut Cx) -> Result<()>`, or drop the `w(1)` entries"
    );
    const _: () = ::core::assert!(
        < Layer as ::graphed::__private::TypedModule > ::SPLITS_BACKWARD,
        "`w(2)` in `order`: chunk 2 (`second`) does not split its backward; give its #[graphed] impl a `fn backward_weights(&mut self, cx: &mut Cx) -> Result<()>`, or drop the `w(2)` entries"
    );
};
