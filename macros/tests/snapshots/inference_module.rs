// Input:
//
// #[graphed(warmup = 1)]
// impl DecodeStep {
//     pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
//         todo!()
//     }
// }

// Expansion:

impl DecodeStep {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        todo!()
    }
}
/// The static input surface of [`DecodeStep`]: one field per tensor argument of `DecodeStep::forward`, in order. Capture records the graphs on buffers of these shapes; each replay copies its inputs into them (unless an input already is that buffer).
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
#[derive(Clone, Debug)]
pub struct DecodeStepInputs {
    /// The `x` argument of `DecodeStep::forward`.
    pub x: ::graphed::__private::Tensor,
}
/// The static outputs of [`DecodeStep`]'s forward graph, one field per element `DecodeStep::forward` returns. A replay writes them in place; a handle from an earlier replay reports itself stale rather than change under its holder.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
#[derive(Clone, Debug)]
pub struct DecodeStepOutputs {
    /// Output 0 of `DecodeStep::forward`.
    pub output_0: ::graphed::__private::Tensor,
}
/// [`DecodeStep`] captured into graphs by `#[graphed]`: an inference module (its impl has no `backward`), so only its forward is captured; `forward` takes and returns what `DecodeStep::forward` does and replays the forward graph (the eager method runs instead in the mode the graph was not captured for).
///
/// Replays must follow capture order: one `forward`, then its `backward`, per step.
#[allow(
    dead_code,
    unused_qualifications,
    non_camel_case_types,
    non_snake_case,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
)]
pub struct GraphedDecodeStep {
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
    impl ::graphed::__private::Module for DecodeStep {
        fn name(&self) -> &'static str {
            "DecodeStep"
        }
        fn num_inputs(&self) -> usize {
            1
        }
        fn forward(
            &self,
            __cx: &mut ::graphed::__private::Cx,
            __inputs: &[::graphed::__private::Option<::graphed::__private::Tensor>],
        ) -> ::graphed::__private::Result<
            ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        > {
            let [__input0] = ::graphed::__private::slot_refs::<
                1,
            >(__inputs, "DecodeStep", "inputs")?;
            let __output0 = DecodeStep::forward(
                self,
                __cx,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __input0,
                    "DecodeStep",
                    "x",
                )?,
            )?;
            ::graphed::__private::Ok(
                ::graphed::__private::vec![
                    ::graphed::__private::IntoSlot::into_slot(__output0)
                ],
            )
        }
        fn backward(
            &mut self,
            __cx: &mut ::graphed::__private::Cx,
            __grad_outputs: &[::graphed::__private::Option<::graphed::__private::Tensor>],
        ) -> ::graphed::__private::Result<
            ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        > {
            let _ = (__cx, __grad_outputs);
            ::graphed::__private::Err(::graphed::__private::Error::ForwardOnly {
                module: ::graphed::__private::String::from("DecodeStep"),
            })
        }
        fn has_backward(&self) -> bool {
            false
        }
        fn visit_params(&self, __f: &mut dyn FnMut(&str, &::graphed::__private::Param)) {
            #[allow(unused_imports)]
            use ::graphed::__private::{ParamsViaNothing as _, ParamsViaTrait as _};
            (&&::graphed::__private::ParamsProbe(self)).__graphed_visit_params("", __f)
        }
        fn exposes_params(&self) -> bool {
            #[allow(unused_imports)]
            use ::graphed::__private::{ParamsViaNothing as _, ParamsViaTrait as _};
            (&&::graphed::__private::ParamsProbe(self)).__graphed_has_params()
        }
    }
    #[automatically_derived]
    impl DecodeStepInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["x"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![::graphed::__private::IntoSlot::into_slot(self.x)]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            let [__slot0] = ::graphed::__private::slots::<
                1,
            >(slots, "DecodeStep", "inputs")?;
            ::graphed::__private::Ok(Self {
                x: ::graphed::__private::FromSlot::from_slot(__slot0, "DecodeStep", "x")?,
            })
        }
    }
    #[automatically_derived]
    impl DecodeStepOutputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["output_0"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.output_0)
            ]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            let [__slot0] = ::graphed::__private::slots::<
                1,
            >(slots, "DecodeStep", "outputs")?;
            ::graphed::__private::Ok(Self {
                output_0: ::graphed::__private::FromSlot::from_slot(
                    __slot0,
                    "DecodeStep",
                    "output_0",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for DecodeStepInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            DecodeStepInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            DecodeStepInputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[::graphed::__private::IntoSlot::into_slot(self.x)])
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for DecodeStepOutputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            DecodeStepOutputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            DecodeStepOutputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[::graphed::__private::IntoSlot::into_slot(self.output_0)])
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::TypedModule for DecodeStep {
        type Inputs = DecodeStepInputs;
        type Outputs = DecodeStepOutputs;
        type GradOutputs = ();
        type GradInputs = ();
    }
    #[automatically_derived]
    impl ::graphed::__private::ChainOut for DecodeStep {}
    #[automatically_derived]
    impl ::graphed::__private::ChainIn for DecodeStep {
        type Extra = ();
    }
    #[automatically_derived]
    impl ::graphed::__private::ChainLink for DecodeStep {}
    #[automatically_derived]
    impl DecodeStep {
        /// Warms up and captures this module with the given tensors as samples (`warmup = 1`), and returns the typed graphed wrapper. The samples fix the shapes of the static input surface, [`DecodeStepInputs`]. On failure the error hands the module back.
        pub fn make_graphed(
            self,
            x: &Tensor,
        ) -> ::graphed::__private::CaptureResult<GraphedDecodeStep, DecodeStep> {
            GraphedDecodeStep::new(
                self,
                DecodeStepInputs {
                    x: ::graphed::__private::Tensor::clone(x),
                },
                GraphedDecodeStep::options(),
            )
        }
    }
    #[automatically_derived]
    impl GraphedDecodeStep {
        /// The options `#[graphed(...)]` gives `DecodeStep`: `warmup = 1`.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new().warmup(1).allow_unused_input(false)
        }
        /// Warms up and captures `module` on `sample` with `options` (see [`Self::options`]
        /// for the ones the attribute gives). On failure the error hands `module` back.
        pub fn new(
            module: DecodeStep,
            sample: DecodeStepInputs,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, DecodeStep> {
            match ::graphed::__private::make_graphed(
                ::graphed::__private::vec![::graphed::__private::boxed(module)],
                ::graphed::__private::vec![
                    ::graphed::__private::vec![sample.into_slots()]
                ],
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
                                ::graphed::__private::unbox::<
                                    DecodeStep,
                                >(__modules.next(), "DecodeStep")
                            }),
                    )
                }
            }
        }
        /// Replays the forward graph on these inputs and returns its static outputs. No context
        /// is taken: the graphs keep what the forward saved until its backward.
        pub fn forward(&mut self, x: &Tensor) -> ::graphed::__private::Result<Tensor> {
            let __outputs = self
                .__modules
                .forward(0, &[::graphed::__private::IntoSlot::into_slot(x)])?;
            let [__output0] = ::graphed::__private::slots::<
                1,
            >(__outputs, "DecodeStep", "outputs")?;
            ::graphed::__private::Ok(
                ::graphed::__private::FromSlot::from_slot(
                    __output0,
                    "DecodeStep",
                    "output 0",
                )?,
            )
        }
        /// The captured module.
        pub fn module(&self) -> &DecodeStep {
            ::graphed::__private::expect_module(
                self.__modules.module::<DecodeStep>(0),
                "DecodeStep",
            )
        }
        /// The captured module, mutably (its parameters, for an optimizer step).
        pub fn module_mut(&mut self) -> &mut DecodeStep {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<DecodeStep>(0),
                "DecodeStep",
            )
        }
        /// Gives the module back, unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> DecodeStep {
            ::graphed::__private::unbox::<
                DecodeStep,
            >((*self.__modules).into_modules().into_iter().next(), "DecodeStep")
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
    impl ::graphed::__private::fmt::Debug for GraphedDecodeStep {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
