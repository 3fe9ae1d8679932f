// A whole model as one chained struct: its typed calls name only generated types.
use graphed::{graphed, Cx, Device, Result, Tensor};

struct Layer;

#[graphed]
impl Layer {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

struct Head;

#[graphed]
impl Head {
    fn forward(&self, _cx: &mut Cx, x: &Tensor, labels: &Tensor) -> Result<Tensor> {
        graphed::ops::add(x, labels)
    }

    fn backward(&mut self, _cx: &mut Cx, dloss: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(dloss.clone()), None))
    }
}

#[graphed(warmup = 1, chained)]
struct Model {
    embed: Layer,
    #[graphed(checkpoint_every = 2)]
    blocks: Vec<Layer>,
    head: Head,
}

fn main() -> Result<()> {
    let dev = Device::host();
    let x = Tensor::zeros(&dev, &[2])?.with_requires_grad(true);
    let labels = Tensor::zeros(&dev, &[2])?;
    let model = Model { embed: Layer, blocks: vec![Layer, Layer, Layer], head: Head };
    let mut g: GraphedModel = model.make_graphed(ModelInputs { x: x.clone() }, ModelExtraInputs { labels: labels.clone() })?;
    let y: ModelOutputs = g.forward(ModelInputs { x: x.clone() }, ModelExtraInputs { labels: labels.clone() })?;
    let dx: ModelGradInputs = g.backward(ModelGradOutputs { dloss: y.output_0 })?;
    assert!(dx.x.is_some());
    g.fuse()?;
    let one = Tensor::full(&dev, &[2], 1.0)?;
    let _: ModelOutputs = g.step(ModelInputs { x }, ModelExtraInputs { labels }, ModelGradOutputs { dloss: one })?;
    assert_eq!(g.len_blocks(), 3);
    let _: &Layer = g.module_embed();
    let _: Option<&Layer> = g.module_blocks(2);
    let model: Model = g.into_module();
    assert_eq!(model.blocks.len(), 3);
    Ok(())
}
