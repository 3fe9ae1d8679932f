//! `Shape`: the dimensions of a tensor, stored inline so handles clone without allocating.

use std::fmt;

/// The most dimensions a tensor may have.
pub const MAX_RANK: usize = 6;

/// Tensor dimensions, row-major. `Copy`, so a tensor handle clones without a heap allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: [usize; MAX_RANK],
    rank: u8,
}

/// The product of `dims`, or `None` when it does not fit in `usize`.
pub(crate) fn checked_product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

impl Shape {
    /// A shape from a slice of dimensions; `None` past [`MAX_RANK`] dimensions.
    pub fn new(dims: &[usize]) -> Option<Shape> {
        if dims.len() > MAX_RANK {
            return None;
        }
        let mut d = [0; MAX_RANK];
        d[..dims.len()].copy_from_slice(dims);
        Some(Shape { dims: d, rank: dims.len() as u8 })
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// Number of elements, or `None` when it does not fit in `usize` (no tensor of this
    /// shape can exist; [`Shape::numel`] is only meaningful for shapes that have a tensor).
    ///
    /// ```
    /// use graphed::Shape;
    /// assert_eq!(Shape::new(&[2, 3]).unwrap().checked_numel(), Some(6));
    /// assert_eq!(Shape::new(&[usize::MAX, 2]).unwrap().checked_numel(), None);
    /// ```
    pub fn checked_numel(&self) -> Option<usize> {
        checked_product(self.dims())
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// The last dimension (the row width of a matrix), 1 for a scalar.
    pub fn last(&self) -> usize {
        self.dims().last().copied().unwrap_or(1)
    }

    /// All but the last dimension multiplied (the number of rows).
    pub fn rows(&self) -> usize {
        let d = self.dims();
        d[..d.len().saturating_sub(1)].iter().product()
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}
