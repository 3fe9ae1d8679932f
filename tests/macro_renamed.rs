//! Generated code reaches the runtime through `crate = "..."` when the runtime is not at
//! `::graphed` (re-exported by another crate, or renamed).

extern crate graphed as renamed;

use renamed::{ops, Cx, Device, Result, Tensor};

struct Double;

#[renamed::graphed(crate = "renamed")]
impl Double {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::scale(x, 2.0)
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(ops::scale(dy, 2.0)?))
    }

    #[renamed::capture_time_hook(forward)]
    fn noop(&mut self) {}
}

mod nested {
    pub use ::graphed as runtime;
}

struct Triple;

#[renamed::graphed(crate = "crate::nested::runtime", warmup = 1)]
impl Triple {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        ops::scale(x, 3.0)
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(ops::scale(dy, 3.0)?))
    }
}

#[test]
fn renamed_crate_round_trips() -> Result<()> {
    let dev = Device::host();
    let sample = Tensor::zeros(&dev, &[2])?.with_requires_grad(true);
    let mut double = Double.make_graphed(&sample)?;
    let mut triple = Triple.make_graphed(&sample)?;
    let x = Tensor::from_slice(&dev, &[1.0, 2.0], &[2])?.with_requires_grad(true);
    assert_eq!(double.forward(&x)?.to_vec()?, vec![2.0, 4.0]);
    let dx = double.backward(&x)?.map(|dx| dx.to_vec()).transpose()?;
    assert_eq!(dx, Some(vec![2.0, 4.0]));
    assert_eq!(triple.forward(&x)?.to_vec()?, vec![3.0, 6.0]);
    Ok(())
}

/// `#[derive(Parameters)]` with the runtime at another path.
#[derive(renamed::Parameters)]
#[param(crate = "renamed")]
struct Weights {
    w: renamed::Param,
    more: Vec<renamed::Param>,
}

#[test]
fn renamed_crate_derive_parameters() -> Result<()> {
    use renamed::Parameters as _;
    let dev = Device::host();
    let p = || renamed::Param::new(Tensor::zeros(&dev, &[1])?);
    let weights = Weights { w: p()?, more: vec![p()?, p()?] };
    let names: Vec<String> = weights.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["w", "more.0", "more.1"]);
    Ok(())
}
