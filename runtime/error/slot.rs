//! `Slot`: one argument position of a graphed call, named in errors.

use std::fmt;

/// Which kind of argument of a graphed call a [`Slot`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// A forward input.
    Input,
    /// A grad output (an argument of backward).
    GradOutput,
}

impl fmt::Display for SlotKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SlotKind::Input => "input",
            SlotKind::GradOutput => "grad output",
        })
    }
}

/// One argument position of a graphed call, named in errors: `input 1`, `grad output 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Input or grad output.
    pub kind: SlotKind,
    /// The position, from 0.
    pub index: usize,
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.index)
    }
}
