//! A sequence of separately graphed modules replayed as one launch.
//!
//! The per-block pattern built module by module: each block graphed on its own (sharing one
//! pool with `GraphOptions::pool`, or each with its own), then called back to back. Once the
//! sequence is recorded, one launch replays every member's whole iteration in the order given.

use super::fused::Fused;
use super::{CaptureError, GraphedModules};
use crate::Result;

/// Graphed modules fused into one launch per step, in the order given (see
/// [`Sequence::new`]). The members stay usable one by one through [`Sequence::member_mut`];
/// a step is refused while any of them is half-way through per-call replays.
///
/// ```
/// use graphed::{ops, Cx, Device, GraphOptions, Module, Param, Sequence, Tensor};
/// # use graphed::{graphed, Result};
/// # pub struct Scale(Param);
/// # #[graphed(warmup = 1)]
/// # impl Scale {
/// #     pub fn forward(&self, cx: &mut Cx, x: &Tensor) -> Result<Tensor> { ops::mul(x, &self.0.value) }
/// #     pub fn backward(&mut self, cx: &mut Cx, dy: &Tensor) -> Result<Option<Tensor>> { Ok(Some(ops::mul(dy, &self.0.value)?)) }
/// # }
/// let dev = Device::host();
/// let pool = dev.new_pool();
/// let x = Tensor::full(&dev, &[2], 1.0)?.with_requires_grad(true);
/// let opts = || GraphedScale::options().pool(&pool);
/// let a = GraphedScale::new(Scale(Param::new(Tensor::full(&dev, &[2], 2.0)?)?), ScaleInputs { x: x.clone() }, opts())?;
/// let b = GraphedScale::new(Scale(Param::new(Tensor::full(&dev, &[2], 3.0)?)?), ScaleInputs { x: x.clone() }, opts())?;
/// let mut seq = Sequence::new(vec![a.into_inner(), b.into_inner()])?;
/// seq.step()?; // a's forward and backward, then b's: one launch
/// assert_eq!(seq.member(1).outputs(0, 0)?[0].as_ref().unwrap().to_vec()?, vec![3.0; 2]);
/// # Ok::<(), graphed::Error>(())
/// ```
pub struct Sequence {
    members: Vec<GraphedModules>,
    fused: Fused,
}

impl std::fmt::Debug for Sequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.members).finish()
    }
}

impl Sequence {
    /// Fuses `members`, each one whole iteration of its schedule, into one graph that replays
    /// them in the order given. Members sharing a pool must be given in the order they were
    /// captured (the order their replays must follow anyway); all must be on one device.
    /// Refused with the members handed back.
    pub fn new(mut members: Vec<GraphedModules>) -> std::result::Result<Sequence, CaptureError<Vec<GraphedModules>>> {
        // Members whose microbatches share surfaces get the step's bound buffers (`staging`);
        // a refused sequence drops the ones made here.
        let fresh: Vec<bool> = members.iter().map(|m| m.config.staging.is_none()).collect();
        let marks: Vec<_> = members.iter().map(|m| m.pool.mark()).collect();
        let staged = members.iter_mut().try_for_each(GraphedModules::prepare_staging);
        let built = staged.and_then(|()| Fused::build(&members));
        match built {
            Ok(fused) => Ok(Sequence { members, fused }),
            Err(e) => {
                members.iter_mut().zip(fresh).filter(|(_, f)| *f).for_each(|(m, _)| m.config.staging = None);
                // The pools give back what the staging grew (pools shared by members: the
                // first mark of each is the earliest, so release from every member's).
                members.iter().zip(marks).for_each(|(m, mark)| m.pool.release_since(mark));
                Err(CaptureError::new(e, members))
            }
        }
    }

    /// One step: every member's whole iteration, one launch. Checked first (modes, no member
    /// half-way through per-call replays, each pool's replay order), changing nothing when
    /// refused; afterwards every handle an earlier call returned is stale.
    pub fn step(&mut self) -> Result<()> {
        self.fused.step(&mut self.members)
    }

    /// Member `i` (its static buffers, outputs, modules).
    pub fn member(&self, i: usize) -> &GraphedModules {
        &self.members[i]
    }

    /// Member `i`, mutably (per-call replays, mode switches).
    pub fn member_mut(&mut self, i: usize) -> &mut GraphedModules {
        &mut self.members[i]
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members (never: [`Sequence::new`] refuses none).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members, unfused.
    pub fn into_members(self) -> Vec<GraphedModules> {
        self.members
    }
}
