// Input:
//
// #[graphed(chained, buckets(axis = 1, sizes = [512, 128, 256]))]
// pub struct Gpt {
//     pub embed: Embed,
//     pub blocks: Vec<Block>,
//     pub head: Head,
// }

// Expansion:

pub struct Gpt {
    pub embed: Embed,
    pub blocks: Vec<Block>,
    pub head: Head,
}
/// What [`GraphedGpt::forward`] takes: the inputs of the first chunk (`embed`).
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub type GptInputs = <Embed as ::graphed::__private::TypedModule>::Inputs;
/// What [`GraphedGpt::forward`] takes for the last chunk (`head`) besides the previous chunk's output (its forward's other tensor arguments; `()` when it has none).
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub type GptExtraInputs = <Head as ::graphed::__private::ChainIn>::Extra;
/// What [`GraphedGpt::forward`] returns: the outputs of the last chunk (`head`).
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub type GptOutputs = <Head as ::graphed::__private::TypedModule>::Outputs;
/// What [`GraphedGpt::backward`] takes: the grads of the last chunk's (`head`) outputs.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub type GptGradOutputs = <Head as ::graphed::__private::TypedModule>::GradOutputs;
/// What [`GraphedGpt::backward`] returns: the grads of the first chunk's (`embed`) inputs.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub type GptGradInputs = <Embed as ::graphed::__private::TypedModule>::GradInputs;
/// [`Gpt`] captured into graphs by `#[graphed]`: one chunk per field, a stack's layers consecutive (chunks 1 `embed`, 2 ..= 1 + len `blocks[0..len]` (len: its length at construction), then `head`); the schedule is laid out at construction, once the stacks are counted.
///
/// Chained: each chunk's output is the next chunk's first input, in the same buffer (no copy between chunks). `forward`, `backward` and `step` run the whole model; the per-field calls run one chunk.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub struct GraphedGpt {
    __modules: ::graphed::__private::Box<::graphed::__private::GraphedModules>,
    /// The number of chunks of each field, in field order.
    __lens: [usize; 3],
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
    const _: () = ::graphed::__private::chain_out::<Embed>();
    const _: () = ::graphed::__private::chain_link::<Block>();
    const _: () = ::graphed::__private::chain_in::<Head>();
    /// The struct from its chunks, in field order.
    fn __into_Gpt(
        __modules: ::graphed::__private::Vec<
            ::graphed::__private::Box<dyn ::graphed::__private::Module>,
        >,
        __lens: [usize; 3],
    ) -> Gpt {
        let _ = __lens;
        let mut __modules = __modules.into_iter();
        Gpt {
            embed: ::graphed::__private::unbox::<Embed>(__modules.next(), "embed"),
            blocks: (0..__lens[1])
                .map(|_| ::graphed::__private::unbox::<
                    Block,
                >(__modules.next(), "blocks"))
                .collect(),
            head: ::graphed::__private::unbox::<Head>(__modules.next(), "head"),
        }
    }
    #[automatically_derived]
    impl Gpt {
        /// Warms up and captures the chunks with [`GraphedGpt::options`] (`warmup = 3`, shape buckets along axis 1 (128, 256, 512)). `inputs` (the first chunk's) and `extras` (the last chunk's inputs after its first) are samples: their shapes and dtypes are the static surfaces', and `requires_grad` on an input says whether its grad is computed. Every later chunk's first input is the previous chunk's output, whose grad is always computed. On failure the error hands the struct back.
        pub fn make_graphed(
            self,
            inputs: GptInputs,
            extras: GptExtraInputs,
        ) -> ::graphed::__private::CaptureResult<GraphedGpt, Gpt> {
            GraphedGpt::new(self, inputs, extras, GraphedGpt::options())
        }
    }
    #[automatically_derived]
    impl GraphedGpt {
        /// The number of microbatches per chunk the schedule runs.
        pub const MICROBATCHES: usize = 1;
        /// What the attribute says, for `new` to complete the options it is given.
        const __SPEC: ::graphed::__private::StructSpec = ::graphed::__private::StructSpec {
            name: "Gpt",
            fields: &[
                ::graphed::__private::FieldSpec {
                    name: "embed",
                    stack: false,
                    checkpoint_every: 0,
                },
                ::graphed::__private::FieldSpec {
                    name: "blocks",
                    stack: true,
                    checkpoint_every: 0,
                },
                ::graphed::__private::FieldSpec {
                    name: "head",
                    stack: false,
                    checkpoint_every: 0,
                },
            ],
            chained: true,
            microbatches: Self::MICROBATCHES,
            order: ::graphed::__private::SpecOrder::None,
            buckets: ::graphed::__private::Some(Self::buckets),
        };
        /// The options `#[graphed(...)]` gives `Gpt` (`warmup = 3`, shape buckets along axis 1 (128, 256, 512)): what `new` captures with unless told otherwise.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new()
                .warmup(3)
                .chained(true)
                .buckets(Self::buckets())
                .allow_unused_input(false)
        }
        /// The shape buckets `#[graphed(buckets(...))]` declares for `Gpt`, along axis 1 (128, 256, 512). `new` captures with them unless its options name buckets of their own; samples are at the largest bucket's size.
        pub fn buckets() -> ::graphed::__private::Buckets {
            ::graphed::__private::Buckets::new(1, [512, 128, 256])
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
            module: Gpt,
            inputs: GptInputs,
            extras: GptExtraInputs,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, Gpt> {
            let __lens = [1, module.blocks.len(), 1];
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
            let Gpt { embed, blocks, head } = module;
            let mut __chunks: ::graphed::__private::Vec<
                ::graphed::__private::Box<dyn ::graphed::__private::Module>,
            > = ::graphed::__private::Vec::with_capacity(__lens.iter().sum());
            __chunks.push(::graphed::__private::boxed::<Embed>(embed));
            __chunks
                .extend(
                    ::graphed::__private::IntoIterator::into_iter(blocks)
                        .map(::graphed::__private::boxed::<Block>),
                );
            __chunks.push(::graphed::__private::boxed::<Head>(head));
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
                        __error.map(|__modules| __into_Gpt(__modules, __lens)),
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
            inputs: GptInputs,
            extras: GptExtraInputs,
        ) -> ::graphed::__private::Result<GptOutputs> {
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
            grad_outputs: GptGradOutputs,
        ) -> ::graphed::__private::Result<GptGradInputs> {
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward_chain(grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// Replays one whole step (every chunk's forward, then every backward) as one launch:
        /// `inputs`, `extras` and `grad_outputs` are copied into the step's buffers (unless
        /// they are those buffers), the last chunk's outputs come back. Call [`Self::fuse`]
        /// once first. Checked before the first copy; a refused step changes nothing.
        pub fn step(
            &mut self,
            inputs: GptInputs,
            extras: GptExtraInputs,
            grad_outputs: GptGradOutputs,
        ) -> ::graphed::__private::Result<GptOutputs> {
            let __modules = &mut self.__modules;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| {
                    ::graphed::__private::Slots::with_slots(
                        extras,
                        |extras| {
                            ::graphed::__private::Slots::with_slots(
                                grad_outputs,
                                |grads| {
                                    __modules.step_chain(&[inputs], &[extras], &[grads])
                                },
                            )
                        },
                    )
                },
            )?;
            let [__outputs] = ::graphed::__private::array_of::<_, 1>(__outputs, "Gpt")?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the forward of `embed` for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_embed(
            &mut self,
            inputs: <Embed as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Embed as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0)?;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| self.__modules.forward(__chunk, inputs),
            )?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of `embed` for its oldest outstanding microbatch.
        pub fn backward_embed(
            &mut self,
            grad_outputs: <Embed as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Embed as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0)?;
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward(__chunk, grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of `embed`.
        pub fn module_embed(&self) -> &Embed {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module::<Embed>(__chunk)),
                "embed",
            )
        }
        /// The module of `embed`, mutably.
        pub fn module_embed_mut(&mut self) -> &mut Embed {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 0, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module_mut::<Embed>(__chunk)),
                "embed",
            )
        }
        /// Replays the forward of layer `layer` of `blocks` (0-indexed) for its next microbatch: the layer's own inputs in, its outputs out. A layer out of range is `Error::ChunkOutOfRange`.
        pub fn forward_blocks(
            &mut self,
            layer: usize,
            inputs: <Block as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Block as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer)?;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| self.__modules.forward(__chunk, inputs),
            )?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of layer `layer` of `blocks` for its oldest outstanding microbatch.
        pub fn backward_blocks(
            &mut self,
            layer: usize,
            grad_outputs: <Block as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Block as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer)?;
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward(__chunk, grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// Layer `layer` of `blocks`, if the stack has it.
        pub fn module_blocks(
            &self,
            layer: usize,
        ) -> ::graphed::__private::Option<&Block> {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer).ok()?;
            self.__modules.module::<Block>(__chunk)
        }
        /// Layer `layer` of `blocks`, mutably, if the stack has it.
        pub fn module_blocks_mut(
            &mut self,
            layer: usize,
        ) -> ::graphed::__private::Option<&mut Block> {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 1, layer).ok()?;
            self.__modules.module_mut::<Block>(__chunk)
        }
        /// The number of layers of `blocks` (its chunks).
        pub fn len_blocks(&self) -> usize {
            self.__lens[1]
        }
        /// Replays the forward of `head` for its next microbatch: the chunk's own inputs in, its outputs out.
        pub fn forward_head(
            &mut self,
            inputs: <Head as ::graphed::__private::TypedModule>::Inputs,
        ) -> ::graphed::__private::Result<
            <Head as ::graphed::__private::TypedModule>::Outputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 2, 0)?;
            let __outputs = ::graphed::__private::Slots::with_slots(
                inputs,
                |inputs| self.__modules.forward(__chunk, inputs),
            )?;
            ::graphed::__private::Slots::from_slots(__outputs)
        }
        /// Replays the backward of `head` for its oldest outstanding microbatch.
        pub fn backward_head(
            &mut self,
            grad_outputs: <Head as ::graphed::__private::TypedModule>::GradOutputs,
        ) -> ::graphed::__private::Result<
            <Head as ::graphed::__private::TypedModule>::GradInputs,
        > {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 2, 0)?;
            let __grads = ::graphed::__private::Slots::with_slots(
                grad_outputs,
                |grads| self.__modules.backward(__chunk, grads),
            )?;
            ::graphed::__private::Slots::from_slots(__grads)
        }
        /// The module of `head`.
        pub fn module_head(&self) -> &Head {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 2, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module::<Head>(__chunk)),
                "head",
            )
        }
        /// The module of `head`, mutably.
        pub fn module_head_mut(&mut self) -> &mut Head {
            let __chunk = ::graphed::__private::chunk_of(&self.__lens, 2, 0).ok();
            ::graphed::__private::expect_module(
                __chunk.and_then(|__chunk| self.__modules.module_mut::<Head>(__chunk)),
                "head",
            )
        }
        /// Gives the struct back, its modules unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> Gpt {
            __into_Gpt((*self.__modules).into_modules(), self.__lens)
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
    impl ::graphed::__private::fmt::Debug for GraphedGpt {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
