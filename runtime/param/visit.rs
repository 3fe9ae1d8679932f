//! The parameter visitor: every [`Param`] of a module, by name, for optimizers, `zero_grad`,
//! forward-only capture decisions and safetensors save/load.

use crate::{Param, Result};

/// A type that holds parameters: it can visit each [`Param`] with its name.
///
/// `#[derive(Parameters)]` implements it for a struct from its fields: a field is visited when
/// its type implements `Parameters` (`Param`, `Vec<Param>`, `Option<Param>`, `[Param; N]`,
/// `Box<Param>`, another deriving struct, and nestings of these), named by its field path
/// (`layers.0.w`, `mlp.up.w`); fields of other types (`f32`, a [`crate::Kernel`], a log, ...)
/// are left out. Attributes on a field: `#[param(skip)]` leaves it out,
/// `#[param(rename = "name")]` names it, `#[param(nested)]` requires it to implement
/// `Parameters` (a compile error otherwise). A field whose type names a generic parameter must
/// implement `Parameters` (the derive adds the bound) unless it is skipped. On the struct,
/// `#[param(crate = "path")]` says where the `graphed` crate is.
///
/// `#[graphed]` forwards [`crate::Module::visit_params`] to this impl when the type has one.
///
/// ```
/// use graphed::{Device, Param, Parameters, Tensor};
///
/// #[derive(Parameters)]
/// struct Linear { w: Param, b: Option<Param> }
///
/// #[derive(Parameters)]
/// struct Mlp { layers: Vec<Linear>, scale: f32, #[param(rename = "head")] out: [Param; 1] }
///
/// let dev = Device::host();
/// let p = |n| Param::new(Tensor::zeros(&dev, &[n])?);
/// let mlp = Mlp {
///     layers: vec![Linear { w: p(4)?, b: Some(p(2)?) }, Linear { w: p(4)?, b: None }],
///     scale: 1.0,
///     out: [p(2)?],
/// };
/// let names: Vec<String> = mlp.parameters().into_iter().map(|(name, _)| name).collect();
/// assert_eq!(names, ["layers.0.w", "layers.0.b", "layers.1.w", "head.0"]);
/// mlp.zero_grad()?;
/// # Ok::<(), graphed::Error>(())
/// ```
pub trait Parameters {
    /// Calls `f` with each parameter's full name (`prefix`, a dot, the path below) and handle,
    /// in declaration order. An empty `prefix` names from the root.
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param));

    /// Every parameter with its name, in visiting order.
    fn parameters(&self) -> Vec<(String, Param)> {
        let mut out = Vec::new();
        self.visit_params("", &mut |name, p| out.push((name.to_string(), p.clone())));
        out
    }

    /// The parameters that need a grad ([`Param::requires_grad`]): what an optimizer updates.
    fn trainable_params(&self) -> Vec<Param> {
        let mut out = Vec::new();
        self.visit_params("", &mut |_, p| {
            if p.requires_grad() {
                out.push(p.clone());
            }
        });
        out
    }

    /// Whether any parameter needs a grad (when none does and no input does, a forward-only
    /// capture is enough).
    fn any_requires_grad(&self) -> bool {
        let mut any = false;
        self.visit_params("", &mut |_, p| any |= p.requires_grad());
        any
    }

    /// Sets every parameter's grad to zero (in place, capturable).
    fn zero_grad(&self) -> Result<()> {
        let mut result = Ok(());
        self.visit_params("", &mut |_, p| {
            if result.is_ok() {
                result = p.zero_grad();
            }
        });
        result
    }
}

/// `prefix.name`, or `name` at the root.
#[doc(hidden)]
pub fn param_path(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

impl Parameters for Param {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(prefix, self);
    }
}

impl<T: Parameters> Parameters for Vec<T> {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.as_slice().visit_params(prefix, f);
    }
}

impl<T: Parameters> Parameters for [T] {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (i, item) in self.iter().enumerate() {
            item.visit_params(&param_path(prefix, &i.to_string()), f);
        }
    }
}

impl<T: Parameters, const N: usize> Parameters for [T; N] {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.as_slice().visit_params(prefix, f);
    }
}

impl<T: Parameters> Parameters for Option<T> {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        if let Some(item) = self {
            item.visit_params(prefix, f);
        }
    }
}

impl<T: Parameters + ?Sized> Parameters for Box<T> {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        (**self).visit_params(prefix, f);
    }
}

impl<T: Parameters + ?Sized> Parameters for &T {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        (**self).visit_params(prefix, f);
    }
}

/// Autoref dispatch for generated code: `(&&ParamsProbe(x)).__graphed_visit_params(..)`
/// visits `x` when its type implements [`Parameters`] and does nothing otherwise. Method
/// resolution tries the `&ParamsProbe` impl (which needs the bound) before the `ParamsProbe`
/// one, so this works for concrete types without specialization.
#[doc(hidden)]
pub struct ParamsProbe<'a, T: ?Sized>(pub &'a T);

#[doc(hidden)]
pub trait ParamsViaTrait {
    fn __graphed_visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param));
    fn __graphed_has_params(&self) -> bool;
}

impl<T: Parameters + ?Sized> ParamsViaTrait for &ParamsProbe<'_, T> {
    fn __graphed_visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.0.visit_params(prefix, f);
    }
    fn __graphed_has_params(&self) -> bool {
        true
    }
}

#[doc(hidden)]
pub trait ParamsViaNothing {
    fn __graphed_visit_params(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        let _ = (prefix, f);
    }
    fn __graphed_has_params(&self) -> bool {
        false
    }
}

impl<T: ?Sized> ParamsViaNothing for ParamsProbe<'_, T> {}
