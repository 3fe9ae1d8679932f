// Input:
//
// #[graphed(chained, order = windowed(microbatches = 2, in_flight = 1))]
// struct Stages {
//     #[graphed(checkpoint)]
//     first: Stage,
//     rest: [Stage; 2],
// }

// Expansion:

struct Stages {
    first: Stage,
    rest: [Stage; 2],
}
/// What [`GraphedStages::forward`] takes: the inputs of the first chunk (`first`).
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
type StagesInputs = <Stage as ::graphed::__private::TypedModule>::Inputs;
/// What [`GraphedStages::forward`] takes for the last chunk (`rest`) besides the previous chunk's output (its forward's other tensor arguments; `()` when it has none).
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
type StagesExtraInputs = <Stage as ::graphed::__private::ChainIn>::Extra;
/// What [`GraphedStages::forward`] returns: the outputs of the last chunk (`rest`).
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
type StagesOutputs = <Stage as ::graphed::__private::TypedModule>::Outputs;
/// What [`GraphedStages::backward`] takes: the grads of the last chunk's (`rest`) outputs.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
type StagesGradOutputs = <Stage as ::graphed::__private::TypedModule>::GradOutputs;
/// What [`GraphedStages::backward`] returns: the grads of the first chunk's (`first`) inputs.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
type StagesGradInputs = <Stage as ::graphed::__private::TypedModule>::GradInputs;
/// [`Stages`] captured into graphs by `#[graphed]`: one chunk per field, a stack's layers consecutive (chunks 1 `first`, 2 ..= 3 `rest[0..2]`); see [`Self::ORDER`] for the schedule calls must follow.
///
/// Chained: each chunk's output is the next chunk's first input, in the same buffer (no copy between chunks). `forward`, `backward` and `step` run the whole model; the per-field calls run one chunk.
///
/// Checkpointed by default (their forward recomputed inside their backward; `GraphOptions::checkpoint` overrides): `first`.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
struct GraphedStages {
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
    const _: () = ::graphed::__private::chain_out::<Stage>();
    const _: () = ::graphed::__private::chain_link::<Stage>();
    /// The struct from its chunks, in field order.
    fn __into_Stages(
        __modules: ::graphed::__private::Vec<
            ::graphed::__private::Box<dyn ::graphed::__private::Module>,
        >,
        __lens: [usize; 2],
    ) -> Stages {
        let _ = __lens;
        let mut __modules = __modules.into_iter();
        Stages {
            first: ::graphed::__private::unbox::<Stage>(__modules.next(), "first"),
            rest: ::graphed::__private::array::from_fn(|_| ::graphed::__private::unbox::<
                Stage,
            >(__modules.next(), "rest")),
        }
    }
    #[automatically_derived]
    impl Stages {
        /// Warms up and captures the chunks with [`GraphedStages::options`] (`warmup = 3`). `inputs` (the first chunk's) and `extras` (the last chunk's inputs after its first) are samples: their shapes and dtypes are the static surfaces', and `requires_grad` on an input says whether its grad is computed. Every later chunk's first input is the previous chunk's output, whose grad is always computed. On failure the error hands the struct back.
        fn make_graphed(
            self,
            inputs: StagesInputs,
            extras: StagesExtraInputs,
        ) -> ::graphed::__private::CaptureResult<GraphedStages, Stages> {
            GraphedStages::new(self, inputs, extras, GraphedStages::options())
        }
    }
    #[automatically_derived]
    impl GraphedStages {
        /// The schedule `#[graphed(order = ...)]` gives [`Stages`], in capture and replay order.
        ///
        /// `+c` runs the forward of chunk c for its next microbatch, `-c` the backward of its oldest outstanding one (3 chunks, 2 microbatches):
        ///
        /// 1. `+1`: forward of `first`, microbatch 1
        /// 2. `+2`: forward of `rest[0]`, microbatch 1
        /// 3. `+3`: forward of `rest[1]`, microbatch 1
        /// 4. `-3`: backward of `rest[1]`, microbatch 1
        /// 5. `-2`: backward of `rest[0]`, microbatch 1
        /// 6. `-1`: backward of `first`, microbatch 1
        /// 7. `+1`: forward of `first`, microbatch 2
        /// 8. `+2`: forward of `rest[0]`, microbatch 2
        /// 9. `+3`: forward of `rest[1]`, microbatch 2
        /// 10. `-3`: backward of `rest[1]`, microbatch 2
        /// 11. `-2`: backward of `rest[0]`, microbatch 2
        /// 12. `-1`: backward of `first`, microbatch 2
        pub const ORDER: &'static [::graphed::__private::OrderEntry] = &[
            ::graphed::__private::OrderEntry::Forward(1),
            ::graphed::__private::OrderEntry::Forward(2),
            ::graphed::__private::OrderEntry::Forward(3),
            ::graphed::__private::OrderEntry::Backward(3),
            ::graphed::__private::OrderEntry::Backward(2),
            ::graphed::__private::OrderEntry::Backward(1),
            ::graphed::__private::OrderEntry::Forward(1),
            ::graphed::__private::OrderEntry::Forward(2),
            ::graphed::__private::OrderEntry::Forward(3),
            ::graphed::__private::OrderEntry::Backward(3),
            ::graphed::__private::OrderEntry::Backward(2),
            ::graphed::__private::OrderEntry::Backward(1),
        ];
        /// The number of chunks (a stack counts its layers).
        pub const CHUNKS: usize = 3;
        /// The number of microbatches per chunk the schedule runs.
        pub const MICROBATCHES: usize = 2;
        /// What the attribute says, for `new` to complete the options it is given.
        const __SPEC: ::graphed::__private::StructSpec = ::graphed::__private::StructSpec {
            name: "Stages",
            fields: &[
                ::graphed::__private::FieldSpec {
                    name: "first",
                    stack: false,
                    checkpoint_every: 1,
                },
                ::graphed::__private::FieldSpec {
                    name: "rest",
                    stack: true,
                    checkpoint_every: 0,
                },
            ],
            chained: true,
            microbatches: Self::MICROBATCHES,
            order: ::graphed::__private::SpecOrder::List(Self::ORDER),
            buckets: ::graphed::__private::None,
        };
        /// The options `#[graphed(...)]` gives `Stages` (`warmup = 3`): what `new` captures with unless told otherwise.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new()
                .warmup(3)
                .chained(true)
                .order(Self::ORDER.iter().copied())
                .checkpoint([1])
                .allow_unused_input(false)
        }
        /// Warms up and captures the chunks of `module` with `options`. `inputs` (the first chunk's) and `extras` (the last chunk's inputs after its first) are samples: their shapes and dtypes are the static surfaces', and `requires_grad` on an input says whether its grad is computed. Every later chunk's first input is the previous chunk's output, whose grad is always computed.
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
            module: Stages,
            inputs: StagesInputs,
            extras: StagesExtraInputs,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, Stages> {
            let __lens = [1, 2];
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
            let Stages { first, rest } = module;
            let mut __chunks: ::graphed::__private::Vec<
                ::graphed::__private::Box<dyn ::graphed::__private::Module>,
            > = ::graphed::__private::Vec::with_capacity(__lens.iter().sum());
            __chunks.push(::graphed::__private::boxed::<Stage>(first));
            __chunks
                .extend(
                    ::graphed::__private::IntoIterator::into_iter(rest)
                        .map(::graphed::__private::boxed::<Stage>),
                );
            let samples = ::graphed::__private::chain_samples(
                __chunks.len(),
                ::graphed::__private::Slots::into_slots(inputs),
                ::graphed::__private::Slots::into_slots(extras),
            );
            match ::graphed::__private::make_graphed(__chunks, samples, __options) {
                ::graphed::__private::Ok(__modules) => {
                    ::graphed::__private::Ok(Self {
                        __modules: ::graphed::__private::Box::new(__modules),
                        __lens,
                    })
                }
                ::graphed::__private::Err(__error) => {
                    ::graphed::__private::Err(
                        __error.map(|__modules| __into_Stages(__modules, __lens)),
                    )
                }
            }
        }
        /// Replays the forward of every chunk, in order, for the next microbatch: the first
        /// chunk's `inputs` and the last chunk's `extras` in (copied into the static inputs
        /// unless they are those buffers), the last chunk's outputs out. Between chunks nothing
        /// is copied. Checked before the first chunk runs; a refused call changes nothing.
        pub fn forward(
            &mut self,
            inputs: StagesInputs,
            extras: StagesExtraInputs,
        ) -> ::graphed::__private::Result<StagesOutputs> {
            let __modules = &mut self.__modules;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| {
                    ::graphed::__private::Slots::with_slots(
                        extras,
                        |extras| __modules.forward_chain(inputs, extras),
                    )
                },
            )?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of every chunk, last first, for the oldest outstanding
        /// microbatch: the grads of the last chunk's outputs in, the grads of the first chunk's
        /// inputs out (`None` for an input that needs none). Parameter grads accumulate.
        pub fn backward(
            &mut self,
            grad_outputs: StagesGradOutputs,
        ) -> ::graphed::__private::Result<StagesGradInputs> {
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward_chain(grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// Replays one whole step of the schedule (2 microbatches) as one launch: for each microbatch its `inputs`, `extras` and `grad_outputs`, copied into the step's buffers (unless they are those buffers); each microbatch's outputs of the last chunk come back. Call [`Self::fuse`] once first. Checked before the first copy; a refused step changes nothing.
        pub fn step(
            &mut self,
            microbatches: [(StagesInputs, StagesExtraInputs, StagesGradOutputs); 2],
        ) -> ::graphed::__private::Result<[StagesOutputs; 2]> {
            let __slots = microbatches
                .map(|(inputs, extras, grad_outputs)| {
                    (
                        ::graphed::__private::Slots::into_slots(inputs),
                        ::graphed::__private::Slots::into_slots(extras),
                        ::graphed::__private::Slots::into_slots(grad_outputs),
                    )
                });
            let __inputs: [&[::graphed::__private::Option<
                ::graphed::__private::Tensor,
            >]; 2] = ::graphed::__private::array::from_fn(|m| __slots[m].0.as_slice());
            let __extras: [&[::graphed::__private::Option<
                ::graphed::__private::Tensor,
            >]; 2] = ::graphed::__private::array::from_fn(|m| __slots[m].1.as_slice());
            let __grads: [&[::graphed::__private::Option<
                ::graphed::__private::Tensor,
            >]; 2] = ::graphed::__private::array::from_fn(|m| __slots[m].2.as_slice());
            let __outputs = self.__modules.step_chain(&__inputs, &__extras, &__grads)?;
            let __outputs = __outputs
                .into_iter()
                .map(::graphed::__private::Slots::from_slots)
                .collect::<
                    ::graphed::__private::Result<
                        ::graphed::__private::Vec<StagesOutputs>,
                    >,
                >()?;
            ::graphed::__private::array_of::<_, 2>(__outputs, "Stages")
        }
        /// Replays the forward of `first` for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_first(
            &mut self,
            inputs: <Stage as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Stage as ::graphed::__private::TypedModule>::Outputs,
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
            grad_outputs: <Stage as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Stage as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0)?;
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward(__chunk, grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of `first`.
        pub fn module_first(&self) -> &Stage {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module::<Stage>(__chunk)),
                "first",
            )
        }
        /// The module of `first`, mutably.
        pub fn module_first_mut(&mut self) -> &mut Stage {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module_mut::<Stage>(__chunk)),
                "first",
            )
        }
        /// Replays the forward of layer `layer` of `rest` (0-indexed) for its next microbatch: the layer's own inputs in, its outputs out. A layer out of range is `Error::ChunkOutOfRange`.
        pub fn forward_rest(
            &mut self,
            layer: usize,
            inputs: <Stage as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Stage as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer)?;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| self.__modules.forward(__chunk, inputs),
            )?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of layer `layer` of `rest` for its oldest outstanding microbatch.
        pub fn backward_rest(
            &mut self,
            layer: usize,
            grad_outputs: <Stage as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Stage as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer)?;
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward(__chunk, grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// Layer `layer` of `rest`, if the stack has it.
        pub fn module_rest(&self, layer: usize) -> ::graphed::__private::Option<&Stage> {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer).ok()?;
            self.__modules.module::<Stage>(__chunk)
        }
        /// Layer `layer` of `rest`, mutably, if the stack has it.
        pub fn module_rest_mut(
            &mut self,
            layer: usize,
        ) -> ::graphed::__private::Option<&mut Stage> {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer).ok()?;
            self.__modules.module_mut::<Stage>(__chunk)
        }
        /// The number of layers of `rest` (its chunks).
        pub fn len_rest(&self) -> usize {
            self.__lens[1]
        }
        /// Gives the struct back, its modules unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> Stages {
            __into_Stages((*self.__modules).into_modules(), self.__lens)
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
    impl ::graphed::__private::fmt::Debug for GraphedStages {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
