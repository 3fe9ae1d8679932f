// Input:
//
// #[graphed(crate = "renamed")]
// impl Scale {
//     pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
//         todo!()
//     }
//     pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
//         todo!()
//     }
// }

// Expansion:

impl Scale {
    pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        todo!()
    }
    pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        todo!()
    }
}
/// The static input surface of [`Scale`]: one field per tensor argument of `Scale::forward`, in order. Capture records the graphs on buffers of these shapes; each replay copies its inputs into them (unless an input already is that buffer).
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
pub struct ScaleInputs {
    /// The `x` argument of `Scale::forward`.
    pub x: renamed::__private::Tensor,
}
/// The static outputs of [`Scale`]'s forward graph, one field per element `Scale::forward` returns. A replay writes them in place; a handle from an earlier replay reports itself stale rather than change under its holder.
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
pub struct ScaleOutputs {
    /// Output 0 of `Scale::forward`.
    pub output_0: renamed::__private::Tensor,
}
/// The static grad-output surface of [`Scale`]'s backward graph: one field per argument of `Scale::backward`, that is one grad per forward output.
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
pub struct ScaleGradOutputs {
    /// The `dy` argument of `Scale::backward`.
    pub dy: renamed::__private::Tensor,
}
/// The static grad-input surface of [`Scale`]'s backward graph: one grad per tensor argument of `Scale::forward`.
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
pub struct ScaleGradInputs {
    /// The grad of input `x`; `None` when that input needs no grad.
    pub x: renamed::__private::Option<renamed::__private::Tensor>,
}
/// [`Scale`] captured into graphs by `#[graphed]`: `forward` and `backward` take and return what `Scale::forward` and `Scale::backward` do, and replay the captured graphs (the eager methods run instead in the mode the graphs were not captured for).
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
pub struct GraphedScale {
    __modules: renamed::__private::Box<renamed::__private::GraphedModules>,
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
    impl renamed::__private::Module for Scale {
        fn name(&self) -> &'static str {
            "Scale"
        }
        fn num_inputs(&self) -> usize {
            1
        }
        fn forward(
            &self,
            __cx: &mut renamed::__private::Cx,
            __inputs: &[renamed::__private::Option<renamed::__private::Tensor>],
        ) -> renamed::__private::Result<
            renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        > {
            let [__input0] = renamed::__private::slot_refs::<
                1,
            >(__inputs, "Scale", "inputs")?;
            let __output0 = Scale::forward(
                self,
                __cx,
                renamed::__private::FromSlotRef::from_slot_ref(__input0, "Scale", "x")?,
            )?;
            renamed::__private::Ok(
                renamed::__private::vec![
                    renamed::__private::IntoSlot::into_slot(__output0)
                ],
            )
        }
        fn backward(
            &mut self,
            __cx: &mut renamed::__private::Cx,
            __grad_outputs: &[renamed::__private::Option<renamed::__private::Tensor>],
        ) -> renamed::__private::Result<
            renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        > {
            let [__grad_output0] = renamed::__private::slot_refs::<
                1,
            >(__grad_outputs, "Scale", "grad outputs")?;
            let __grad_input0 = Scale::backward(
                self,
                __cx,
                renamed::__private::FromSlotRef::from_slot_ref(
                    __grad_output0,
                    "Scale",
                    "dy",
                )?,
            )?;
            renamed::__private::Ok(
                renamed::__private::vec![
                    renamed::__private::IntoSlot::into_slot(__grad_input0)
                ],
            )
        }
        fn visit_params(&self, __f: &mut dyn FnMut(&str, &renamed::__private::Param)) {
            #[allow(unused_imports)]
            use renamed::__private::{ParamsViaNothing as _, ParamsViaTrait as _};
            (&&renamed::__private::ParamsProbe(self)).__graphed_visit_params("", __f)
        }
        fn exposes_params(&self) -> bool {
            #[allow(unused_imports)]
            use renamed::__private::{ParamsViaNothing as _, ParamsViaTrait as _};
            (&&renamed::__private::ParamsProbe(self)).__graphed_has_params()
        }
    }
    #[automatically_derived]
    impl ScaleInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["x"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            renamed::__private::vec![renamed::__private::IntoSlot::into_slot(self.x)]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            let [__slot0] = renamed::__private::slots::<1>(slots, "Scale", "inputs")?;
            renamed::__private::Ok(Self {
                x: renamed::__private::FromSlot::from_slot(__slot0, "Scale", "x")?,
            })
        }
    }
    #[automatically_derived]
    impl ScaleOutputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["output_0"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            renamed::__private::vec![
                renamed::__private::IntoSlot::into_slot(self.output_0)
            ]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            let [__slot0] = renamed::__private::slots::<1>(slots, "Scale", "outputs")?;
            renamed::__private::Ok(Self {
                output_0: renamed::__private::FromSlot::from_slot(
                    __slot0,
                    "Scale",
                    "output_0",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl ScaleGradOutputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["dy"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            renamed::__private::vec![renamed::__private::IntoSlot::into_slot(self.dy)]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            let [__slot0] = renamed::__private::slots::<
                1,
            >(slots, "Scale", "grad outputs")?;
            renamed::__private::Ok(Self {
                dy: renamed::__private::FromSlot::from_slot(__slot0, "Scale", "dy")?,
            })
        }
    }
    #[automatically_derived]
    impl ScaleGradInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["x"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            renamed::__private::vec![renamed::__private::IntoSlot::into_slot(self.x)]
        }
        /// Reads positional slots; errors when their number differs or a required tensor is
        /// missing.
        pub fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            let [__slot0] = renamed::__private::slots::<
                1,
            >(slots, "Scale", "grad inputs")?;
            renamed::__private::Ok(Self {
                x: renamed::__private::FromSlot::from_slot(__slot0, "Scale", "x")?,
            })
        }
    }
    #[automatically_derived]
    impl renamed::__private::Slots for ScaleInputs {
        fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            ScaleInputs::into_slots(self)
        }
        fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            ScaleInputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[renamed::__private::Option<renamed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[renamed::__private::IntoSlot::into_slot(self.x)])
        }
    }
    #[automatically_derived]
    impl renamed::__private::Slots for ScaleOutputs {
        fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            ScaleOutputs::into_slots(self)
        }
        fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            ScaleOutputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[renamed::__private::Option<renamed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[renamed::__private::IntoSlot::into_slot(self.output_0)])
        }
    }
    #[automatically_derived]
    impl renamed::__private::Slots for ScaleGradOutputs {
        fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            ScaleGradOutputs::into_slots(self)
        }
        fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            ScaleGradOutputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[renamed::__private::Option<renamed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[renamed::__private::IntoSlot::into_slot(self.dy)])
        }
    }
    #[automatically_derived]
    impl renamed::__private::Slots for ScaleGradInputs {
        fn into_slots(
            self,
        ) -> renamed::__private::Vec<
            renamed::__private::Option<renamed::__private::Tensor>,
        > {
            ScaleGradInputs::into_slots(self)
        }
        fn from_slots(
            slots: renamed::__private::Vec<
                renamed::__private::Option<renamed::__private::Tensor>,
            >,
        ) -> renamed::__private::Result<Self> {
            ScaleGradInputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[renamed::__private::Option<renamed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[renamed::__private::IntoSlot::into_slot(self.x)])
        }
    }
    #[automatically_derived]
    impl renamed::__private::TypedModule for Scale {
        type Inputs = ScaleInputs;
        type Outputs = ScaleOutputs;
        type GradOutputs = ScaleGradOutputs;
        type GradInputs = ScaleGradInputs;
    }
    #[automatically_derived]
    impl renamed::__private::ChainOut for Scale {}
    #[automatically_derived]
    impl renamed::__private::ChainIn for Scale {
        type Extra = ();
    }
    #[automatically_derived]
    impl renamed::__private::ChainLink for Scale {}
    #[automatically_derived]
    impl Scale {
        /// Warms up and captures this module with the given tensors as samples (`warmup = 3`), and returns the typed graphed wrapper. The samples fix the shapes of the static input surface, [`ScaleInputs`]. On failure the error hands the module back.
        pub fn make_graphed(
            self,
            x: &Tensor,
        ) -> renamed::__private::CaptureResult<GraphedScale, Scale> {
            GraphedScale::new(
                self,
                ScaleInputs {
                    x: renamed::__private::Tensor::clone(x),
                },
                GraphedScale::options(),
            )
        }
    }
    #[automatically_derived]
    impl GraphedScale {
        /// The options `#[graphed(...)]` gives `Scale`: `warmup = 3`.
        pub fn options() -> renamed::__private::GraphOptions {
            renamed::__private::GraphOptions::new().warmup(3).allow_unused_input(false)
        }
        /// Warms up and captures `module` on `sample` with `options` (see [`Self::options`]
        /// for the ones the attribute gives). On failure the error hands `module` back.
        pub fn new(
            module: Scale,
            sample: ScaleInputs,
            options: renamed::__private::GraphOptions,
        ) -> renamed::__private::CaptureResult<Self, Scale> {
            match renamed::__private::make_graphed(
                renamed::__private::vec![renamed::__private::boxed(module)],
                renamed::__private::vec![renamed::__private::vec![sample.into_slots()]],
                options,
            ) {
                renamed::__private::Ok(__modules) => {
                    renamed::__private::Ok(Self {
                        __modules: renamed::__private::Box::new(__modules),
                    })
                }
                renamed::__private::Err(__error) => {
                    renamed::__private::Err(
                        __error
                            .map(|__modules| {
                                let mut __modules = __modules.into_iter();
                                renamed::__private::unbox::<
                                    Scale,
                                >(__modules.next(), "Scale")
                            }),
                    )
                }
            }
        }
        /// Replays the forward graph on these inputs and returns its static outputs. No context
        /// is taken: the graphs keep what the forward saved until its backward.
        pub fn forward(&mut self, x: &Tensor) -> renamed::__private::Result<Tensor> {
            let __outputs = self
                .__modules
                .forward(0, &[renamed::__private::IntoSlot::into_slot(x)])?;
            let [__output0] = renamed::__private::slots::<
                1,
            >(__outputs, "Scale", "outputs")?;
            renamed::__private::Ok(
                renamed::__private::FromSlot::from_slot(__output0, "Scale", "output 0")?,
            )
        }
        /// Replays the backward graph of the oldest outstanding forward on these grads and
        /// returns the grads of the forward's inputs.
        pub fn backward(
            &mut self,
            dy: &Tensor,
        ) -> renamed::__private::Result<Option<Tensor>> {
            let __grad_inputs = self
                .__modules
                .backward(0, &[renamed::__private::IntoSlot::into_slot(dy)])?;
            let [__grad_input0] = renamed::__private::slots::<
                1,
            >(__grad_inputs, "Scale", "grad inputs")?;
            renamed::__private::Ok(
                renamed::__private::FromSlot::from_slot(
                    __grad_input0,
                    "Scale",
                    "grad of x",
                )?,
            )
        }
        /// The captured module.
        pub fn module(&self) -> &Scale {
            renamed::__private::expect_module(self.__modules.module::<Scale>(0), "Scale")
        }
        /// The captured module, mutably (its parameters, for an optimizer step).
        pub fn module_mut(&mut self) -> &mut Scale {
            renamed::__private::expect_module(
                self.__modules.module_mut::<Scale>(0),
                "Scale",
            )
        }
        /// Gives the module back, unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> Scale {
            renamed::__private::unbox::<
                Scale,
            >((*self.__modules).into_modules().into_iter().next(), "Scale")
        }
        /// The type-erased graphs (pool, run-time hooks, ...).
        pub fn inner(&self) -> &renamed::__private::GraphedModules {
            &self.__modules
        }
        /// The type-erased graphs, mutably.
        pub fn inner_mut(&mut self) -> &mut renamed::__private::GraphedModules {
            &mut self.__modules
        }
        /// Unwraps the type-erased graphs.
        pub fn into_inner(self) -> renamed::__private::GraphedModules {
            *self.__modules
        }
        /// Builds the one-launch step once (see `GraphedModules::fuse`).
        pub fn fuse(&mut self) -> renamed::__private::Result<()> {
            self.__modules.fuse()
        }
        /// Replays one whole iteration of the schedule as one launch, on the inputs and grad
        /// outputs bound to the static buffers (see `GraphedModules::step`); call
        /// [`Self::fuse`] once first.
        pub fn step(&mut self) -> renamed::__private::Result<()> {
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
    impl renamed::__private::fmt::Debug for GraphedScale {
        fn fmt(
            &self,
            f: &mut renamed::__private::fmt::Formatter<'_>,
        ) -> renamed::__private::fmt::Result {
            renamed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
