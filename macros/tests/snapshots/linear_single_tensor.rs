// Input:
//
// #[graphed(warmup = 2, allow_unused_input)]
// impl Linear {
//     fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
//         todo!()
//     }
//     fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
//         todo!()
//     }
// }

// Expansion:

impl Linear {
    fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        todo!()
    }
    fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        todo!()
    }
}
/// The static input surface of [`Linear`]: one field per tensor argument of `Linear::forward`, in order. Capture records the graphs on buffers of these shapes; each replay copies its inputs into them (unless an input already is that buffer).
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
pub struct LinearInputs {
    /// The `x` argument of `Linear::forward`.
    pub x: ::graphed::__private::Tensor,
}
/// The static outputs of [`Linear`]'s forward graph, one field per element `Linear::forward` returns. A replay writes them in place; a handle from an earlier replay reports itself stale rather than change under its holder.
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
pub struct LinearOutputs {
    /// Output 0 of `Linear::forward`.
    pub output_0: ::graphed::__private::Tensor,
}
/// The static grad-output surface of [`Linear`]'s backward graph: one field per argument of `Linear::backward`, that is one grad per forward output.
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
pub struct LinearGradOutputs {
    /// The `dy` argument of `Linear::backward`.
    pub dy: ::graphed::__private::Tensor,
}
/// The static grad-input surface of [`Linear`]'s backward graph: one grad per tensor argument of `Linear::forward`.
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
pub struct LinearGradInputs {
    /// The grad of input `x`; `None` when that input needs no grad.
    pub x: ::graphed::__private::Option<::graphed::__private::Tensor>,
}
/// [`Linear`] captured into graphs by `#[graphed]`: `forward` and `backward` take and return what `Linear::forward` and `Linear::backward` do, and replay the captured graphs (the eager methods run instead in the mode the graphs were not captured for).
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
struct GraphedLinear {
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
    impl ::graphed::__private::Module for Linear {
        fn name(&self) -> &'static str {
            "Linear"
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
            >(__inputs, "Linear", "inputs")?;
            let __output0 = Linear::forward(
                self,
                __cx,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __input0,
                    "Linear",
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
            let [__grad_output0] = ::graphed::__private::slot_refs::<
                1,
            >(__grad_outputs, "Linear", "grad outputs")?;
            let __grad_input0 = Linear::backward(
                self,
                __cx,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __grad_output0,
                    "Linear",
                    "dy",
                )?,
            )?;
            ::graphed::__private::Ok(
                ::graphed::__private::vec![
                    ::graphed::__private::IntoSlot::into_slot(__grad_input0)
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
    impl LinearInputs {
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
            let [__slot0] = ::graphed::__private::slots::<1>(slots, "Linear", "inputs")?;
            ::graphed::__private::Ok(Self {
                x: ::graphed::__private::FromSlot::from_slot(__slot0, "Linear", "x")?,
            })
        }
    }
    #[automatically_derived]
    impl LinearOutputs {
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
            >(slots, "Linear", "outputs")?;
            ::graphed::__private::Ok(Self {
                output_0: ::graphed::__private::FromSlot::from_slot(
                    __slot0,
                    "Linear",
                    "output_0",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl LinearGradOutputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["dy"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.dy)
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
            >(slots, "Linear", "grad outputs")?;
            ::graphed::__private::Ok(Self {
                dy: ::graphed::__private::FromSlot::from_slot(__slot0, "Linear", "dy")?,
            })
        }
    }
    #[automatically_derived]
    impl LinearGradInputs {
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
            >(slots, "Linear", "grad inputs")?;
            ::graphed::__private::Ok(Self {
                x: ::graphed::__private::FromSlot::from_slot(__slot0, "Linear", "x")?,
            })
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for LinearInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LinearInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LinearInputs::from_slots(slots)
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
    impl ::graphed::__private::Slots for LinearOutputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LinearOutputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LinearOutputs::from_slots(slots)
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
    impl ::graphed::__private::Slots for LinearGradOutputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LinearGradOutputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LinearGradOutputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[::graphed::__private::IntoSlot::into_slot(self.dy)])
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for LinearGradInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            LinearGradInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            LinearGradInputs::from_slots(slots)
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
    impl ::graphed::__private::TypedModule for Linear {
        type Inputs = LinearInputs;
        type Outputs = LinearOutputs;
        type GradOutputs = LinearGradOutputs;
        type GradInputs = LinearGradInputs;
    }
    #[automatically_derived]
    impl ::graphed::__private::ChainOut for Linear {}
    #[automatically_derived]
    impl ::graphed::__private::ChainIn for Linear {
        type Extra = ();
    }
    #[automatically_derived]
    impl ::graphed::__private::ChainLink for Linear {}
    #[automatically_derived]
    impl Linear {
        /// Warms up and captures this module with the given tensors as samples (`warmup = 2`, `allow_unused_input`), and returns the typed graphed wrapper. The samples fix the shapes of the static input surface, [`LinearInputs`]. On failure the error hands the module back.
        fn make_graphed(
            self,
            x: &Tensor,
        ) -> ::graphed::__private::CaptureResult<GraphedLinear, Linear> {
            GraphedLinear::new(
                self,
                LinearInputs {
                    x: ::graphed::__private::Tensor::clone(x),
                },
                GraphedLinear::options(),
            )
        }
    }
    #[automatically_derived]
    impl GraphedLinear {
        /// The options `#[graphed(...)]` gives `Linear`: `warmup = 2`, `allow_unused_input`.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new().warmup(2).allow_unused_input(true)
        }
        /// Warms up and captures `module` on `sample` with `options` (see [`Self::options`]
        /// for the ones the attribute gives). On failure the error hands `module` back.
        pub fn new(
            module: Linear,
            sample: LinearInputs,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, Linear> {
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
                                    Linear,
                                >(__modules.next(), "Linear")
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
            >(__outputs, "Linear", "outputs")?;
            ::graphed::__private::Ok(
                ::graphed::__private::FromSlot::from_slot(
                    __output0,
                    "Linear",
                    "output 0",
                )?,
            )
        }
        /// Replays the backward graph of the oldest outstanding forward on these grads and
        /// returns the grads of the forward's inputs.
        pub fn backward(
            &mut self,
            dy: &Tensor,
        ) -> ::graphed::__private::Result<Option<Tensor>> {
            let __grad_inputs = self
                .__modules
                .backward(0, &[::graphed::__private::IntoSlot::into_slot(dy)])?;
            let [__grad_input0] = ::graphed::__private::slots::<
                1,
            >(__grad_inputs, "Linear", "grad inputs")?;
            ::graphed::__private::Ok(
                ::graphed::__private::FromSlot::from_slot(
                    __grad_input0,
                    "Linear",
                    "grad of x",
                )?,
            )
        }
        /// The captured module.
        pub fn module(&self) -> &Linear {
            ::graphed::__private::expect_module(
                self.__modules.module::<Linear>(0),
                "Linear",
            )
        }
        /// The captured module, mutably (its parameters, for an optimizer step).
        pub fn module_mut(&mut self) -> &mut Linear {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<Linear>(0),
                "Linear",
            )
        }
        /// Gives the module back, unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> Linear {
            ::graphed::__private::unbox::<
                Linear,
            >((*self.__modules).into_modules().into_iter().next(), "Linear")
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
    impl ::graphed::__private::fmt::Debug for GraphedLinear {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
