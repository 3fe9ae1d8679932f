//! `DeviceError`: a device that cannot do what was asked for a reason of its own (not the
//! caller's arguments, not a failed CUDA call), inside [`super::Error::Device`].

/// A device-side failure that is neither the caller's misuse nor an error a CUDA call
/// returned, as values a caller can match on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A value of one backend (a host tensor, a CUDA graph, ...) reached a device of the
    /// other. Every tensor and graph belongs to the device that made it, so this is a bug in
    /// graphed; nothing was run.
    #[error("{op}: {what} reached a device of the other backend (host and CUDA values never mix); this is a bug in graphed, please report it")]
    OtherBackend {
        /// The operation.
        op: &'static str,
        /// The value that came from the other backend.
        what: &'static str,
    },
}
