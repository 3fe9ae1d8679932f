// Input:
//
// #[derive(Parameters)]
// struct Net<T> {
//     layers: Vec<Layer>,
//     #[param(nested)]
//     mlp: Mlp,
//     #[param(rename = "head")]
//     out: Param,
//     #[param(skip)]
//     cache: Param,
//     inner: T,
// }

// Expansion:

#[allow(
    unused_qualifications,
    unused_imports,
    unused_variables,
    clippy::all,
    clippy::pedantic
)]
const _: () = {
    use ::graphed::__private::{ParamsViaNothing as _, ParamsViaTrait as _};
    #[automatically_derived]
    impl<T> ::graphed::__private::Parameters for Net<T>
    where
        T: ::graphed::__private::Parameters,
    {
        fn visit_params(
            &self,
            __prefix: &str,
            __f: &mut dyn FnMut(&str, &::graphed::__private::Param),
        ) {
            (&&::graphed::__private::ParamsProbe(&self.layers))
                .__graphed_visit_params(
                    &::graphed::__private::param_path(__prefix, "layers"),
                    __f,
                );
            <Mlp as ::graphed::__private::Parameters>::visit_params(
                &self.mlp,
                &::graphed::__private::param_path(__prefix, "mlp"),
                __f,
            );
            (&&::graphed::__private::ParamsProbe(&self.out))
                .__graphed_visit_params(
                    &::graphed::__private::param_path(__prefix, "head"),
                    __f,
                );
            <T as ::graphed::__private::Parameters>::visit_params(
                &self.inner,
                &::graphed::__private::param_path(__prefix, "inner"),
                __f,
            );
        }
    }
};
