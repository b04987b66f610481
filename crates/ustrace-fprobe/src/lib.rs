//! ustrace-fprobe (skeleton; filled in by its owner).
