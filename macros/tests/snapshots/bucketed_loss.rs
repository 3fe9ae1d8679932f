// Input:
//
// #[graphed(
//     buckets(
//         axis = 0,
//         sizes = powers_of_two(min = 8, max = 256),
//         pad(1 = -100.0),
//         above_largest = eager
//     )
// )]
// impl Loss {
//     pub fn forward(&self, cx: &mut Cx, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
//         todo!()
//     }
//     pub fn backward(
//         &mut self,
//         cx: &mut Cx,
//         dloss: &Tensor,
//     ) -> Result<(Option<Tensor>, Option<Tensor>)> {
//         todo!()
//     }
// }

// Expansion:

impl Loss {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
        todo!()
    }
    pub fn backward(
        &mut self,
        cx: &mut Cx,
        dloss: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        todo!()
    }
}
/// The static input surface of [`Loss`]: one field per tensor argument of `Loss::forward`, in order. Capture records the graphs on buffers of these shapes; each replay copies its inputs into them (unless an input already is that buffer).
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
pub struct LossInputs {
    /// The `x` argument of `Loss::forward`.
    pub x: ::graphed::__private::Tensor,
    /// The `labels` argument of `Loss::forward`.
    pub labels: ::graphed::__private::Tensor,
}
/// The static outputs of [`Loss`]'s forward graph, one field per element `Loss::forward` returns. A replay writes them in place; a handle from an earlier replay reports itself stale rather than change under its holder.
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
pub struct LossOutputs {
    /// Output 0 of `Loss::forward`.
    pub output_0: ::graphed::__private::Tensor,
}
/// The static grad-output surface of [`Loss`]'s backward graph: one field per argument of `Loss::backward`, that is one grad per forward output.
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
pub struct LossGradOutputs {
    /// The `dloss` argument of `Loss::backward`.
    pub dloss: ::graphed::__private::Tensor,
}
/// The static grad-input surface of [`Loss`]'s backward graph: one grad per tensor argument of `Loss::forward`.
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
pub struct LossGradInputs {
    /// The grad of input `x`; `None` when that input needs no grad.
    pub x: ::graphed::__private::Option<::graphed::__private::Tensor>,
    /// The grad of input `labels`; `None` when that input needs no grad.
    pub labels: ::graphed::__private::Option<::graphed::__private::Tensor>,
}
/// The tensor arguments of `Loss::forward` after its first: what a `#[graphed(chained)]` struct's `forward` takes for [`Loss`] when it is the last chunk (its first argument is the previous chunk's output).
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
pub struct LossExtraInputs {
    /// The `labels` argument of `Loss::forward`.
    pub labels: ::graphed::__private::Tensor,
}
/// [`Loss`] captured into graphs by `#[graphed]`: `forward` and `backward` take and return what `Loss::forward` and `Loss::backward` do, and replay the captured graphs (the eager methods run instead in the mode the graphs were not captured for).
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
pub struct GraphedLoss {
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
    impl ::graphed::__private::Module for Loss {
        fn name(&self) -> &'static str {
            "Loss"
        }
        fn num_inputs(&self) -> usize {
            2
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
            let [__input0, __input1] = ::graphed::__private::slot_refs::<
                2,
            >(__inputs, "Loss", "inputs")?;
            let __output0 = Loss::forward(
                self,
                __cx,
                ::graphed::__private::FromSlotRef::from_slot_ref(__input0, "Loss", "x")?,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __input1,
                    "Loss",
                    "labels",
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
            let [__grad_output0] = ::graphed::__private::slot_refs::<
                1,
            >(__grad_outputs, "Loss", "grad outputs")?;
            let (__grad_input0, __grad_input1) = Loss::backward(
                self,
                __cx,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __grad_output0,
                    "Loss",
                    "dloss",
                )?,
            )?;
            ::graphed::__private::Ok(
                ::graphed::__private::vec![
                    ::graphed::__private::IntoSlot::into_slot(__grad_input0),
                    ::graphed::__private::IntoSlot::into_slot(__grad_input1)
                ],
            )
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
    impl LossInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 2;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 2] = ["x", "labels"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.x),
                ::graphed::__private::IntoSlot::into_slot(self.labels)
            ]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            let [__slot0, __slot1] = ::graphed::__private::slots::<
                2,
            >(slots, "Loss", "inputs")?;
            ::graphed::__private::Ok(Self {
                x: ::graphed::__private::FromSlot::from_slot(__slot0, "Loss", "x")?,
                labels: ::graphed::__private::FromSlot::from_slot(
                    __slot1,
                    "Loss",
                    "labels",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl LossOutputs {
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
            let [__slot0] = ::graphed::__private::slots::<1>(slots, "Loss", "outputs")?;
            ::graphed::__private::Ok(Self {
                output_0: ::graphed::__private::FromSlot::from_slot(
                    __slot0,
                    "Loss",
                    "output_0",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl LossGradOutputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["dloss"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.dloss)
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
            >(slots, "Loss", "grad outputs")?;
            ::graphed::__private::Ok(Self {
                dloss: ::graphed::__private::FromSlot::from_slot(
                    __slot0,
                    "Loss",
                    "dloss",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl LossGradInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 2;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 2] = ["x", "labels"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.x),
                ::graphed::__private::IntoSlot::into_slot(self.labels)
            ]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            let [__slot0, __slot1] = ::graphed::__private::slots::<
                2,
            >(slots, "Loss", "grad inputs")?;
            ::graphed::__private::Ok(Self {
                x: ::graphed::__private::FromSlot::from_slot(__slot0, "Loss", "x")?,
                labels: ::graphed::__private::FromSlot::from_slot(
                    __slot1,
                    "Loss",
                    "labels",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl LossExtraInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["labels"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.labels)
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
            >(slots, "Loss", "extra inputs")?;
            ::graphed::__private::Ok(Self {
                labels: ::graphed::__private::FromSlot::from_slot(
                    __slot0,
                    "Loss",
                    "labels",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for LossInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LossInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LossInputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(
                &[
                    ::graphed::__private::IntoSlot::into_slot(self.x),
                    ::graphed::__private::IntoSlot::into_slot(self.labels),
                ],
            )
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for LossOutputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LossOutputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LossOutputs::from_slots(slots)
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
    impl ::graphed::__private::Slots for LossGradOutputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LossGradOutputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LossGradOutputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[::graphed::__private::IntoSlot::into_slot(self.dloss)])
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for LossGradInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LossGradInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LossGradInputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(
                &[
                    ::graphed::__private::IntoSlot::into_slot(self.x),
                    ::graphed::__private::IntoSlot::into_slot(self.labels),
                ],
            )
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for LossExtraInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LossExtraInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LossExtraInputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[::graphed::__private::IntoSlot::into_slot(self.labels)])
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::TypedModule for Loss {
        type Inputs = LossInputs;
        type Outputs = LossOutputs;
        type GradOutputs = LossGradOutputs;
        type GradInputs = LossGradInputs;
    }
    #[automatically_derived]
    impl ::graphed::__private::ChainOut for Loss {}
    #[automatically_derived]
    impl ::graphed::__private::ChainIn for Loss {
        type Extra = LossExtraInputs;
    }
    #[automatically_derived]
    impl Loss {
        /// Warms up and captures this module with the given tensors as samples (`warmup = 3`, shape buckets along axis 0 (powers of two from 8 up to 256), input 1 padded with -100.0, eager above the largest), and returns the typed graphed wrapper. The samples fix the shapes of the static input surface, [`LossInputs`]. On failure the error hands the module back.
        pub fn make_graphed(
            self,
            x: &Tensor,
            labels: &Tensor,
        ) -> ::graphed::__private::CaptureResult<GraphedLoss, Loss> {
            GraphedLoss::new(
                self,
                LossInputs {
                    x: ::graphed::__private::Tensor::clone(x),
                    labels: ::graphed::__private::Tensor::clone(labels),
                },
                GraphedLoss::options(),
            )
        }
    }
    #[automatically_derived]
    impl GraphedLoss {
        /// The options `#[graphed(...)]` gives `Loss`: `warmup = 3`, shape buckets along axis 0 (powers of two from 8 up to 256), input 1 padded with -100.0, eager above the largest.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new()
                .warmup(3)
                .buckets(Self::buckets())
                .allow_unused_input(false)
        }
        /// The shape buckets `#[graphed(buckets(...))]` declares for `Loss`, along axis 0 (powers of two from 8 up to 256), input 1 padded with -100.0, eager above the largest. `new` captures with them unless its options name buckets of their own; samples are at the largest bucket's size.
        pub fn buckets() -> ::graphed::__private::Buckets {
            ::graphed::__private::Buckets::powers_of_two(0, 8, 256)
                .pad(1, -100.0)
                .above_largest(::graphed::__private::AboveLargest::Eager)
        }
        /// Warms up and captures `module` on `sample` with `options` (see [`Self::options`]
        /// for the ones the attribute gives). On failure the error hands `module` back.
        ///
        /// Without buckets of their own, `options` get [`Self::buckets`]; `sample` is
        /// then at the largest bucket's size.
        pub fn new(
            module: Loss,
            sample: LossInputs,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, Loss> {
            let options = ::graphed::__private::attribute_buckets(
                options,
                Self::buckets,
            );
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
                                    Loss,
                                >(__modules.next(), "Loss")
                            }),
                    )
                }
            }
        }
        /// Replays the forward graph on these inputs and returns its static outputs. No context
        /// is taken: the graphs keep what the forward saved until its backward.
        pub fn forward(
            &mut self,
            x: &Tensor,
            labels: &Tensor,
        ) -> ::graphed::__private::Result<Tensor> {
            let __outputs = self
                .__modules
                .forward(
                    0,
                    &[
                        ::graphed::__private::IntoSlot::into_slot(x),
                        ::graphed::__private::IntoSlot::into_slot(labels),
                    ],
                )?;
            let [__output0] = ::graphed::__private::slots::<
                1,
            >(__outputs, "Loss", "outputs")?;
            ::graphed::__private::Ok(
                ::graphed::__private::FromSlot::from_slot(__output0, "Loss", "output 0")?,
            )
        }
        /// Replays the backward graph of the oldest outstanding forward on these grads and
        /// returns the grads of the forward's inputs.
        pub fn backward(
            &mut self,
            dloss: &Tensor,
        ) -> ::graphed::__private::Result<(Option<Tensor>, Option<Tensor>)> {
            let __grad_inputs = self
                .__modules
                .backward(0, &[::graphed::__private::IntoSlot::into_slot(dloss)])?;
            let [__grad_input0, __grad_input1] = ::graphed::__private::slots::<
                2,
            >(__grad_inputs, "Loss", "grad inputs")?;
            ::graphed::__private::Ok((
                ::graphed::__private::FromSlot::from_slot(
                    __grad_input0,
                    "Loss",
                    "grad of x",
                )?,
                ::graphed::__private::FromSlot::from_slot(
                    __grad_input1,
                    "Loss",
                    "grad of labels",
                )?,
            ))
        }
        /// The captured module.
        pub fn module(&self) -> &Loss {
            ::graphed::__private::expect_module(self.__modules.module::<Loss>(0), "Loss")
        }
        /// The captured module, mutably (its parameters, for an optimizer step).
        pub fn module_mut(&mut self) -> &mut Loss {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<Loss>(0),
                "Loss",
            )
        }
        /// Gives the module back, unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> Loss {
            ::graphed::__private::unbox::<
                Loss,
            >((*self.__modules).into_modules().into_iter().next(), "Loss")
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
    impl ::graphed::__private::fmt::Debug for GraphedLoss {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
