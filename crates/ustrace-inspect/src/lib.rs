//! ustrace-inspect (skeleton; filled in by its owner).
