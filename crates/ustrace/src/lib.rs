//! ustrace (skeleton).
