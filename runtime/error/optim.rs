//! `OptimError`: an optimizer, loss scaler or learning-rate schedule that refuses its
//! configuration, inside [`super::Error::Optim`].

/// What an optimizer refused in its parameters or configuration, as values a caller can
/// match on. Nothing is built, and a refused `set_lr` keeps the rate it had.
///
/// ```
/// use graphed::optim::{Sgd, SgdConfig};
/// use graphed::{Error, OptimError};
/// let e = Sgd::new(&[], SgdConfig::default()).unwrap_err();
/// assert!(matches!(e, Error::Optim(OptimError::NoParams { op: "Sgd::new" })));
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OptimError {
    /// An optimizer over no parameters.
    #[error(
        "{op}: no parameters to optimize; pass at least one Param (a module whose parameters are all frozen has none)"
    )]
    NoParams {
        /// The constructor.
        op: &'static str,
    },
    /// A hyper-parameter out of its range: a negative or non-finite rate, a beta outside
    /// `[0, 1)`, a loss-scale factor on the wrong side of 1, a zero growth interval.
    #[error("{op}: {name} = {value} must be {expected}")]
    HyperParameter {
        /// The constructor or setter.
        op: &'static str,
        /// The configuration field (`lr`, `beta1`, `backoff_factor`, ...).
        name: &'static str,
        /// The value given.
        value: f32,
        /// The range it must be in.
        expected: &'static str,
    },
    /// A warmup-cosine schedule whose rates are not `0 <= floor <= peak` (finite), or whose
    /// warmup is longer than the whole schedule.
    #[error("{op}: the schedule's peak {peak}, floor {floor}, warmup {warmup} and total {total} steps need 0 <= floor <= peak (finite) and warmup <= total")]
    Schedule {
        /// The call.
        op: &'static str,
        /// The peak rate.
        peak: f32,
        /// The final rate.
        floor: f32,
        /// The warmup steps.
        warmup: u32,
        /// The schedule's steps.
        total: u32,
    },
}
