// Input:
//
// #[graphed(warmup = 0, bogus = 1)]
// impl Block {
//     fn forward(&self, cx: &mut Cx, x: &Tensor, n: usize) -> Result<Tensor> {
//         todo!()
//     }
//     fn backward(
//         &mut self,
//         cx: &mut Cx,
//         dy: &Tensor,
//     ) -> Result<(Option<Tensor>, Option<Tensor>)> {
//         todo!()
//     }
//     #[capture_time_hook(pre_forwrd)]
//     fn unshard(&self) -> usize {
//         0
//     }
// }

// Expansion:

impl Block {
    fn forward(&self, cx: &mut Cx, x: &Tensor, n: usize) -> Result<Tensor> {
        todo!()
    }
    fn backward(
        &mut self,
        cx: &mut Cx,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        todo!()
    }
    #[capture_time_hook(__graphed_consumed)]
    fn unshard(&self) -> usize {
        0
    }
}
::core::compile_error! {
    "unknown #[graphed] key `bogus`; expected one of `warmup`, `order`, `chained`, `buckets`, `allow_unused_input`, `crate`"
}
::core::compile_error! {
    "`warmup` is the number of eager iterations before capture, a positive integer, not 0"
}
::core::compile_error! {
    "non-tensor forward arguments are not supported: after `cx`, a graphed `forward` takes only `&Tensor` or `Option<&Tensor>` (graphs replay on fixed tensor inputs; keep other values in the module's fields)"
}
::core::compile_error! {
    "unknown capture-time hook kind `pre_forwrd`; expected one of `pre_forward`, `forward`, `pre_backward`, `backward` (optionally followed by `prepend`)"
}
::core::compile_error! {
    "a capture-time hook takes `&mut self`: `fn name(&mut self)` returning `()` or `Result<()>`"
}
::core::compile_error! {
    "a capture-time hook returns `()` or `Result<()>`, not a value: it runs outside the graphs and nothing receives what it returns"
}
#[allow(unused_qualifications, unused_variables)]
const _: () = {
    #[automatically_derived]
    impl ::graphed::__private::Module for Block {
        fn name(&self) -> &'static str {
            ::core::unreachable!()
        }
        fn num_inputs(&self) -> usize {
            ::core::unreachable!()
        }
        fn forward(
            &self,
            cx: &mut ::graphed::__private::Cx,
            inputs: &[::graphed::__private::Option<::graphed::__private::Tensor>],
        ) -> ::graphed::__private::Result<
            ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        > {
            ::core::unreachable!()
        }
        fn backward(
            &mut self,
            cx: &mut ::graphed::__private::Cx,
            grad_outputs: &[::graphed::__private::Option<::graphed::__private::Tensor>],
        ) -> ::graphed::__private::Result<
            ::graphed::__private::Vec<
                ::graphed::__private::Option<::graphed::__private::Tensor>,
            >,
        > {
            ::core::unreachable!()
        }
    }
};
