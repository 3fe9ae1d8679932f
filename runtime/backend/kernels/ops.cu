// Op kernels (see runtime/ops).
