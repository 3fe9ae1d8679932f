// Input:
//
// #[graphed(warmup = 3)]
// impl Block {
//     pub fn forward(
//         &self,
//         cx: &mut Cx,
//         x: &Tensor,
//         mask: Option<&Tensor>,
//     ) -> Result<(Tensor, Option<Tensor>)> {
//         todo!()
//     }
//     pub fn backward(
//         &mut self,
//         cx: &mut Cx,
//         dy: &Tensor,
//         dz: Option<&Tensor>,
//     ) -> Result<(Option<Tensor>, Option<Tensor>)> {
//         todo!()
//     }
//     #[capture_time_hook(pre_forward)]
//     fn unshard(&mut self) -> Result<()> {
//         Ok(())
//     }
//     #[capture_time_hook(backward)]
//     fn reshard(&mut self) {}
//     #[capture_time_hook(backward, prepend)]
//     fn flush(&mut self) {}
// }

// Expansion:

impl Block {
    pub fn forward(
        &self,
        cx: &mut Cx,
        x: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        todo!()
    }
    pub fn backward(
        &mut self,
        cx: &mut Cx,
        dy: &Tensor,
        dz: Option<&Tensor>,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        todo!()
    }
    #[capture_time_hook(__graphed_consumed)]
    fn unshard(&mut self) -> Result<()> {
        Ok(())
    }
    #[capture_time_hook(__graphed_consumed)]
    fn reshard(&mut self) {}
    #[capture_time_hook(__graphed_consumed)]
    fn flush(&mut self) {}
}
/// The static input surface of [`Block`]: one field per tensor argument of `Block::forward`, in order. Capture records the graphs on buffers of these shapes; each replay copies its inputs into them (unless an input already is that buffer).
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
pub struct BlockInputs {
    /// The `x` argument of `Block::forward`.
    pub x: ::graphed::__private::Tensor,
    /// The `mask` argument of `Block::forward` (`None` when absent).
    pub mask: ::graphed::__private::Option<::graphed::__private::Tensor>,
}
/// The static outputs of [`Block`]'s forward graph, one field per element `Block::forward` returns. A replay writes them in place; a handle from an earlier replay reports itself stale rather than change under its holder.
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
pub struct BlockOutputs {
    /// Output 0 of `Block::forward`.
    pub output_0: ::graphed::__private::Tensor,
    /// Output 1 of `Block::forward` (`None` when absent).
    pub output_1: ::graphed::__private::Option<::graphed::__private::Tensor>,
}
/// The static grad-output surface of [`Block`]'s backward graph: one field per argument of `Block::backward`, that is one grad per forward output.
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
pub struct BlockGradOutputs {
    /// The `dy` argument of `Block::backward`.
    pub dy: ::graphed::__private::Tensor,
    /// The `dz` argument of `Block::backward` (`None` when absent).
    pub dz: ::graphed::__private::Option<::graphed::__private::Tensor>,
}
/// The static grad-input surface of [`Block`]'s backward graph: one grad per tensor argument of `Block::forward`.
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
pub struct BlockGradInputs {
    /// The grad of input `x`; `None` when that input needs no grad.
    pub x: ::graphed::__private::Option<::graphed::__private::Tensor>,
    /// The grad of input `mask`; `None` when that input needs no grad or was absent.
    pub mask: ::graphed::__private::Option<::graphed::__private::Tensor>,
}
/// The tensor arguments of `Block::forward` after its first: what a `#[graphed(chained)]` struct's `forward` takes for [`Block`] when it is the last chunk (its first argument is the previous chunk's output).
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
pub struct BlockExtraInputs {
    /// The `mask` argument of `Block::forward` (`None` when absent).
    pub mask: ::graphed::__private::Option<::graphed::__private::Tensor>,
}
/// [`Block`] captured into graphs by `#[graphed]`: `forward` and `backward` take and return what `Block::forward` and `Block::backward` do, and replay the captured graphs (the eager methods run instead in the mode the graphs were not captured for).
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
pub struct GraphedBlock {
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
    impl ::graphed::__private::Module for Block {
        fn name(&self) -> &'static str {
            "Block"
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
            >(__inputs, "Block", "inputs")?;
            let (__output0, __output1) = Block::forward(
                self,
                __cx,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __input0,
                    "Block",
                    "x",
                )?,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __input1,
                    "Block",
                    "mask",
                )?,
            )?;
            ::graphed::__private::Ok(
                ::graphed::__private::vec![
                    ::graphed::__private::IntoSlot::into_slot(__output0),
                    ::graphed::__private::IntoSlot::into_slot(__output1)
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
            let [__grad_output0, __grad_output1] = ::graphed::__private::slot_refs::<
                2,
            >(__grad_outputs, "Block", "grad outputs")?;
            let (__grad_input0, __grad_input1) = Block::backward(
                self,
                __cx,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __grad_output0,
                    "Block",
                    "dy",
                )?,
                ::graphed::__private::FromSlotRef::from_slot_ref(
                    __grad_output1,
                    "Block",
                    "dz",
                )?,
            )?;
            ::graphed::__private::Ok(
                ::graphed::__private::vec![
                    ::graphed::__private::IntoSlot::into_slot(__grad_input0),
                    ::graphed::__private::IntoSlot::into_slot(__grad_input1)
                ],
            )
        }
        fn run_hooks(
            &mut self,
            __kind: ::graphed::__private::HookKind,
        ) -> ::graphed::__private::Result<()> {
            match __kind {
                ::graphed::__private::HookKind::PreForward => {
                    ::graphed::__private::hook(Block::unshard(self), "Block::unshard")?;
                }
                ::graphed::__private::HookKind::Forward => {}
                ::graphed::__private::HookKind::PreBackward => {}
                ::graphed::__private::HookKind::Backward => {
                    ::graphed::__private::hook(Block::flush(self), "Block::flush")?;
                    ::graphed::__private::hook(Block::reshard(self), "Block::reshard")?;
                }
            }
            ::graphed::__private::Ok(())
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
    impl BlockInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 2;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 2] = ["x", "mask"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.x),
                ::graphed::__private::IntoSlot::into_slot(self.mask)
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
            >(slots, "Block", "inputs")?;
            ::graphed::__private::Ok(Self {
                x: ::graphed::__private::FromSlot::from_slot(__slot0, "Block", "x")?,
                mask: ::graphed::__private::FromSlot::from_slot(
                    __slot1,
                    "Block",
                    "mask",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl BlockOutputs {
        /// The number of tensor slots.
        pub const LEN: usize = 2;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 2] = ["output_0", "output_1"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.output_0),
                ::graphed::__private::IntoSlot::into_slot(self.output_1)
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
            >(slots, "Block", "outputs")?;
            ::graphed::__private::Ok(Self {
                output_0: ::graphed::__private::FromSlot::from_slot(
                    __slot0,
                    "Block",
                    "output_0",
                )?,
                output_1: ::graphed::__private::FromSlot::from_slot(
                    __slot1,
                    "Block",
                    "output_1",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl BlockGradOutputs {
        /// The number of tensor slots.
        pub const LEN: usize = 2;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 2] = ["dy", "dz"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.dy),
                ::graphed::__private::IntoSlot::into_slot(self.dz)
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
            >(slots, "Block", "grad outputs")?;
            ::graphed::__private::Ok(Self {
                dy: ::graphed::__private::FromSlot::from_slot(__slot0, "Block", "dy")?,
                dz: ::graphed::__private::FromSlot::from_slot(__slot1, "Block", "dz")?,
            })
        }
    }
    #[automatically_derived]
    impl BlockGradInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 2;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 2] = ["x", "mask"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.x),
                ::graphed::__private::IntoSlot::into_slot(self.mask)
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
            >(slots, "Block", "grad inputs")?;
            ::graphed::__private::Ok(Self {
                x: ::graphed::__private::FromSlot::from_slot(__slot0, "Block", "x")?,
                mask: ::graphed::__private::FromSlot::from_slot(
                    __slot1,
                    "Block",
                    "mask",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl BlockExtraInputs {
        /// The number of tensor slots.
        pub const LEN: usize = 1;
        /// The field names, in slot order.
        pub const NAMES: [&'static str; 1] = ["mask"];
        /// The positional slots the type-erased `Module` interface uses (`None` for an
        /// absent optional tensor), in field order.
        pub fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            ::graphed::__private::vec![
                ::graphed::__private::IntoSlot::into_slot(self.mask)
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
            >(slots, "Block", "extra inputs")?;
            ::graphed::__private::Ok(Self {
                mask: ::graphed::__private::FromSlot::from_slot(
                    __slot0,
                    "Block",
                    "mask",
                )?,
            })
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for BlockInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            BlockInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            BlockInputs::from_slots(slots)
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
                    ::graphed::__private::IntoSlot::into_slot(self.mask),
                ],
            )
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for BlockOutputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            BlockOutputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            BlockOutputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(
                &[
                    ::graphed::__private::IntoSlot::into_slot(self.output_0),
                    ::graphed::__private::IntoSlot::into_slot(self.output_1),
                ],
            )
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for BlockGradOutputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            BlockGradOutputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            BlockGradOutputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(
                &[
                    ::graphed::__private::IntoSlot::into_slot(self.dy),
                    ::graphed::__private::IntoSlot::into_slot(self.dz),
                ],
            )
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for BlockGradInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            BlockGradInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            BlockGradInputs::from_slots(slots)
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
                    ::graphed::__private::IntoSlot::into_slot(self.mask),
                ],
            )
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::Slots for BlockExtraInputs {
        fn into_slots(
            self,
        ) -> ::graphed::__private::Vec<
            ::graphed::__private::Option<::graphed::__private::Tensor>,
        > {
            BlockExtraInputs::into_slots(self)
        }
        fn from_slots(
            slots: ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        ) -> ::graphed::__private::Result<Self> {
            BlockExtraInputs::from_slots(slots)
        }
        fn with_slots<R>(
            self,
            f: impl FnOnce(
                &[::graphed::__private::Option<::graphed::__private::Tensor>],
            ) -> R,
        ) -> R {
            f(&[::graphed::__private::IntoSlot::into_slot(self.mask)])
        }
    }
    #[automatically_derived]
    impl ::graphed::__private::TypedModule for Block {
        type Inputs = BlockInputs;
        type Outputs = BlockOutputs;
        type GradOutputs = BlockGradOutputs;
        type GradInputs = BlockGradInputs;
    }
    #[automatically_derived]
    impl ::graphed::__private::ChainIn for Block {
        type Extra = BlockExtraInputs;
    }
    #[automatically_derived]
    impl Block {
        /// Warms up and captures this module with the given tensors as samples (`warmup = 3`), and returns the typed graphed wrapper. The samples fix the shapes of the static input surface, [`BlockInputs`]. On failure the error hands the module back.
        pub fn make_graphed(
            self,
            x: &Tensor,
            mask: Option<&Tensor>,
        ) -> ::graphed::__private::CaptureResult<GraphedBlock, Block> {
            GraphedBlock::new(
                self,
                BlockInputs {
                    x: ::graphed::__private::Tensor::clone(x),
                    mask: ::graphed::__private::IntoSlot::into_slot(mask),
                },
                GraphedBlock::options(),
            )
        }
    }
    #[automatically_derived]
    impl GraphedBlock {
        /// The options `#[graphed(...)]` gives `Block`: `warmup = 3`.
        pub fn options() -> ::graphed::__private::GraphOptions {
            ::graphed::__private::GraphOptions::new().warmup(3).allow_unused_input(false)
        }
        /// Warms up and captures `module` on `sample` with `options` (see [`Self::options`]
        /// for the ones the attribute gives). On failure the error hands `module` back.
        pub fn new(
            module: Block,
            sample: BlockInputs,
            options: ::graphed::__private::GraphOptions,
        ) -> ::graphed::__private::CaptureResult<Self, Block> {
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
                                    Block,
                                >(__modules.next(), "Block")
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
            mask: Option<&Tensor>,
        ) -> ::graphed::__private::Result<(Tensor, Option<Tensor>)> {
            let __outputs = self
                .__modules
                .forward(
                    0,
                    &[
                        ::graphed::__private::IntoSlot::into_slot(x),
                        ::graphed::__private::IntoSlot::into_slot(mask),
                    ],
                )?;
            let [__output0, __output1] = ::graphed::__private::slots::<
                2,
            >(__outputs, "Block", "outputs")?;
            ::graphed::__private::Ok((
                ::graphed::__private::FromSlot::from_slot(
                    __output0,
                    "Block",
                    "output 0",
                )?,
                ::graphed::__private::FromSlot::from_slot(
                    __output1,
                    "Block",
                    "output 1",
                )?,
            ))
        }
        /// Replays the backward graph of the oldest outstanding forward on these grads and
        /// returns the grads of the forward's inputs.
        pub fn backward(
            &mut self,
            dy: &Tensor,
            dz: Option<&Tensor>,
        ) -> ::graphed::__private::Result<(Option<Tensor>, Option<Tensor>)> {
            let __grad_inputs = self
                .__modules
                .backward(
                    0,
                    &[
                        ::graphed::__private::IntoSlot::into_slot(dy),
                        ::graphed::__private::IntoSlot::into_slot(dz),
                    ],
                )?;
            let [__grad_input0, __grad_input1] = ::graphed::__private::slots::<
                2,
            >(__grad_inputs, "Block", "grad inputs")?;
            ::graphed::__private::Ok((
                ::graphed::__private::FromSlot::from_slot(
                    __grad_input0,
                    "Block",
                    "grad of x",
                )?,
                ::graphed::__private::FromSlot::from_slot(
                    __grad_input1,
                    "Block",
                    "grad of mask",
                )?,
            ))
        }
        /// The captured module.
        pub fn module(&self) -> &Block {
            ::graphed::__private::expect_module(
                self.__modules.module::<Block>(0),
                "Block",
            )
        }
        /// The captured module, mutably (its parameters, for an optimizer step).
        pub fn module_mut(&mut self) -> &mut Block {
            ::graphed::__private::expect_module(
                self.__modules.module_mut::<Block>(0),
                "Block",
            )
        }
        /// Gives the module back, unchanged, dropping the graphs and their pool.
        pub fn into_module(self) -> Block {
            ::graphed::__private::unbox::<
                Block,
            >((*self.__modules).into_modules().into_iter().next(), "Block")
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
    impl ::graphed::__private::fmt::Debug for GraphedBlock {
        fn fmt(
            &self,
            f: &mut ::graphed::__private::fmt::Formatter<'_>,
        ) -> ::graphed::__private::fmt::Result {
            ::graphed::__private::fmt::Debug::fmt(&self.__modules, f)
        }
    }
};
