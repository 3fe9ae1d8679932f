// Shape buckets declared on an impl and on a chained struct, with each form of sizes; the
// declared buckets reach the generated `buckets()` and `options()`, and a capture uses them.
use graphed::{graphed, AboveLargest, Buckets, Cx, Device, Result, Tensor};

struct Pass;

#[graphed(warmup = 1, buckets(axis = 0, sizes = [4, 8], pad(0 = -1), above_largest = eager))]
impl Pass {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

struct Loss;

#[graphed(warmup = 1)]
impl Loss {
    fn forward(&self, _cx: &mut Cx, x: &Tensor, _labels: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(dy.clone()), None))
    }
}

#[graphed(chained, buckets(axis = 1, sizes = powers_of_two(min = 8, max = 32), pad(1 = -100.0)))]
struct Model {
    body: Pass,
    head: Loss,
}

#[graphed(buckets(axis = 1, sizes = step(by = 64, max = 1024)))]
struct Stepped {
    stages: [Pass; 2],
}

fn main() -> Result<()> {
    let eager = Buckets::new(0, [4, 8]).pad(0, -1.0).above_largest(AboveLargest::Eager);
    assert_eq!(GraphedPass::buckets(), eager);
    assert_eq!(GraphedModel::buckets(), Buckets::powers_of_two(1, 8, 32).pad(1, -100.0));
    assert_eq!(GraphedStepped::options().bucket_spec(), Some(&Buckets::step(1, 64, 1024)));
    let dev = Device::host();
    let x = Tensor::zeros(&dev, &[8, 2])?.with_requires_grad(true);
    let mut g: GraphedPass = Pass.make_graphed(&x)?;
    let y = g.forward(&Tensor::zeros(&dev, &[3, 2])?)?;
    assert_eq!(y.dims(), &[3, 2]);
    assert_eq!(g.inner().active_bucket(), Some(4));
    Ok(())
}
