// A struct of chunks with a schedule; its wrapper exposes the schedule and per-chunk calls.
use graphed::{graphed, Cx, Device, Result, Tensor};

struct Block;

#[graphed]
impl Block {
    fn forward(&self, _cx: &mut Cx, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn backward(&mut self, _cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.clone()))
    }
}

#[graphed(warmup = 3, order = [1, 2, -2, -1])]
struct TwoStage {
    first: Block,
    second: Block,
}

#[graphed(warmup = 1, order = [1, 2, 1, -2, 2, -1, -2, -1], allow_unused_input = false)]
pub(crate) struct Interleaved {
    a: Block,
    b: Block,
}

// No order: forwards in field order, then backwards in reverse.
#[graphed]
struct Plain {
    only: Block,
}

fn main() -> Result<()> {
    const ORDER: &[graphed::OrderEntry] = GraphedTwoStage::ORDER;
    const _: () = assert!(ORDER.len() == 4 && GraphedTwoStage::CHUNKS == 2 && GraphedTwoStage::MICROBATCHES == 1);
    const _: () = assert!(GraphedInterleaved::MICROBATCHES == 2 && GraphedPlain::ORDER.is_empty());
    let dev = Device::host();
    let sample = vec![Some(Tensor::zeros(&dev, &[1])?.with_requires_grad(true))];
    let samples = vec![vec![sample.clone()], vec![sample.clone()]];
    let mut graphed: GraphedTwoStage = TwoStage { first: Block, second: Block }.make_graphed(samples)?;
    // Per-chunk calls take and return each chunk's own surfaces.
    let x = Tensor::zeros(&dev, &[1])?.with_requires_grad(true);
    let h: BlockOutputs = graphed.forward_first(BlockInputs { x })?;
    let y = graphed.forward_second(BlockInputs { x: h.output_0 })?;
    let dh: BlockGradInputs = graphed.backward_second(BlockGradOutputs { dy: y.output_0 })?;
    let _dx = graphed.backward_first(BlockGradOutputs { dy: dh.x.expect("a grad") })?;
    let _: &Block = graphed.module_first();
    let _: &mut Block = graphed.module_second_mut();
    let _ = Interleaved { a: Block, b: Block };
    let _ = Plain { only: Block };
    Ok(())
}
