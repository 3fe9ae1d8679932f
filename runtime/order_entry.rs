//! `OrderEntry`: one step of a pipeline `order`, as `GraphOptions::order` takes it: a plain
//! value below the modules, `make_graphed` and the ranks that all read schedules.

use std::fmt;

/// One entry of a pipeline schedule (`GraphOptions::order`); chunks are 1-indexed.
///
/// Integers convert: `c` is `Forward(c)` and `-c` is `Backward(c)`, so `order(vec![1, 2, -2,
/// -1])` reads as before. `Wgrad(c)` (written `w(c)` in `#[graphed(order = [...])]`) runs the
/// weight-grad half of chunk `c`'s backward for its oldest microbatch whose backward ran and
/// whose weight grads have not (first in, first out), as Transformer Engine's separate wgrad
/// graphs do. A chunk with `Wgrad` entries must split its backward
/// ([`crate::Module::splits_backward`]) and has one per microbatch; its `Backward` entries then
/// capture the input grads only. Chunks without `Wgrad` entries run their whole backward at
/// `Backward`, as without this feature.
///
/// ```
/// use graphed::{GraphOptions, OrderEntry};
/// let opts = GraphOptions::new().order([1.into(), 2.into(), (-2).into(), (-1).into(), OrderEntry::Wgrad(2), OrderEntry::Wgrad(1)]);
/// # let _ = opts;
/// assert_eq!(OrderEntry::from(-2), OrderEntry::Backward(2));
/// assert_eq!(OrderEntry::Wgrad(2).to_string(), "w(2)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OrderEntry {
    /// The forward of the chunk for its next microbatch (`+c`).
    Forward(usize),
    /// The backward of the chunk for its oldest outstanding microbatch (`-c`): the whole
    /// backward, or its input-grad half when the chunk has `Wgrad` entries.
    Backward(usize),
    /// The weight-grad half of the chunk's backward for its oldest microbatch whose input-grad
    /// half ran (`w(c)`).
    Wgrad(usize),
}

impl OrderEntry {
    /// Integers as `From<i32>` reads them (`c` forward, `-c` backward).
    pub fn from_ints(order: &[i32]) -> Vec<OrderEntry> {
        order.iter().map(|&e| e.into()).collect()
    }

    /// A pipeline schedule of `chunks` chunks over `microbatches` microbatches that keeps at
    /// most `in_flight` (at least 1) microbatches outstanding: each microbatch's forwards through
    /// chunks 1..=C, and once `in_flight` are outstanding, the oldest one's backwards (chunk C
    /// first) before the next forwards; the remaining backwards at the end. With `in_flight` 1
    /// each backward follows its forward; with `in_flight` = `microbatches` every forward comes
    /// first. Static memory grows with `in_flight` when surfaces are reused
    /// (`GraphOptions::reuse_buffers`).
    ///
    /// ```
    /// use graphed::OrderEntry;
    /// let order = OrderEntry::windowed(2, 3, 2);
    /// assert_eq!(order, OrderEntry::from_ints(&[1, 2, 1, 2, -2, -1, 1, 2, -2, -1, -2, -1]));
    /// ```
    pub fn windowed(chunks: usize, microbatches: usize, in_flight: usize) -> Vec<OrderEntry> {
        let forwards = (1..=chunks).map(OrderEntry::Forward);
        let backwards = || (1..=chunks).rev().map(OrderEntry::Backward);
        let mut order = Vec::with_capacity(2 * chunks * microbatches);
        let (mut outstanding, mut done) = (0, 0);
        for _ in 0..microbatches {
            if outstanding >= in_flight.max(1) {
                order.extend(backwards());
                outstanding -= 1;
                done += 1;
            }
            order.extend(forwards.clone());
            outstanding += 1;
        }
        for _ in done..microbatches {
            order.extend(backwards());
        }
        order
    }

    /// The entry's chunk (1-indexed).
    pub fn chunk(self) -> usize {
        match self {
            OrderEntry::Forward(c) | OrderEntry::Backward(c) | OrderEntry::Wgrad(c) => c,
        }
    }
}

impl From<i32> for OrderEntry {
    /// `c` is the forward of chunk c, `-c` its backward (0 is `Forward(0)`, which no schedule
    /// accepts).
    fn from(e: i32) -> OrderEntry {
        let c = e.unsigned_abs() as usize;
        if e < 0 {
            OrderEntry::Backward(c)
        } else {
            OrderEntry::Forward(c)
        }
    }
}

impl From<&i32> for OrderEntry {
    /// As `From<i32>`, so `order(&[1, 2, -2, -1])` works too.
    fn from(e: &i32) -> OrderEntry {
        OrderEntry::from(*e)
    }
}

impl From<&OrderEntry> for OrderEntry {
    /// A copy, so that `&[OrderEntry]` is an order wherever `&[i32]` is.
    fn from(e: &OrderEntry) -> OrderEntry {
        *e
    }
}

impl PartialEq<i32> for OrderEntry {
    /// Equal to the integer that converts to it (a `Wgrad` entry equals none).
    fn eq(&self, other: &i32) -> bool {
        OrderEntry::from(*other) == *self
    }
}

impl fmt::Display for OrderEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrderEntry::Forward(c) => write!(f, "+{c}"),
            OrderEntry::Backward(c) => write!(f, "-{c}"),
            OrderEntry::Wgrad(c) => write!(f, "w({c})"),
        }
    }
}
