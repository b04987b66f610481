//! ustrace-filter (skeleton; filled in by its owner).
