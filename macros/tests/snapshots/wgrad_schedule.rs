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
/// [`Split`] captured into graphs by `#[graphed]`: one chunk per field, a stack's layers consecutive (chunks 1 `first`, 2 `second`); see [`Self::ORDER`] for the schedule calls must follow.
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
    /// The number of chunks of each field, in field order.
    __lens: [usize; 2],
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
    /// The struct from its chunks, in field order.
    fn __into_Split(
        __modules: ::graphed::__private::Vec<
            ::graphed::__private::Box<dyn ::graphed::__private::Module>,
        >,
        __lens: [usize; 2],
    ) -> Split {
        let _ = __lens;
        let mut __modules = __modules.into_iter();
        Split {
            first: ::graphed::__private::unbox::<Layer>(__modules.next(), "first"),
            second: ::graphed::__private::unbox::<Layer>(__modules.next(), "second"),
        }
    }
    #[automatically_derived]
    impl Split {
        /// Warms up and captures the chunks with [`GraphedSplit::options`] (`warmup = 3`). `samples[chunk][microbatch][input]` are sample inputs, chunks numbered in field order (a stack's layers consecutive); one microbatch entry per chunk stands for all. A chunk after the first reads the previous chunk's input grad in its backward, so its first sample input must require a grad (`Error::SampleNeedsGrad` otherwise). On failure the error hands the struct back.
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
        /// The schedule `#[graphed(order = ...)]` gives [`Split`], in capture and replay order.
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
        /// The number of chunks (a stack counts its layers).
        pub const CHUNKS: usize = 2;
        /// The number of microbatches per chunk the schedule runs.
        pub const MICROBATCHES: usize = 1;
        /// What the attribute says, for `new` to complete the options it is given.
        const __SPEC: ::graphed::__private::StructSpec = ::graphed::__private::StructSpec {
            name: "Split",
            fields: &[
                ::graphed::__private::FieldSpec {
                    name: "first",
                    stack: false,
                    checkpoint_every: 0,
                },
                ::graphed::__private::FieldSpec {
                    name: "second",
                    stack: false,
                    checkpoint_every: 0,
                },
            ],
            chained: false,
            microbatches: Self::MICROBATCHES,
            order: ::graphed::__private::SpecOrder::List(Self::ORDER),
            buckets: ::graphed::__private::None,
        };
        /// The options `#[graphed(...)]` gives `Split` (`warmup = 3`): what `new` captures with unless told otherwise.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new()
                .warmup(3)
                .order(Self::ORDER.iter().copied())
                .allow_unused_input(false)
        }
        /// Warms up and captures the chunks of `module` with `options`. `samples[chunk][microbatch][input]` are sample inputs, chunks numbered in field order (a stack's layers consecutive); one microbatch entry per chunk stands for all. A chunk after the first reads the previous chunk's input grad in its backward, so its first sample input must require a grad (`Error::SampleNeedsGrad` otherwise).
        ///
        /// `options` is any `GraphOptions`; what it leaves unset comes from the
        /// attribute, as in [`Self::options`]: the schedule (`order`, laid out for the stacks'
        /// lengths), the checkpointed chunks (the fields' `#[graphed(checkpoint...)]`;
        /// `GraphOptions::checkpoint` and `no_checkpoint` override them) and the shape buckets
        /// (`buckets(...)`, unless `GraphOptions::buckets` names others). `warmup`,
        /// `allow_unused_input`, `reuse_buffers`, `capture_mode`, `pool`, `hooks` and `inference`
        /// are taken as given.
        ///
        /// Refused before anything runs, handing `module` back: an empty `Vec` stack
        /// (`Error::EmptyStack`), and whatever `make_graphed` refuses. On a failed capture the
        /// error hands `module` back too, chunks and all.
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
            let __lens = [1, 1];
            let __options = match ::graphed::__private::struct_options(
                &Self::__SPEC,
                &__lens,
                options,
            ) {
                ::graphed::__private::Ok(options) => options,
                ::graphed::__private::Err(__error) => {
                    return ::graphed::__private::Err(
                        ::graphed::__private::CaptureError::new(__error, module),
                    );
                }
            };
            let Split { first, second } = module;
            let mut __chunks: ::graphed::__private::Vec<
                ::graphed::__private::Box<dyn ::graphed::__private::Module>,
            > = ::graphed::__private::Vec::with_capacity(__lens.iter().sum());
            __chunks.push(::graphed::__private::boxed::<Layer>(first));
            __chunks.push(::graphed::__private::boxed::<Layer>(second));
            if let ::graphed::__private::Err(__error) = ::graphed::__private::check_pipeline_samples(
                &__chunks,
                &samples,
            ) {
                return ::graphed::__private::Err(
                    ::graphed::__private::CaptureError::new(
                        __error,
                        __into_Split(__chunks, __lens),
                    ),
                );
            }
            match ::graphed::__private::make_graphed(__chunks, samples, __options) {
                ::graphed::__private::Ok(__modules) => {
                    ::graphed::__private::Ok(Self {
                        __modules: ::graphed::__private::Box::new(__modules),
                        __lens,
                    })
                }
                ::graphed::__private::Err(__error) => {
                    ::graphed::__private::Err(
                        __error.map(|__modules| __into_Split(__modules, __lens)),
                    )
                }
            }
        }
        /// Replays the forward of `first` for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_first(
            &mut self,
            inputs: <Layer as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0)?;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| self.__modules.forward(__chunk, inputs),
            )?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of `first` for its oldest outstanding microbatch.
        pub fn backward_first(
            &mut self,
            grad_outputs: <Layer as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0)?;
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward(__chunk, grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of `first`.
        pub fn module_first(&self) -> &Layer {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module::<Layer>(__chunk)),
                "first",
            )
        }
        /// The module of `first`, mutably.
        pub fn module_first_mut(&mut self) -> &mut Layer {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module_mut::<Layer>(__chunk)),
                "first",
            )
        }
        /// Replays the forward of `second` for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_second(
            &mut self,
            inputs: <Layer as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, 0)?;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| self.__modules.forward(__chunk, inputs),
            )?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of `second` for its oldest outstanding microbatch.
        pub fn backward_second(
            &mut self,
            grad_outputs: <Layer as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Layer as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, 0)?;
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward(__chunk, grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of `second`.
        pub fn module_second(&self) -> &Layer {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module::<Layer>(__chunk)),
                "second",
            )
        }
        /// The module of `second`, mutably.
        pub fn module_second_mut(&mut self) -> &mut Layer {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module_mut::<Layer>(__chunk)),
                "second",
            )
        }
        /// Replays the weight grads (`w(1)`) of `first` for its oldest microbatch whose backward ran.
        pub fn backward_weights_first(&mut self) -> ::graphed::__private::Result<()> {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0)?;
            self.__modules.backward_weights(__chunk)
        }
        /// Replays the weight grads (`w(2)`) of `second` for its oldest microbatch whose backward ran.
        pub fn backward_weights_second(&mut self) -> ::graphed::__private::Result<()> {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, 0)?;
            self.__modules.backward_weights(__chunk)
        }
        /// Gives the struct back, its modules unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> Split {
            __into_Split((*self.__modules).into_modules(), self.__lens)
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
